"""The Redis contract (docs/architecture.md §9): every key, its record, its TTL, and the client.

Writers and readers both go through here, so a key or a field is spelled in one place:

| key | record | written by | read by |
|---|---|---|---|
| `firsthop:transceiver:{id}` | `TransceiverInfo` (hash) | transceiver heartbeat | signaling |
| `firsthop:transceivers` | index of those ids (sorted set) | transceiver heartbeat | signaling |
| `firsthop:call:{call_id}` | `CallRecord` (hash) | signaling | signaling (any replica) |
| `firsthop:flow:{ip}:{port}` | `FlowRecord` (hash) | relay | relay (after a restart) |
| `firsthop:trace:{ufrag}` | traceparent (string) | transceiver | relay (first-packet span) |
| `firsthop:secret:{id}` | call id (string, SET NX) | signaling | signaling |

redis-py's blocking client is the only maintained one that Trio can use: services call it
from worker threads (`trio.to_thread`), with short socket timeouts and no retries, so a slow
or absent Redis never holds a request or a packet.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from firsthop.shared.address import Address, format_hostport, parse_hostport

PREFIX = "firsthop:"
TRANSCEIVER_TTL = 5  # seconds; the heartbeat rewrites it every HEARTBEAT_PERIOD
HEARTBEAT_PERIOD = 1.0
CALL_TTL = 4 * 3600  # the longest session (the route token's max age)
FLOW_TTL = 60
TRACE_TTL = 4 * 3600


def redis_client(url: str, *, timeout: float = 0.5, text: bool = True) -> redis.Redis:
    """The one way a service connects: short timeouts, no retries (the caller decides),
    strings in and out unless `text` is False (the relay's tokens are bytes)."""
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        retry=Retry(NoBackoff(), 0),
        health_check_interval=0,
        decode_responses=text,
    )


# -- keys --------------------------------------------------------------------------------


def transceiver_key(transceiver_id: str) -> str:
    return f"{PREFIX}transceiver:{transceiver_id}"


# The registry's index: a sorted set of every registered transceiver's id, scored by the unix
# time its hash expires by the writer's clock (the heartbeat writes both in one MULTI; the
# score only orders the read: a member leaves when a read finds its hash gone, so no clock
# decides who is live). Signaling reads the set and the hashes it names, not the keyspace (a
# SCAN every 0.5 s walked every call record, flow and trace).
TRANSCEIVERS = f"{PREFIX}transceivers"
MAX_TRANSCEIVERS = 1000  # at most this many read from the registry (the freshest first)
# Transceivers of a release before the index write only their hash: signaling finds them with
# a SCAN at its first read and then this often (not every 0.5 s), and indexes them itself. A
# later release drops this, once no such transceiver can be running.
LEGACY_SWEEP = 30.0


def call_key(call_id: str) -> str:
    return f"{PREFIX}call:{call_id}"


def recording_key(call_id: str) -> str:
    return f"{PREFIX}recording:{call_id}"


def flow_key(client: Address) -> str:
    return f"{PREFIX}flow:{client[0]}:{client[1]}"


# The flows' index: a sorted set of flow keys, scored by the Redis server's time of the key's
# last write (the writing scripts read TIME: one clock, the one EXPIRE counts on). Each write
# drops members older than FLOW_TTL (their keys have expired), so it holds at most a TTL's
# worth of flows. The relay's warm standby reads it, newest first, not the keyspace.
FLOWS = f"{PREFIX}flows"
FLOWS_PER_SCRIPT = 500  # flow keys a script writes (a big batch is several: Redis stays free)
# KEYS: the index, then flow keys; ARGV: FLOW_TTL, then each key's token and hop. (TIME then
# writes: Redis 5 or later, whose scripts replicate their effects.)
WRITE_FLOWS = """
local now = tonumber(redis.call('TIME')[1])
local ttl = tonumber(ARGV[1])
for i = 2, #KEYS do
  redis.call('HSET', KEYS[i], 'token', ARGV[2 * i - 2], 'hop', ARGV[2 * i - 1])
  redis.call('EXPIRE', KEYS[i], ttl)
  redis.call('ZADD', KEYS[1], now, KEYS[i])
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl - 1)
return #KEYS - 1
"""


def parse_flow_key(key: bytes | str) -> Address | None:
    """The client address a `flow_key` names (None: not a flow key)."""
    text = key.decode("utf-8", "replace") if isinstance(key, bytes) else key
    rest = text.removeprefix(f"{PREFIX}flow:")
    host, sep, port = rest.rpartition(":")
    if rest == text or not sep or not host or not port.isdigit() or int(port) > 65535:
        return None
    return host, int(port)


def trace_key(ufrag: str) -> str:
    return f"{PREFIX}trace:{ufrag}"


def secret_key(secret_id: str) -> str:
    return f"{PREFIX}secret:{secret_id}"


# -- records -------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransceiverInfo:
    """A transceiver as the registry has it (and as signaling's static list gives it)."""

    id: str
    api_url: str
    region: str
    cluster: int = 0
    media_addr: str = ""
    sessions: int = 0
    capacity: int = 0  # 0: unknown (static list), never "full"
    draining: bool = False
    records: bool | None = None  # has a --record-dir (None: unknown, a static list's)
    # ...and records phone calls too (a release before it did not: False where `records`)
    records_rtp: bool | None = None

    def can_record(self, media: str) -> bool | None:
        """Whether it records a call of `media` ("webrtc", "rtp"); None: not known."""
        if media == "rtp" and self.records is True:
            return self.records_rtp is True
        return self.records

    @property
    def load(self) -> float:
        """Sessions per capacity (0 when the capacity is unknown: a static list)."""
        return self.sessions / self.capacity if self.capacity > 0 else 0.0

    @property
    def full(self) -> bool:
        return self.capacity > 0 and self.sessions >= self.capacity

    def to_hash(self) -> dict[str, str]:
        fields = {k: str(v) for k, v in asdict(self).items() if k != "id"}
        fields["draining"] = "1" if self.draining else "0"
        fields["records"] = {True: "1", False: "0", None: ""}[self.records]
        fields["records_rtp"] = {True: "1", False: "0", None: ""}[self.records_rtp]
        return fields

    @classmethod
    def from_hash(cls, tx_id: str, fields: Mapping[str, str]) -> TransceiverInfo | None:
        """None when the hash is incomplete or malformed."""
        api_url = fields.get("api_url", "")
        region = fields.get("region", "")
        if not api_url.startswith(("http://", "https://")) or not region:
            return None
        try:
            return cls(
                id=tx_id,
                api_url=api_url.rstrip("/"),
                region=region,
                cluster=int(fields.get("cluster", "0")),
                media_addr=fields.get("media_addr", ""),
                sessions=max(0, int(fields.get("sessions", "0"))),
                capacity=max(0, int(fields.get("capacity", "0"))),
                draining=fields.get("draining", "0") not in ("0", "", "false", "False"),
                records={"1": True, "0": False}.get(fields.get("records", "")),
                records_rtp={"1": True, "0": False}.get(fields.get("records_rtp", "")),
            )
        except ValueError:
            return None


@dataclass(frozen=True)
class CallRecord:
    """Which transceiver and session carry a call, and which credential created it."""

    call_id: str
    transceiver_id: str
    api_url: str
    session_id: str
    owner: str
    region: str
    created: float
    client_ufrag: str = ""  # the caller's ICE ufrag now ("": not known)

    def to_hash(self) -> dict[str, str]:
        return {k: str(v) for k, v in asdict(self).items() if k != "call_id"}

    @classmethod
    def from_hash(cls, call_id: str, fields: Mapping[str, str]) -> CallRecord | None:
        """None when the hash is incomplete or malformed (`client_ufrag` may be absent:
        records written before it existed)."""
        try:
            return cls(
                call_id=call_id,
                transceiver_id=fields["transceiver_id"],
                api_url=fields["api_url"],
                session_id=fields["session_id"],
                owner=fields["owner"],
                region=fields["region"],
                created=float(fields["created"]),
                client_ufrag=fields.get("client_ufrag", ""),
            )
        except (KeyError, ValueError):
            return None


@dataclass(frozen=True)
class FlowRecord:
    """An established relay flow: its route token (re-verified on read) and, on a second
    hop, the first-hop relay its client's traffic comes through."""

    token: bytes
    hop: Address | None = None

    def to_hash(self) -> dict[bytes, bytes]:
        hop = format_hostport(self.hop).encode() if self.hop else b""
        return {b"token": self.token, b"hop": hop}

    @classmethod
    def from_hash(cls, fields: Mapping[bytes, bytes]) -> FlowRecord | None:
        token = fields.get(b"token")
        if not token:
            return None
        hop_text = fields.get(b"hop", b"")
        try:
            hop = parse_hostport(hop_text.decode()) if hop_text else None
        except (UnicodeDecodeError, ValueError):
            return None
        return cls(token, hop)


def write_flows(client: Any, flows: Iterable[tuple[Address, FlowRecord]]) -> int:
    """Write flow records with their TTL and into the index: a script per `FLOWS_PER_SCRIPT`
    (each key with its TTL and member atomically; a batch of 100,000 does not hold Redis
    for the half second every client's timeout is)."""
    written = 0
    pending = list(flows)
    for at in range(0, len(pending), FLOWS_PER_SCRIPT):
        keys: list[str] = [FLOWS]
        args: list[int | bytes] = [FLOW_TTL]
        for address, record in pending[at : at + FLOWS_PER_SCRIPT]:
            fields = record.to_hash()
            keys.append(flow_key(address))
            args += [fields[b"token"], fields[b"hop"]]
        written += int(client.eval(WRITE_FLOWS, len(keys), *keys, *args))
    return written
