"""The relay's Redis flow cache (`firsthop:flow:{ip}:{port}`, docs/architecture.md §9).

Write-behind of established flows so a restarted relay (or a worker that inherits another's
clients after a SO_REUSEPORT regroup) can route media before the next STUN packet, and
look-ups for datagrams from unknown clients. Nothing here runs on the packet path: the data
plane hands over batches, and every Redis call runs in a worker thread (redis-py's blocking
client; there is no maintained Trio client) with short socket timeouts.

`snapshot` reads every flow of the cluster (the flows' index, `redis_store.FLOWS`, newest
first and bounded; never a SCAN of the keyspace): the warm standby worker keeps one,
refreshed while it waits, so a worker that takes over can answer its look-ups from it when
Redis is down at that moment (see `worker.py`).

When Redis is down: writes are kept (latest per client, bounded) and retried with backoff,
look-ups fail at once (the data plane then drops the held datagrams without remembering a
miss), errors are counted, and forwarding from memory never waits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import redis
import trio

from firsthop.services.relay.write_behind import Entry
from firsthop.shared.address import Address
from firsthop.shared.redis_store import (
    FLOW_TTL,
    FLOWS,
    FlowRecord,
    flow_key,
    parse_flow_key,
    redis_client,
    trace_key,
    write_flows,
)

log = logging.getLogger("firsthop.relay.cache")


BACKOFF_MIN = 0.1
BACKOFF_MAX = 5.0
SCAN_BATCH = 1000  # index members per read, and tokens per pipelined read


class CacheUnavailable(Exception):
    pass


class FlowCache:
    def __init__(self, url: str, *, timeout: float = 0.5) -> None:
        self._client = redis_client(url, timeout=timeout, text=False)
        self._limiter = trio.CapacityLimiter(4)
        self.errors = 0
        self.writes = 0
        self.lookups = 0
        self.hits = 0
        self._down_until = 0.0
        self._backoff = BACKOFF_MIN

    @property
    def available(self) -> bool:
        return trio.current_time() >= self._down_until

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        if self.available:
            log.warning("flow cache unavailable (%s); retrying in %.1fs", exc, self._backoff)
        self._down_until = trio.current_time() + self._backoff
        self._backoff = min(BACKOFF_MAX, self._backoff * 2)

    def _ok(self) -> None:
        if self._backoff > BACKOFF_MIN:
            log.info("flow cache reachable again")
        self._backoff = BACKOFF_MIN

    async def store(self, entries: Iterable[Entry]) -> None:
        batch = list(entries)
        if not batch:
            return
        if not self.available:
            raise CacheUnavailable("backing off")

        def write() -> None:
            # one script: a write cut between HSET and EXPIRE must not leave a key forever,
            # and every key is in the index (`redis_store.FLOWS`)
            write_flows(self._client, ((c, FlowRecord(token, via)) for c, token, via in batch))

        try:
            await trio.to_thread.run_sync(write, limiter=self._limiter)
        except redis.RedisError as exc:
            self._failed(exc)
            raise CacheUnavailable(str(exc)) from exc
        self._ok()
        self.writes += len(batch)

    async def lookup(self, clients: list[Address]) -> list[bytes | None]:
        if not self.available:
            raise CacheUnavailable("backing off")

        def read() -> list[bytes | None]:
            pipe = self._client.pipeline(transaction=False)
            for client in clients:
                pipe.hget(flow_key(client), "token")
            return list(pipe.execute())

        try:
            tokens = await trio.to_thread.run_sync(read, limiter=self._limiter)
        except redis.RedisError as exc:
            self._failed(exc)
            raise CacheUnavailable(str(exc)) from exc
        self._ok()
        self.lookups += len(clients)
        self.hits += sum(1 for t in tokens if t)
        return tokens

    async def snapshot(self, limit: int) -> dict[Address, bytes]:
        """Every flow in the cache (client -> route token), at most `limit` of them."""
        if not self.available:
            raise CacheUnavailable("backing off")

        def read() -> dict[Address, bytes]:
            out: dict[Address, bytes] = {}
            seen: set[bytes] = set()

            def tokens(keys: list[bytes]) -> None:
                pipe = self._client.pipeline(transaction=False)
                for key in keys:
                    pipe.hget(key, "token")
                for key, token in zip(keys, pipe.execute(), strict=True):
                    seen.add(key)
                    client = parse_flow_key(key)
                    if token and client is not None:  # (else: expired, not yet dropped)
                        out[client] = token

            began = int(self._client.time()[0])  # (the clock the index is scored by)
            for at in range(0, max(0, limit), SCAN_BATCH):  # the newest first, in pages
                keys: list[bytes] = self._client.zrevrange(  # type: ignore[assignment]
                    FLOWS, at, min(at + SCAN_BATCH, limit) - 1
                )
                tokens([key for key in keys if key not in seen])
                if len(keys) < SCAN_BATCH:
                    break
            # A flow written again while the pages were read moved ahead of them (its score
            # went up): those, since the read began, are read too.
            moved: list[bytes] = self._client.zrevrangebyscore(  # type: ignore[assignment]
                FLOWS, "+inf", began, start=0, num=max(0, limit)
            )
            tokens([key for key in moved if key not in seen][: max(0, limit - len(out))])
            return out

        try:
            # Abandoned if cancelled: a standby told to serve does not wait for its copy.
            flows = await trio.to_thread.run_sync(
                read, limiter=self._limiter, abandon_on_cancel=True
            )
        except redis.RedisError as exc:
            self._failed(exc)
            raise CacheUnavailable(str(exc)) from exc
        self._ok()
        return flows

    async def trace_parents(self, tokens: list[bytes]) -> list[bytes | None]:
        """`firsthop:trace:{ufrag}` for each token: the sessions' traceparents (§9)."""
        if not self.available:
            raise CacheUnavailable("backing off")

        def read() -> list[bytes | None]:
            pipe = self._client.pipeline(transaction=False)
            for token in tokens:
                pipe.get(trace_key(token.decode("ascii", "replace")))
            return list(pipe.execute())

        try:
            return await trio.to_thread.run_sync(read, limiter=self._limiter)
        except redis.RedisError as exc:
            self._failed(exc)
            raise CacheUnavailable(str(exc)) from exc

    def close(self) -> None:
        self._client.close()


class FlowSnapshot:
    """A copy of the flow cache taken while Redis was up (client -> route token), asked only
    when Redis cannot be: a token from here is re-verified like one from Redis. Forgotten
    `FLOW_TTL` after it was taken, as Redis would have forgotten its entries."""

    def __init__(self) -> None:
        self._flows: dict[Address, bytes] = {}
        self._taken = float("-inf")
        self.hits = 0

    def replace(self, flows: dict[Address, bytes], now: float) -> None:
        self._flows = flows
        self._taken = now

    def get(self, client: Address, now: float) -> bytes | None:
        if now - self._taken > FLOW_TTL:
            self._flows = {}
            return None
        token = self._flows.get(client)
        if token is not None:
            self.hits += 1
        return token

    @property
    def taken(self) -> float:
        """When the copy was taken (-inf: never)."""
        return self._taken

    def __len__(self) -> int:
        return len(self._flows)
