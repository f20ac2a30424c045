"""The relay's flow records and the decisions its flow table returns (see `flow_table.py`).

Plain data: a `Flow` per client (and per second-hop client), its `Candidate` during an ICE
restart to another place, the `RelayLimits` the table enforces, and the small frozen
decisions the I/O layer carries out (`Forward`, `Deliver`, `ReturnToPeer`, `Drop`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from firsthop.shared.address import Address
from firsthop.shared.wire.route_token import DEFAULT_MAX_AGE
from firsthop.shared.wire.stun import HEADER_LENGTH, MAGIC_COOKIE

MAX_DATAGRAM = 1500  # larger datagrams are dropped: no WebRTC packet needs more on the wire
_BINDING_SUCCESS = b"\x01\x01"  # message_type(BINDING, SUCCESS), RFC 8489 §5
_COOKIE = MAGIC_COOKIE.to_bytes(4, "big")


@dataclass(frozen=True, slots=True)
class RelayLimits:
    pending_ttl: float = 10.0
    idle_ttl: float = 60.0
    max_flows: int = 200_000
    max_pending: int = 20_000
    max_pending_per_ip: int = 32
    max_pending_per_token: int = 8  # a real call: one per client candidate pair
    max_flows_per_token: int = 8  # established; the least recently used yields beyond
    max_revoked: int = 100_000  # tokens remembered as revoked (oldest forgotten first)
    new_flow_rate: float = 20.0  # per source IP, per second
    new_flow_burst: float = 40.0
    # ICE-TCP (RFC 6544) connections, per worker (`tcp_ingress.py`)
    tcp_max_connections: int = 10_000
    tcp_max_per_ip: int = 64  # (callers behind one NAT share an IP: a UDP-blocking office)
    tcp_first_frame_timeout: float = 5.0  # a valid first check within this, or closed
    tcp_idle_timeout: float = 30.0  # no complete frame for this long: closed
    tcp_write_buffer: int = 16 * 1024  # bytes queued toward a slow reader; beyond, dropped
    tcp_write_budget: int = 16 * 1024 * 1024  # bytes queued toward all of a worker's readers
    token_max_age: float = DEFAULT_MAX_AGE
    store_refresh: float = 10.0  # rewrite a live flow to the cache at most this often
    lookup_rate: float = 2000.0  # Redis recovery lookups per second, whole worker
    negative_ttl: float = 5.0  # remember a cache miss this long
    max_lookups_in_flight: int = 1000


@dataclass(slots=True)
class Candidate:
    dest: Address
    token: bytes
    header: bytes
    created: float


@dataclass(slots=True, eq=False)
class Flow:
    client: Address
    dest: Address
    token: bytes
    header: bytes  # PROXY v2 toward dest: src = client, dst = ingress
    return_key: bytes  # PROXY v2 the destination sends back: src = ingress, dst = client
    via: Address | None  # second-hop flows: the peer relay socket the client's traffic uses
    ingress: Address  # the public address the client sent to (ours, or the first hop's)
    established: bool
    created: float
    last_seen: float
    candidate: Candidate | None = None
    stored_at: float = float("-inf")  # last write to the flow cache
    established_at: float = 0.0
    stream: bool = False  # the client came over ICE-TCP: frames say so, no cache entry


# Decisions. The I/O layer sends; these say what.
@dataclass(frozen=True, slots=True)
class Forward:
    """Send `header + payload` to `dest` from the internal socket (header b"": as is)."""

    dest: Address
    header: bytes
    payload_offset: int = 0


@dataclass(frozen=True, slots=True)
class Deliver:
    """Send the datagram from `offset` to `client` from the public socket (`stream`: on
    the client's ICE-TCP connection, RFC 4571 framed)."""

    client: Address
    offset: int
    stream: bool = False


@dataclass(frozen=True, slots=True)
class ReturnToPeer:
    """Send the whole datagram back to the first-hop relay `via` from the peer socket."""

    via: Address


@dataclass(frozen=True, slots=True)
class Drop:
    reason: str


@dataclass(frozen=True, slots=True)
class Held:
    """Kept until the flow cache answers for this client (see `FlowTable.recovered`)."""


HELD = Held()


@dataclass(frozen=True, slots=True)
class Recover:
    """Look `client` up in the flow cache; the datagram is held meanwhile."""

    client: Address
    via: Address | None


@dataclass(frozen=True, slots=True)
class Consumed:
    """The datagram was for the relay itself (a revocation notice): nothing to send."""


CONSUMED = Consumed()

Decision = Forward | Deliver | ReturnToPeer | Drop | Recover | Held | Consumed

FORWARDED_AS_IS = b""


@dataclass(slots=True)
class FlowEvents:
    """What happened since the I/O layer last asked (for the cache, traces and metrics)."""

    established: list[Flow] = field(default_factory=list)


def is_binding_success(data: bytes, offset: int) -> bool:
    """Is the payload at `offset` a STUN Binding success response (RFC 8489 §5, §6.3)?"""
    size = len(data) - offset
    return (
        size >= HEADER_LENGTH
        and data[offset : offset + 2] == _BINDING_SUCCESS
        and data[offset + 4 : offset + 8] == _COOKIE
        and int.from_bytes(data[offset + 2 : offset + 4], "big") == size - HEADER_LENGTH
    )
