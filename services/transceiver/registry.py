"""The transceiver registry heartbeat (`firsthop:transceiver:{id}`, docs/architecture.md §9).

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

from firsthop.shared.redis_store import (
    HEARTBEAT_PERIOD,
    TRACE_TTL,
    TRANSCEIVER_TTL,
    TransceiverInfo,
    redis_client,
    trace_key,
    transceiver_key,
)

log = logging.getLogger("firsthop.transceiver.registry")


async def heartbeat(
    url: str,
    transceiver_id: str,
    info: Callable[[], TransceiverInfo],
    counters: Counter[str],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Started once the first write was tried: a transceiver that says it is ready is in
    the registry (unless Redis is down), so a call placed the moment it is up finds it."""
    client = redis_client(url)
    key = transceiver_key(transceiver_id)
    down = started = False

    def write(mapping: dict[str, Any]) -> None:
        pipe = client.pipeline(transaction=True)  # never a key without its TTL
        pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]
        pipe.expire(key, TRANSCEIVER_TTL)
        pipe.execute()

    try:
        while True:
            try:
                await trio.to_thread.run_sync(write, info().to_hash())
                if down:
                    log.info("registry: Redis reachable again")
                down = False
            except redis.RedisError as exc:
                counters["redis_errors"] += 1
                if not down:
                    log.warning("registry: Redis unavailable (%s); serving on", exc)
                down = True
            if not started:
                task_status.started()
                started = True
            await trio.sleep(HEARTBEAT_PERIOD)
    finally:
        with trio.CancelScope(shield=True):
            try:
                await trio.to_thread.run_sync(client.delete, key)
            except redis.RedisError:
                pass
            client.close()


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
            pipe.set(trace_key(ufrag), traceparent, ex=TRACE_TTL)
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
