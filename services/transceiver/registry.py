"""The transceiver's Redis writes (docs/architecture.md §9): its registry heartbeat
(`firsthop:transceiver:{id}`), the trace hand-off and its phone calls' relay flows.

Every second the transceiver writes its hash (api_url, media_addr, region, cluster, sessions,
capacity, draining, records) with a 5 s TTL, and its id into the registry's index
(`firsthop:transceivers`, scored by that expiry), so signaling sees a transceiver only while
it lives and reads the registry without walking the keyspace.
Redis calls run in a worker thread; when Redis is down the transceiver goes on serving and
the failures are counted and logged once per outage.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis
import trio

from firsthop.shared.address import Address
from firsthop.shared.redis_store import (
    FLOW_TTL,
    FLOWS,
    HEARTBEAT_PERIOD,
    TRACE_TTL,
    TRANSCEIVER_TTL,
    TRANSCEIVERS,
    FlowRecord,
    TransceiverInfo,
    flow_key,
    redis_client,
    trace_key,
    transceiver_key,
    write_flows,
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
        now = time.time()  # (orders signaling's read; never decides who is live)
        pipe = client.pipeline(transaction=True)  # never a key without its TTL, or its index
        pipe.hset(key, mapping=mapping)  # type: ignore[arg-type]
        pipe.expire(key, TRANSCEIVER_TTL)
        pipe.zadd(TRANSCEIVERS, {transceiver_id: now + TRANSCEIVER_TTL})
        pipe.execute()

    def leave() -> None:
        pipe = client.pipeline(transaction=True)
        pipe.delete(key)
        pipe.zrem(TRANSCEIVERS, transceiver_id)
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
                await trio.to_thread.run_sync(leave)
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


# One atomic check-and-write: the key is free (or already this call's), then it is ours.
PIN_UNLESS_TAKEN = """
local held = redis.call('HGET', KEYS[1], 'token')
if held and held ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[2])
local now = tonumber(redis.call('TIME')[1])
redis.call('ZADD', KEYS[2], now, KEYS[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[2]) - 1)
return 1
"""  # (KEYS[2]: the flows' index, `redis_store.FLOWS`, scored and trimmed as `WRITE_FLOWS`)


class FlowPins:
    """The relay flows of this transceiver's phone calls (`firsthop:flow:{ip}:{port}`).

    A trunk's RTP has no ufrag for a relay to route on. So when a phone call is answered,
    its transceiver writes the relay flow for the address the trunk's offer named, before
    the answer leaves: the relay that gets the trunk's first datagram finds it in Redis
    (its look-up on a miss, `flow_table.recovered`), re-verifies the route token in it (the
    call's own, signed here) and forwards. Only that exact address: a datagram from any
    other source finds nothing. The pin is kept while the call lives (written again every
    `FLOW_TTL / 3` s: the relay's own refreshes stop while the trunk is silent) and deleted
    at its end, when the relays that carried it are told the token is revoked.
    """

    def __init__(self, url: str, counters: Counter[str]) -> None:
        self._client = redis_client(url)
        self._counters = counters
        self.pinned: dict[Address, bytes] = {}

    def _write(self, pins: list[tuple[Address, bytes]]) -> None:
        write_flows(self._client, ((client, FlowRecord(token)) for client, token in pins))

    async def pin(self, client: Address, token: bytes) -> bool:
        """Write it now, unless the address is another flow's (False: a trunk may not take
        a live caller's or another call's media address); `redis.RedisError` if Redis
        cannot take it (no phone call without its flow)."""
        fields = [v for pair in FlowRecord(token).to_hash().items() for v in pair]
        args: list[bytes | int] = [token, FLOW_TTL, *fields]
        done = await trio.to_thread.run_sync(
            lambda: self._client.eval(PIN_UNLESS_TAKEN, 2, flow_key(client), FLOWS, *args)
        )
        if done != 1:
            self._counters["flow_pin_refused"] += 1
            return False
        self.pinned[client] = token
        return True

    async def unpin(self, client: Address) -> None:
        if self.pinned.pop(client, None) is None:
            return
        try:
            key = flow_key(client)
            pipe = self._client.pipeline(transaction=True)
            pipe.delete(key)
            pipe.zrem(FLOWS, key)
            await trio.to_thread.run_sync(pipe.execute)
        except redis.RedisError:
            self._counters["redis_errors"] += 1  # (it expires within FLOW_TTL)

    async def keep(self) -> None:
        """Write every live pin again every `FLOW_TTL / 3` seconds, until cancelled."""
        try:
            while True:
                await trio.sleep(FLOW_TTL / 3)
                if self.pinned:
                    try:
                        await trio.to_thread.run_sync(self._write, list(self.pinned.items()))
                    except redis.RedisError:
                        self._counters["redis_errors"] += 1
        finally:
            self._client.close()
