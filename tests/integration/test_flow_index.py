"""The flows' index on a real Redis (`firsthop:flows`, docs/architecture.md §9): every writer of
a flow (the relay's write-behind, a transceiver's phone-call pins) puts its key there in the
same script, scored by the Redis server's clock; the relay's warm standby reads the index and
the tokens it names, never the keyspace; a write drops members whose keys have expired."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import pytest
import redis as redis_lib
import trio

from firsthop.services.relay.flow_cache import FlowCache
from firsthop.services.transceiver.registry import FlowPins
from firsthop.shared.redis_store import FLOW_TTL, FLOWS, flow_key
from tests.support import RedisServer, redis_server


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


def commands(r: redis_lib.Redis, name: str) -> int:
    stats = r.info("commandstats")
    return int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))


def client(i: int) -> tuple[str, int]:
    return (f"198.51.100.{i % 250}", 10000 + i)


async def test_the_standby_reads_the_index_not_the_keyspace(server: RedisServer) -> None:
    r = redis_lib.Redis.from_url(server.url, decode_responses=True)
    cache = FlowCache(server.url)
    try:
        pipe = r.pipeline(transaction=False)
        for i in range(2000):  # what else a cluster's Redis holds: calls, traces, eks...
            pipe.set(f"firsthop:call:c{i}", "x")
        pipe.execute()
        with trio.fail_after(10):
            await cache.store([(client(i), f"tok{i}".encode(), None) for i in range(30)])
            assert r.zcard(FLOWS) == 30
            key = flow_key(client(3))
            assert r.hget(key, "token") == "tok3" and 0 < r.ttl(key) <= FLOW_TTL
            r.delete(flow_key(client(4)))  # expired, its member not yet dropped: skipped
            scans = commands(r, "scan")
            flows = await cache.snapshot(limit=1000)
            assert commands(r, "scan") == scans  # no walk of the keyspace
            assert len(flows) == 29 and flows[client(3)] == b"tok3" and client(4) not in flows
            assert 9 <= len(await cache.snapshot(limit=10)) <= 10  # bounded (one may be gone)
    finally:
        r.close()


async def test_a_write_drops_members_whose_keys_expired_by_the_servers_clock(
    server: RedisServer,
) -> None:
    r = redis_lib.Redis.from_url(server.url, decode_responses=True)
    cache = FlowCache(server.url)
    try:
        # a member written long ago (its key gone with its TTL); one whose writer's clock ran
        # an hour ahead cannot happen: the score is the server's time, as EXPIRE's is
        r.zadd(FLOWS, {flow_key(client(900)): 1000.0})
        with trio.fail_after(10):
            await cache.store([(client(1), b"tok1", ("192.0.2.9", 3478))])
        assert r.zrange(FLOWS, 0, -1) == [flow_key(client(1))]
        now = float(r.time()[0])
        score = r.zscore(FLOWS, flow_key(client(1)))
        assert score is not None and abs(score - now) <= 1
        assert r.hget(flow_key(client(1)), "hop") == "192.0.2.9:3478"
    finally:
        r.close()


async def test_a_phone_calls_pin_is_indexed_and_taken_away_with_its_flow(
    server: RedisServer,
) -> None:
    r = redis_lib.Redis.from_url(server.url, decode_responses=True)
    counters: Counter[str] = Counter()
    pins = FlowPins(server.url, counters)
    trunk = ("203.0.113.5", 40000)
    try:
        with trio.fail_after(10):
            assert await pins.pin(trunk, b"phone-token")
            assert r.zrange(FLOWS, 0, -1) == [flow_key(trunk)]
            assert not await pins.pin(("203.0.113.5", 40000), b"another")  # taken: refused
            await trio.to_thread.run_sync(pins._write, list(pins.pinned.items()))  # keep's
            assert r.zcard(FLOWS) == 1 and r.hget(flow_key(trunk), "token") == "phone-token"
            await pins.unpin(trunk)
        assert not r.exists(flow_key(trunk)) and r.zcard(FLOWS) == 0
        assert not counters["redis_errors"]
    finally:
        r.close()


async def test_a_flow_written_again_while_the_standby_reads_is_not_missed(
    server: RedisServer,
) -> None:
    """Newest first, in pages: a flow refreshed between two pages jumps ahead of them, and is
    read from what moved since the read began. A batch bigger than a script's share goes as
    several scripts, every key with its member."""
    r = redis_lib.Redis.from_url(server.url, decode_responses=True)
    cache = FlowCache(server.url)
    writer = FlowCache(server.url)
    flows = [(client(i), f"tok{i}".encode(), None) for i in range(1500)]
    try:
        with trio.fail_after(20):
            await writer.store(flows[:1000])
            await trio.sleep(1.1)  # (a second later by the server's clock: ranked ahead)
            await writer.store(flows[1000:])
            assert r.zcard(FLOWS) == 1500 and r.exists(flow_key(client(0)))
            # the oldest, on the second page, is written again once the first page is read
            pages = cache._client.zrevrange
            calls = 0

            def zrevrange(*args: object, **kwargs: object) -> object:
                nonlocal calls
                calls += 1
                if calls == 2:
                    r.hset(flow_key(client(0)), "token", "tok0")
                    r.zadd(FLOWS, {flow_key(client(0)): float(r.time()[0]) + 1})
                return pages(*args, **kwargs)  # type: ignore[arg-type]

            cache._client.zrevrange = zrevrange  # type: ignore[method-assign,assignment]
            got = await cache.snapshot(2000)
        assert calls == 2 and len(got) == 1500 and got[client(0)] == b"tok0"
    finally:
        r.close()
