"""The transceiver registry on a real Redis: the heartbeat writes a hash and its id into the
index (`firsthop:transceivers`), signaling reads the index and the hashes it names in one
script, never the keyspace (docs/architecture.md §9)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest
import redis as redis_lib
import trio

from firsthop.services.signaling.stores import Directory, RedisLink, read_registry
from firsthop.services.transceiver.registry import heartbeat
from firsthop.shared.redis_store import (
    MAX_TRANSCEIVERS,
    REGISTRY_STALE,
    TRANSCEIVERS,
    TransceiverInfo,
    transceiver_key,
)
from tests.support import RedisServer, redis_server


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def client_of(server: RedisServer) -> redis_lib.Redis:
    return redis_lib.Redis.from_url(server.url, decode_responses=True)


def info(tx_id: str, sessions: int = 0) -> TransceiverInfo:
    return TransceiverInfo(
        id=tx_id, api_url=f"http://{tx_id}:8081", region="a", sessions=sessions, capacity=100
    )


def register(r: redis_lib.Redis, tx_id: str, expires_in: float = 5, **fields: str) -> None:
    """What a heartbeat writes (the heartbeat itself is tested below)."""
    r.hset(transceiver_key(tx_id), mapping=info(tx_id).to_hash() | fields)  # type: ignore[arg-type]
    r.expire(transceiver_key(tx_id), 30)
    r.zadd(TRANSCEIVERS, {tx_id: time.time() + expires_in})


def scans(r: redis_lib.Redis) -> int:
    stats = r.info("commandstats")
    return int(stats.get("cmdstat_scan", {}).get("calls", 0))


def test_the_read_takes_the_index_and_its_hashes_and_nothing_else(server: RedisServer) -> None:
    r = client_of(server)
    try:
        register(r, "tx-1")
        register(r, "tx-2", sessions="7")
        r.hset(transceiver_key("unindexed"), mapping=info("unindexed").to_hash())  # type: ignore[arg-type]
        r.zadd(TRANSCEIVERS, {"expired": time.time()})  # its hash is gone (TTL)
        for i in range(2000):  # the rest of a busy keyspace: never walked
            r.set(f"firsthop:call:{i}", "x")
        rows = dict(read_registry(r))
        assert set(rows) == {"tx-1", "tx-2"}
        assert rows["tx-2"]["sessions"] == "7"
        assert TransceiverInfo.from_hash("tx-1", rows["tx-1"]) == info("tx-1")
        # An id whose hash expired leaves the index; one never indexed is not seen.
        assert set(r.zrange(TRANSCEIVERS, 0, -1)) == {"tx-1", "tx-2"}
        assert scans(r) == 0
    finally:
        r.close()


def test_the_read_is_bounded_and_takes_the_freshest_first(server: RedisServer) -> None:
    r = client_of(server)
    try:
        now = time.time()
        pipe = r.pipeline(transaction=False)
        for i in range(MAX_TRANSCEIVERS + 5):
            tx_id = f"tx-{i}"
            pipe.hset(transceiver_key(tx_id), mapping=info(tx_id).to_hash())  # type: ignore[arg-type]
            pipe.zadd(TRANSCEIVERS, {tx_id: now + i / 1000})
        pipe.execute()
        rows = read_registry(r)
        assert len(rows) == MAX_TRANSCEIVERS
        assert rows[0][0] == f"tx-{MAX_TRANSCEIVERS + 4}"  # the latest heartbeat first
        assert "tx-0" not in dict(rows)
    finally:
        r.close()


async def test_the_directory_reads_the_registry_without_a_scan(server: RedisServer) -> None:
    r = client_of(server)
    link = RedisLink(server.url, Counter())
    try:
        register(r, "tx-1")
        clock = [0.0]
        directory = Directory([], link, clock=lambda: clock[0])
        with trio.fail_after(5):
            seen = await directory.snapshot()
        assert [t.id for t in seen] == ["tx-1"] and directory.from_registry
        r.delete(transceiver_key("tx-1"))  # gone (as its TTL would)
        clock[0] += 1  # (past DIRECTORY_MAX_AGE: the next snapshot reads again)
        with trio.fail_after(5):
            assert await directory.snapshot() == []
        assert r.zcard(TRANSCEIVERS) == 0
        assert scans(r) == 0
    finally:
        link.close()
        r.close()


async def test_the_heartbeat_indexes_its_hash_and_takes_both_away(server: RedisServer) -> None:
    r = client_of(server)
    try:
        # An entry left by a transceiver that died long ago (past REGISTRY_STALE): dropped.
        r.zadd(TRANSCEIVERS, {"long-gone": time.time() - REGISTRY_STALE - 1, "recent": 0})
        r.zadd(TRANSCEIVERS, {"recent": time.time() - 1})
        counters: Counter[str] = Counter()
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                await nursery.start(
                    heartbeat, server.url, "tx-h", lambda: info("tx-h", 3), counters
                )
                fields = r.hgetall(transceiver_key("tx-h"))
                assert fields["sessions"] == "3"
                assert 0 < r.ttl(transceiver_key("tx-h")) <= 5
                expiry = r.zscore(TRANSCEIVERS, "tx-h")
                assert expiry is not None and abs(expiry - (time.time() + 5)) < 2
                assert r.zscore(TRANSCEIVERS, "long-gone") is None
                assert r.zscore(TRANSCEIVERS, "recent") is not None  # (the read drops it)
                assert [tx for tx, _ in read_registry(r)] == ["tx-h"]
                nursery.cancel_scope.cancel()
        assert not r.exists(transceiver_key("tx-h"))
        assert r.zscore(TRANSCEIVERS, "tx-h") is None
        assert not counters["redis_errors"]
    finally:
        r.close()
