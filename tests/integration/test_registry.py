"""The transceiver registry on a real Redis: the heartbeat writes a hash and its id into the
index (`firsthop:transceivers`), signaling reads the index and the hashes it names in one
script, and SCANs the keyspace only for transceivers too old to index themselves, at its first
read and then every `LEGACY_SWEEP` seconds (docs/architecture.md §9)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest
import redis as redis_lib
import trio

from firsthop.services.signaling.stores import Directory, RedisLink, index_legacy, read_registry
from firsthop.services.transceiver.registry import heartbeat
from firsthop.shared.redis_store import (
    LEGACY_SWEEP,
    MAX_TRANSCEIVERS,
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


def register_unindexed(r: redis_lib.Redis, tx_id: str) -> None:
    """What a transceiver of a release before the index writes: its hash alone."""
    r.hset(transceiver_key(tx_id), mapping=info(tx_id).to_hash())  # type: ignore[arg-type]
    r.expire(transceiver_key(tx_id), 30)


def register_many(r: redis_lib.Redis, n: int) -> None:
    """`tx-0` .. `tx-{n-1}`, each a heartbeat later than the one before."""
    now = time.time()
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        tx_id = f"tx-{i}"
        pipe.hset(transceiver_key(tx_id), mapping=info(tx_id).to_hash())  # type: ignore[arg-type]
        pipe.zadd(TRANSCEIVERS, {tx_id: now + i / 1000})
    pipe.execute()


def scans(r: redis_lib.Redis) -> int:
    stats = r.info("commandstats")
    return int(stats.get("cmdstat_scan", {}).get("calls", 0))


def test_the_read_takes_the_index_and_its_hashes_and_nothing_else(server: RedisServer) -> None:
    r = client_of(server)
    try:
        register(r, "tx-1")
        register(r, "tx-2", sessions="7")
        register_unindexed(r, "unindexed")
        r.zadd(TRANSCEIVERS, {"expired": time.time()})  # its hash is gone (TTL)
        r.set(transceiver_key("not-a-hash"), "x")  # a key of another type: never jams the read
        r.zadd(TRANSCEIVERS, {"not-a-hash": time.time()})
        for i in range(2000):  # the rest of a busy keyspace: never walked
            r.set(f"firsthop:call:{i}", "x")
        registry = read_registry(r)
        rows = dict(registry.rows)
        assert set(rows) == {"tx-1", "tx-2"} and registry.indexed == 4
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
        register_many(r, MAX_TRANSCEIVERS + 5)
        registry = read_registry(r)
        rows = registry.rows
        assert len(rows) == MAX_TRANSCEIVERS and registry.indexed == MAX_TRANSCEIVERS + 5
        assert rows[0][0] == f"tx-{MAX_TRANSCEIVERS + 4}"  # the latest heartbeat first
        assert "tx-0" not in dict(rows)
    finally:
        r.close()


async def test_the_directory_sweeps_for_unindexed_transceivers_only_now_and_then(
    server: RedisServer,
) -> None:
    r = client_of(server)
    link = RedisLink(server.url, Counter())
    try:
        register(r, "tx-1")
        # A transceiver of an older release: its hash, no index entry.
        register_unindexed(r, "old")
        clock = [0.0]
        directory = Directory([], link, clock=lambda: clock[0])
        with trio.fail_after(5):
            seen = await directory.snapshot()  # the first read sweeps: one SCAN
        assert sorted(t.id for t in seen) == ["old", "tx-1"] and directory.from_registry
        assert r.zscore(TRANSCEIVERS, "old") is not None  # indexed by signaling
        swept = scans(r)
        assert swept >= 1
        r.delete(transceiver_key("tx-1"))  # gone (as its TTL would)
        for _ in range(3):
            clock[0] += 1  # (past DIRECTORY_MAX_AGE: each snapshot reads again)
            with trio.fail_after(5):
                assert [t.id for t in await directory.snapshot()] == ["old"]
        assert r.zscore(TRANSCEIVERS, "tx-1") is None
        assert scans(r) == swept  # reads between sweeps take the index alone
        register_unindexed(r, "old-2")
        clock[0] += LEGACY_SWEEP  # the next sweep finds one that came since
        with trio.fail_after(5):
            assert sorted(t.id for t in await directory.snapshot()) == ["old", "old-2"]
        assert scans(r) > swept
    finally:
        link.close()
        r.close()


async def test_the_heartbeat_indexes_its_hash_and_takes_both_away(server: RedisServer) -> None:
    r = client_of(server)
    try:
        # An entry left by a transceiver that died (its hash expired), scored in the future by
        # a clock far ahead: no clock decides, the read drops it.
        r.zadd(TRANSCEIVERS, {"gone": time.time() + 3600})
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
                assert [tx for tx, _ in read_registry(r).rows] == ["tx-h"]
                assert r.zrange(TRANSCEIVERS, 0, -1) == ["tx-h"]
                nursery.cancel_scope.cancel()
        assert not r.exists(transceiver_key("tx-h"))
        assert r.zscore(TRANSCEIVERS, "tx-h") is None
        assert not counters["redis_errors"]
    finally:
        r.close()


def test_the_sweep_indexes_only_registry_hashes(server: RedisServer) -> None:
    r = client_of(server)
    try:
        register_unindexed(r, "old")
        r.set(transceiver_key("a-string"), "x")
        r.hset(transceiver_key(""), mapping={"api_url": "http://x"})  # (no id)
        r.hset("firsthop:call:c1", mapping={"transceiver_id": "old"})
        register(r, "tx-1")
        assert index_legacy(r) == 1
        assert sorted(r.zrange(TRANSCEIVERS, 0, -1)) == ["old", "tx-1"]
        assert index_legacy(r) == 0  # (already there: kept as the heartbeat scored it)
    finally:
        r.close()


async def test_a_registry_read_that_was_cut_does_not_call_the_rest_gone(
    server: RedisServer,
) -> None:
    r = client_of(server)
    link = RedisLink(server.url, Counter())
    try:
        register_many(r, MAX_TRANSCEIVERS + 1)
        directory = Directory([], link)
        with trio.fail_after(10):
            assert await directory.is_registered(f"tx-{MAX_TRANSCEIVERS}") is True
            assert await directory.is_registered("tx-0") is None  # not read: unknown
        assert not directory.complete
    finally:
        link.close()
        r.close()
