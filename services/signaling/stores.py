"""Shared state: the transceiver directory, the call map, the used-secret ledger (§9).

Strategy: Redis is the truth shared by every signaling replica; an in-memory copy is the
fallback that keeps one replica working (degraded, logged, counted) when Redis is down or
not configured. There is no Trio Redis client, so the redis-py sync client runs in worker
threads with short timeouts and no retries (a slow Redis must not hold a signaling request).

Keys:

* ``firsthop:transceiver:{id}`` and their index ``firsthop:transceivers`` — the
  transceivers' heartbeat hashes, read (with the index, one script) at most every
  `DIRECTORY_MAX_AGE` seconds; the read drops from the index the ids whose hash expired,
  and every `LEGACY_SWEEP` seconds a SCAN indexes hashes an older transceiver left unindexed;
* ``firsthop:call:{call_id}`` — hash ``transceiver_id, session_id, api_url, owner, region,
  created, client_ufrag`` (the caller's current ICE ufrag: what tells trickle from an ICE
  restart; absent in records written before it existed), TTL the longest session (4 h);
* ``firsthop:secret:{secret_id}`` — the call a client secret created, ``SET NX`` so a secret
  is spent once across replicas; TTL until the secret has expired anyway;
* ``firsthop:ek:{id}`` — the session config (JSON) an ephemeral key is bound to, TTL its
  expiry; ``firsthop:ek-live:{tenant}`` (a sorted set of a tenant's live keys by expiry) and
  ``firsthop:ek-bytes:{tenant}`` (their sessions' bytes): what bounds them (`EkSessions`).
  Without Redis: per replica, the same bounds, and at most `EK_MEMORY_MAX_ENTRIES` in all.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from itertools import islice
from typing import Any, TypeVar

import redis
import trio

from firsthop.services.signaling.auth import DEV_ISSUER
from firsthop.services.signaling.errors import Problem
from firsthop.shared.redis_store import (
    CALL_TTL,
    LEGACY_SWEEP,
    MAX_TRANSCEIVERS,
    TRANSCEIVER_TTL,
    TRANSCEIVERS,
    CallRecord,
    TransceiverInfo,
    call_key,
    recording_key,
    redis_client,
    secret_key,
    transceiver_key,
)

log = logging.getLogger("firsthop.signaling.stores")

T = TypeVar("T")
DIRECTORY_MAX_AGE = 0.5
SWEEP_RETRY = 5.0  # seconds before a failed legacy sweep is tried again
RE_READ_MIN = 0.02  # seconds between the registry re-reads of placement misses
MEMORY_MAX_ENTRIES = 200_000
EK_MEMORY_MAX_ENTRIES = 10_000  # each up to 16 KiB of session JSON
EK_MAX_LIVE = 10_000  # live ephemeral keys per API key (160 MiB of sessions at most) ...
EK_MAX_BYTES = 16 * 1024 * 1024  # ... and of their sessions
EK_MAX_LIVE_DEV = 1_000  # ... and minted by the keyless dev route, in all
EK_MAX_BYTES_DEV = 2 * 1024 * 1024


class StoreUnavailable(Exception):
    pass


class RedisLink:
    """One sync Redis client, used from worker threads; errors counted, logged per outage."""

    def __init__(self, url: str, counters: Counter[str], timeout: float = 0.5) -> None:
        self.client = redis_client(url, timeout=timeout)
        self._counters = counters
        self._down = False

    async def run(self, fn: Callable[[redis.Redis], T]) -> T:
        try:
            result = await trio.to_thread.run_sync(fn, self.client)
        except redis.RedisError as exc:
            self._counters["redis_errors"] += 1
            if not self._down:
                log.warning("Redis unavailable (%s): using in-memory state", exc)
            self._down = True
            raise StoreUnavailable(str(exc)) from exc
        if self._down:
            log.info("Redis reachable again")
        self._down = False
        return result

    def close(self) -> None:
        self.client.close()


class Directory:
    """Where transceivers are: the Redis registry (when configured) or the static list.

    Placements made since the last read are added to each transceiver's session count, so a
    burst of calls spreads out before the next heartbeat reports it.
    """

    def __init__(
        self,
        static: Sequence[TransceiverInfo],
        link: RedisLink | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.static = list(static)
        self.link = link
        self._clock = clock
        self._snapshot: list[TransceiverInfo] = list(static)
        self._taken = -1e9
        self._placed: Counter[str] = Counter()
        self._lock = trio.Lock()
        self.from_registry = False  # whether the current snapshot came from Redis
        self.complete = True  # whether the last read took every indexed transceiver
        self._next_sweep = -1e9  # the first read sweeps for unindexed transceivers
        self._next_cut_warning = -1e9

    def now(self) -> float:
        return self._clock()

    async def snapshot(self, *, since: float | None = None) -> list[TransceiverInfo]:
        """The transceivers, read at most `DIRECTORY_MAX_AGE` ago (concurrent readers share
        one read). `since`: read after that moment: a placement that found no one asks for
        a copy newer than its own start, so a transceiver registered before the call came
        is found (it got 503 for up to half a second after a start); concurrent misses share
        a re-read, and a flood of them reads the registry at most once per `RE_READ_MIN`."""
        if self.link is None:
            return [_with_extra(t, self._placed[t.id]) for t in self.static]
        if self._clock() >= self._next_sweep:
            await self._sweep(self.link)  # (outside the lock: placements go on meanwhile)
        async with self._lock:
            age = self._clock() - self._taken
            older = since is not None and self._taken < since and age >= RE_READ_MIN
            if age >= DIRECTORY_MAX_AGE or older:
                await self._refresh(self.link)
        return [_with_extra(t, self._placed[t.id]) for t in self._snapshot]

    async def _sweep(self, link: RedisLink) -> None:
        """Index the transceivers of an older release (hash, no index entry): a SCAN, at the
        first read and then every `LEGACY_SWEEP` seconds (`SWEEP_RETRY` after a failure,
        which leaves the read itself alone)."""
        self._next_sweep = self._clock() + LEGACY_SWEEP  # (one sweep at a time)
        try:
            legacy = await link.run(index_legacy)
        except StoreUnavailable:
            self._next_sweep = self._clock() + SWEEP_RETRY
            return
        if legacy:
            log.warning("registry: %d transceiver(s) of an older release indexed", legacy)

    async def _refresh(self, link: RedisLink) -> None:
        try:
            registry = await link.run(read_registry)
        except StoreUnavailable:
            self._snapshot, self.from_registry = list(self.static), False
        else:
            self.complete = registry.indexed <= MAX_TRANSCEIVERS
            if registry.indexed > MAX_TRANSCEIVERS and self._clock() >= self._next_cut_warning:
                self._next_cut_warning = self._clock() + 60
                log.warning(
                    "registry: %d transceivers indexed; read the %d freshest",
                    registry.indexed,
                    MAX_TRANSCEIVERS,
                )
            infos = [TransceiverInfo.from_hash(tx_id, f) for tx_id, f in registry.rows]
            self._snapshot = [i for i in infos if i is not None]
            self.from_registry = True
        self._taken = self._clock()
        self._placed.clear()

    def note_placed(self, tx_id: str) -> None:
        self._placed[tx_id] += 1

    async def is_registered(self, tx_id: str) -> bool | None:
        """Whether the registry lists `tx_id` now; None when that cannot be known."""
        if self.link is None:
            return None
        snapshot = await self.snapshot()
        if not self.from_registry:
            return None
        if any(t.id == tx_id for t in snapshot):
            return True
        return False if self.complete else None  # (not read is not gone)


def _with_extra(info: TransceiverInfo, placed: int) -> TransceiverInfo:
    if not placed:
        return info
    return TransceiverInfo(**{**asdict(info), "sessions": info.sessions + placed})


# The registry, freshest first: the ids in the index (KEYS[1]), at most ARGV[2] of them, each
# with its hash (key prefix ARGV[1]); an id whose hash has expired (or whose key is no hash)
# leaves the index; first, how many ids the index holds (more than ARGV[2]: some were not
# read). One script: what it reads is one moment's registry, and no heartbeat lands between
# the check of a hash and the removal of its id. (It reads keys it does not declare: one
# Redis, not a cluster.)
_READ_REGISTRY = """
local total = redis.call('ZCARD', KEYS[1])
local ids = redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)
local out = {total}
for _, id in ipairs(ids) do
  local key = ARGV[1] .. id
  if redis.call('TYPE', key).ok ~= 'hash' then
    redis.call('ZREM', KEYS[1], id)
  else
    out[#out + 1] = id
    out[#out + 1] = redis.call('HGETALL', key)
  end
end
return out
"""


@dataclass
class Registry:
    """What one read of the registry found (`read_registry`)."""

    rows: list[tuple[str, dict[str, str]]]
    indexed: int  # ids in the index before the read (more than MAX_TRANSCEIVERS: cut)


def read_registry(client: redis.Redis) -> Registry:
    """The registered transceivers' ids and hashes (`firsthop:transceivers`), at most
    `MAX_TRANSCEIVERS`: one round trip, whatever else the keyspace holds."""
    flat = client.eval(_READ_REGISTRY, 1, TRANSCEIVERS, transceiver_key(""), MAX_TRANSCEIVERS)
    rows = []
    for tx_id, fields in zip(flat[1::2], flat[2::2], strict=True):
        rows.append((tx_id, dict(zip(fields[::2], fields[1::2], strict=True))))
    return Registry(rows, int(flat[0]))


def index_legacy(client: redis.Redis) -> int:
    """Index the registry hashes no index entry names (transceivers of a release before the
    index; at most `MAX_TRANSCEIVERS`): a SCAN of the keyspace. How many were added."""
    prefix = transceiver_key("")
    keys = client.scan_iter(match=f"{prefix}*", count=5000, _type="hash")
    ids = [key.removeprefix(prefix) for key in islice(keys, MAX_TRANSCEIVERS) if key != prefix]
    if not ids:
        return 0
    expires = time.time() + TRANSCEIVER_TTL
    added = client.zadd(TRANSCEIVERS, dict.fromkeys(ids, expires), nx=True)
    return int(added or 0)


class _Expiring:
    """A bounded in-memory map with per-entry expiry (the Redis fallback)."""

    def __init__(self, clock: Callable[[], float], max_entries: int = MEMORY_MAX_ENTRIES) -> None:
        self._clock = clock
        self._max = max_entries
        self._items: dict[str, tuple[Any, float]] = {}

    def get(self, key: str) -> Any:
        item = self._items.get(key)
        if item is None or item[1] <= self._clock():
            self._items.pop(key, None)
            return None
        return item[0]

    def set(self, key: str, value: Any, ttl: float) -> None:
        if len(self._items) >= self._max:
            now = self._clock()
            self._items = {k: v for k, v in self._items.items() if v[1] > now}
            if len(self._items) >= self._max:
                oldest = min(self._items, key=lambda k: self._items[k][1])
                del self._items[oldest]
        self._items[key] = (value, self._clock() + ttl)

    def pop(self, key: str) -> None:
        self._items.pop(key, None)


class HashStore:
    """One Redis hash a key, written whole with its TTL (never a key without one), or memory
    when there is no Redis or it is down: the shape of `CallStore` and `sip_calls.SipCalls`."""

    def __init__(self, link: RedisLink | None, clock: Callable[[], float] = time.time) -> None:
        self.link = link
        self._memory = _Expiring(clock)

    async def _write(
        self, key: str, fields: Mapping[str, str], ttl: int, memory_key: str, value: object
    ) -> None:
        if self.link is not None:

            def write(client: redis.Redis) -> None:
                pipe = client.pipeline(transaction=True)
                pipe.hset(key, mapping=dict(fields))  # type: ignore[arg-type]
                pipe.expire(key, ttl)
                pipe.execute()

            try:
                await self.link.run(write)
                return
            except StoreUnavailable:
                pass
        self._memory.set(memory_key, value, ttl)

    async def _read(self, key: str, strict: bool = False) -> dict[str, str] | None:
        """The hash at `key` in Redis (None: none there, or Redis cannot be asked; `strict`:
        StoreUnavailable then, for a reader to whom "not there" would mean "over")."""
        if self.link is None:
            return None
        try:
            fields = await self.link.run(lambda c: c.hgetall(key))
        except StoreUnavailable:
            if strict:
                raise
            return None
        return {str(k): str(v) for k, v in fields.items()} if fields else None

    async def _delete(self, key: str, memory_key: str) -> None:
        self._memory.pop(memory_key)
        if self.link is not None:
            try:
                await self.link.run(lambda c: c.delete(key))
            except StoreUnavailable:
                pass


class CallStore(HashStore):
    """call_id -> CallRecord, so PATCH/DELETE work on any replica."""

    async def put(self, record: CallRecord) -> None:
        await self._write(
            call_key(record.call_id), record.to_hash(), CALL_TTL, record.call_id, record
        )

    async def get(self, call_id: str) -> CallRecord | None:
        fields = await self._read(call_key(call_id))
        if fields is not None:
            return CallRecord.from_hash(call_id, fields)
        found: CallRecord | None = self._memory.get(call_id)
        return found

    async def delete(self, call_id: str) -> None:
        await self._delete(call_key(call_id), call_id)


RECORDING_TTL = 7 * 24 * 3600  # s: past any transceiver's --record-keep-hours default


@dataclass(frozen=True)
class RecordingRecord:
    """Where a recorded call's file is, and whose it is (`firsthop:recording:{call_id}`)."""

    owner: str
    api_url: str
    transceiver_id: str


class RecordingIndex(HashStore):
    """call_id -> RecordingRecord: a recording outlives its call record (which goes when the
    call ends), so GET /v1/calls/{id}/recording finds it on any replica, for its owner."""

    async def put(self, call_id: str, record: RecordingRecord) -> None:
        fields = {
            "owner": record.owner,
            "api_url": record.api_url,
            "transceiver_id": record.transceiver_id,
        }
        await self._write(recording_key(call_id), fields, RECORDING_TTL, call_id, record)

    async def get(self, call_id: str) -> RecordingRecord | None:
        fields = await self._read(recording_key(call_id))
        if fields is not None:
            try:
                return RecordingRecord(fields["owner"], fields["api_url"], fields["transceiver_id"])
            except KeyError:
                return None
        found: RecordingRecord | None = self._memory.get(call_id)
        return found


class SecretLedger:
    """Which client secrets were spent. Claim is atomic (SET NX) across replicas; without
    Redis it holds per replica only."""

    def __init__(self, link: RedisLink | None, clock: Callable[[], float] = time.time) -> None:
        self.link = link
        self._clock = clock
        self._memory = _Expiring(clock)

    async def claim(self, secret_id: str, call_id: str, expires_at: float) -> bool:
        ttl = max(1, int(expires_at - self._clock()) + 60)
        if self._memory.get(secret_id) is not None:
            return False
        self._memory.set(secret_id, call_id, ttl)
        if self.link is None:
            return True
        key = secret_key(secret_id)
        try:
            return bool(await self.link.run(lambda c: c.set(key, call_id, nx=True, ex=ttl)))
        except StoreUnavailable:
            return True  # degraded: single use holds on this replica only

    async def release(self, secret_id: str) -> None:
        """Give a secret back when the call it was spent on could not be created."""
        self._memory.pop(secret_id)
        if self.link is not None:
            key = secret_key(secret_id)
            try:
                await self.link.run(lambda c: c.delete(key))
            except StoreUnavailable:
                pass


def ek_key(ek_id: str) -> str:
    return f"firsthop:ek:{ek_id}"


def ek_live_key(tenant: str) -> str:
    return f"firsthop:ek-live:{tenant}"


def ek_bytes_key(tenant: str) -> str:
    return f"firsthop:ek-bytes:{tenant}"


# Atomic across replicas: forget the tenant's expired keys (and their bytes), refuse past its
# bounds (answering when the oldest live one expires), else count the new key in and store
# its session. A member is "id:bytes". KEYS: the live set, the byte count, the session.
# ARGV: now, expires_at, member, max keys, max bytes, bytes, JSON, TTL.
_EK_MINT = """
local bytes = tonumber(redis.call('GET', KEYS[2]) or '0')
local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
for _, member in ipairs(expired) do
  bytes = bytes - tonumber(string.match(member, ':(%d+)$'))
end
if #expired > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1]) end
if bytes < 0 then bytes = 0 end
local n = redis.call('ZCARD', KEYS[1])
if n >= tonumber(ARGV[4]) or (n > 0 and bytes + tonumber(ARGV[6]) > tonumber(ARGV[5])) then
  redis.call('SET', KEYS[2], bytes, 'KEEPTTL')
  return redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2]
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[3])
local last = math.ceil(tonumber(redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2])) + 1
redis.call('EXPIREAT', KEYS[1], last)
redis.call('SET', KEYS[2], bytes + tonumber(ARGV[6]), 'EXAT', last)
redis.call('SET', KEYS[3], ARGV[7], 'EX', ARGV[8])
return false
"""


class EkSessions:
    """Ephemeral key id -> the session config (JSON text) it is bound to, until it expires.
    A tenant (an API key; the keyless dev route is one tenant) holds at most `max_live` keys
    and `max_bytes` of their sessions at once, whatever its rate limit lets it mint (each
    session is at most 16 KiB); past either, minting is refused until the oldest expires.

    Redis, written by one script: ``firsthop:ek:{id}`` (the session, TTL its expiry),
    ``firsthop:ek-live:{tenant}`` (a sorted set of ``id:bytes`` by expiry) and
    ``firsthop:ek-bytes:{tenant}`` (their total), both until the last expires. Without
    Redis (or while it is down) the same bounds hold per replica, each tenant's sessions in a
    table of its own, and `EK_MEMORY_MAX_ENTRIES` in all: past it minting is refused (503),
    never another tenant's live key forgotten (one shared table, evicting the soonest to
    expire, had let a tenant's mints drop other tenants' keys: 401 on their next use).
    """

    def __init__(
        self,
        link: RedisLink | None,
        clock: Callable[[], float] = time.time,
        *,
        max_live: int = EK_MAX_LIVE,
        max_bytes: int = EK_MAX_BYTES,
        max_live_dev: int = EK_MAX_LIVE_DEV,
    ) -> None:
        self.link = link
        self._clock = clock
        self.max_live, self.max_bytes, self.max_live_dev = max_live, max_bytes, max_live_dev
        # Without Redis: tenant -> a heap of its live keys (expiry, bytes, id), their bytes,
        # and id -> (session, expiry); `_held` keys in all.
        self._live: dict[str, list[tuple[float, int, str]]] = {}
        self._bytes: Counter[str] = Counter()
        self._memory: dict[str, dict[str, tuple[str, float]]] = {}
        self._held = 0

    def bounds(self, tenant: str) -> tuple[int, int]:
        """(keys, bytes) a tenant may hold live."""
        if tenant == DEV_ISSUER:
            return self.max_live_dev, EK_MAX_BYTES_DEV
        return self.max_live, self.max_bytes

    async def put(self, tenant: str, ek_id: str, session_json: str, expires_at: float) -> None:
        """Store a new key's session; `Problem` 429 (with when to retry) when `tenant` holds
        its bound of live keys, or of their bytes, already."""
        now = self._clock()
        ttl = max(1, int(expires_at - now) + 1)
        max_keys, max_bytes = self.bounds(tenant)
        size = len(session_json.encode())
        if self.link is not None:
            keys = [ek_live_key(tenant), ek_bytes_key(tenant), ek_key(ek_id)]
            member = f"{ek_id}:{size}"
            args: list[str | float] = [now, expires_at, member, max_keys, max_bytes, size]
            args += [session_json, ttl]
            try:
                oldest = await self.link.run(lambda c: c.eval(_EK_MINT, 3, *keys, *args))
            except StoreUnavailable:
                pass
            else:
                if oldest is not None:
                    raise _too_many(max_keys, max_bytes, float(oldest) - now)
                return
        live = self._expire(tenant, now)
        if len(live) >= max_keys or (live and self._bytes[tenant] + size > max_bytes):
            raise _too_many(max_keys, max_bytes, live[0][0] - now)
        if self._held >= EK_MEMORY_MAX_ENTRIES:
            for other in list(self._live):
                self._expire(other, now)
            if self._held >= EK_MEMORY_MAX_ENTRIES:
                soonest = min(heap[0][0] for heap in self._live.values())
                raise Problem(
                    503, "no room for more ephemeral keys here", retry_after=soonest - now
                )
        heapq.heappush(self._live.setdefault(tenant, live), (expires_at, size, ek_id))
        self._bytes[tenant] += size
        self._memory.setdefault(tenant, {})[ek_id] = (session_json, expires_at)
        self._held += 1

    def _expire(self, tenant: str, now: float) -> list[tuple[float, int, str]]:
        """Forget `tenant`'s expired keys (without Redis); its live ones, soonest first."""
        live = self._live.get(tenant, [])
        sessions = self._memory.get(tenant, {})
        while live and live[0][0] <= now:
            _, size, ek_id = heapq.heappop(live)
            self._bytes[tenant] -= size
            sessions.pop(ek_id, None)
            self._held -= 1
        if not live:  # (a tenant that holds nothing holds no entry either)
            self._live.pop(tenant, None)
            self._memory.pop(tenant, None)
            self._bytes.pop(tenant, None)
        return live

    async def get(self, tenant: str, ek_id: str) -> str | None:
        """The session `tenant`'s key `ek_id` is bound to, or None (expired, or unknown)."""
        if self.link is not None:
            key = ek_key(ek_id)
            try:
                found = await self.link.run(lambda c: c.get(key))
            except StoreUnavailable:
                pass
            else:
                if found is not None:
                    return str(found)
        found_here = self._memory.get(tenant, {}).get(ek_id)
        if found_here is None or found_here[1] <= self._clock():
            return None
        return found_here[0]


def _too_many(keys: int, size: int, retry_after: float) -> Problem:
    return Problem(
        429,
        f"this key holds its most live ephemeral keys ({keys}, or {size} bytes of their "
        "sessions): wait for one to expire",
        retry_after=max(1.0, retry_after),
    )
