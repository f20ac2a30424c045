"""The transceiver registry heartbeat (`firsthop:transceiver:{id}`, ARCHITECTURE §9).

Every second the transceiver writes its hash (api_url, media_addr, region, cluster, sessions,
capacity, draining) with a 5 s TTL, so signaling sees a transceiver only while it lives.
Redis calls run in a worker thread; when Redis is down the transceiver goes on serving and
the failures are counted and logged once per outage.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis
import trio
from redis.backoff import NoBackoff
from redis.retry import Retry

log = logging.getLogger("firsthop.transceiver.registry")

TTL = 5
PERIOD = 1.0


def registry_key(transceiver_id: str) -> str:
    return f"firsthop:transceiver:{transceiver_id}"


def redis_client(url: str, timeout: float = 0.5) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )


async def heartbeat(
    url: str,
    transceiver_id: str,
    fields: Callable[[], dict[str, str]],
    counters: Counter[str],
) -> None:
    client = redis_client(url)
    key = registry_key(transceiver_id)
    down = False

    def write(mapping: dict[str, Any]) -> None:
        pipe = client.pipeline(transaction=False)
        pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]
        pipe.expire(key, TTL)
        pipe.execute()

    try:
        while True:
            try:
                await trio.to_thread.run_sync(write, fields())
                if down:
                    log.info("registry: Redis reachable again")
                down = False
            except redis.RedisError as exc:
                counters["redis_errors"] += 1
                if not down:
                    log.warning("registry: Redis unavailable (%s); serving on", exc)
                down = True
            await trio.sleep(PERIOD)
    finally:
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(client.delete, key)
            except redis.RedisError:
                pass
            client.close()


TRACE_TTL = 4 * 3600  # the longest session


async def trace_handoff_writer(
    url: str,
    pairs: trio.MemoryReceiveChannel[tuple[str, str]],
    counters: Counter[str],
) -> None:
    """Write `firsthop:trace:{ufrag}` = traceparent for each new session token."""
    client = redis_client(url)

    def write(batch: list[tuple[str, str]]) -> None:
        pipe = client.pipeline(transaction=False)
        for ufrag, traceparent in batch:
            pipe.set(f"firsthop:trace:{ufrag}", traceparent, ex=TRACE_TTL)
        pipe.execute()

    try:
        async for first in pairs:
            batch = [first]
            while True:
                try:
                    batch.append(pairs.receive_nowait())
                except trio.WouldBlock:
                    break
            try:
                await trio.to_thread.run_sync(write, batch)
            except redis.RedisError:
                counters["redis_errors"] += 1
    finally:
        client.close()
