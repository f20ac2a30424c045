"""The shared-socket mux: which session a datagram on the transceiver's ONE UDP socket is for.

Datagrams arrive PROXY-v2 framed from relays (src = the client as the relay saw it, dst = the
ingress it used), or unframed straight from clients with `--accept-direct`. Rules:

* a STUN Binding request goes to the session whose ufrag (the route token) is the server
  half of its USERNAME — that session's ICE-lite agent (`ice_lite.py`) then authenticates it;
* another STUN message from an address a session is validating (its answer to our check)
  goes to that session;
* anything else goes to a session only from a client address ICE has validated, so no
  unauthenticated DTLS or SRTP ever reaches aiortc;
* the route back to a client is the relay that most recently delivered its traffic, framed
  with (src = ingress, dst = client) and the client's transport as the relay marked it
  (STREAM for an ICE-TCP client: the relay finds its connection by that header); direct
  clients are answered unframed. A TCP client is only ever reached through its relay.

Nothing is remembered about a client until it has authenticated: the route back is noted by
`note_route` once its check passed, and the parsed-header cache only learns the headers of
validated clients. So a flood of unauthenticated packets, from however many sources, leaves
no state behind.

Pure: no sockets, no clock; the Trio loop in `service.py` feeds it and sends what it says.
Generic over the session type so tests can use plain objects.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from firsthop.shared.address import Address
from firsthop.shared.wire.demux import STUN_LAST
from firsthop.shared.wire.proxy_v2 import (
    SIGNATURE,
    V4_HEADER,
    V6_HEADER,
    ProxyError,
    build_proxy_v2,
    parse_proxy_v2,
    plain_header_length,
)
from firsthop.shared.wire.stun import binding_request_server_ufrag

S = TypeVar("S")
MAX_DATAGRAM = 1500
MAX_CACHED_HEADERS = 65536


@dataclass(slots=True)
class Route:
    relay: Address | None  # None: a direct client
    ingress: Address | None
    header: bytes  # PROXY v2 toward the client (src = ingress, dst = client); b"" if direct
    stream: bool = False  # the client reached the relay over ICE-TCP


@dataclass(slots=True)
class Delivery(Generic[S]):
    session: S
    client: Address
    payload: bytes
    relay: Address | None = None  # where it came from (None: a direct client)
    ingress: Address | None = None
    stream: bool = False  # the relay marked the client's transport TCP (PROXY v2 STREAM)


@dataclass(frozen=True, slots=True)
class Unrouted:
    """A Binding request for a ufrag no session holds (the call ended, or never was here)."""

    ufrag: bytes
    client: Address
    relay: Address | None
    ingress: Address | None
    stream: bool = False


@dataclass
class SessionMux(Generic[S]):
    accept_direct: bool = False
    by_ufrag: dict[bytes, S] = field(default_factory=dict)
    by_client: dict[Address, S] = field(default_factory=dict)  # validated clients only
    probing: dict[Address, S] = field(default_factory=dict)  # addresses being validated
    probe_of: dict[int, Address] = field(default_factory=dict)  # id(session) -> its probe
    routes: dict[Address, Route] = field(default_factory=dict)
    clients_of: dict[int, set[Address]] = field(default_factory=dict)  # id(session) -> clients
    drops: Counter[str] = field(default_factory=Counter)
    received: int = 0
    headers: dict[bytes, tuple[Address, Address, bool]] = field(default_factory=dict)

    # -- sessions -------------------------------------------------------------------------

    def add_ufrag(self, ufrag: str, session: S) -> None:
        self.by_ufrag[ufrag.encode()] = session

    def remove_ufrag(self, ufrag: str) -> None:
        self.by_ufrag.pop(ufrag.encode(), None)

    def validated(self, session: S, client: Address) -> None:
        """ICE found a valid pair to `client`: its non-STUN traffic may now reach `session`."""
        self.by_client[client] = session
        self.clients_of.setdefault(id(session), set()).add(client)

    def expect(self, session: S, client: Address) -> None:
        """`session` is validating `client`: its answer (not yet validated) may come in."""
        self.unexpect(session)
        self.probing[client] = session
        self.probe_of[id(session)] = client

    def unexpect(self, session: S) -> None:
        client = self.probe_of.pop(id(session), None)
        if client is not None and self.probing.get(client) is session:
            del self.probing[client]

    def forget(self, session: S, client: Address) -> None:
        """`session` no longer listens to `client` (a path it let go of)."""
        if self.by_client.get(client) is session:
            del self.by_client[client]
        if self.probe_of.get(id(session)) == client:
            self.unexpect(session)
        clients = self.clients_of.get(id(session))
        if clients is not None and client in clients:
            clients.discard(client)
            self.routes.pop(client, None)

    def remove_session(self, session: S, ufrags: list[str]) -> list[tuple[Address, Route]]:
        """Forget a session; returns its clients' routes (to tell their relays)."""
        for ufrag in ufrags:
            self.remove_ufrag(ufrag)
        self.unexpect(session)
        routes = []
        for client in self.clients_of.pop(id(session), set()):
            if self.by_client.get(client) is session:
                del self.by_client[client]
            route = self.routes.pop(client, None)
            if route is not None:
                routes.append((client, route))
        return routes

    # -- datagrams ------------------------------------------------------------------------

    def on_datagram(self, src: Address, data: bytes) -> Delivery[S] | Unrouted | None:
        """Decide where one datagram goes; None means dropped (counted by reason)."""
        self.received += 1
        cache_as = b""
        if data.startswith(SIGNATURE):
            # A flow's header is the same on every datagram: parse it once, then look the
            # exact bytes up (a bounded cache of validated clients' headers; a header with
            # TLVs is parsed each time).
            hlen = plain_header_length(data)
            known = self.headers.get(data[:hlen]) if hlen else None
            if known is None:
                try:
                    hdr = parse_proxy_v2(data)
                except ProxyError as exc:
                    self.drops[exc.reason] += 1
                    return None
                known = (hdr.src, hdr.dst, hdr.stream)
                hlen = hdr.payload_offset
                if hlen in (V4_HEADER, V6_HEADER):
                    cache_as = data[:hlen]
            client, ingress, stream = known
            payload = data[hlen:]
            relay: Address | None = src
        elif self.accept_direct:
            client, ingress, payload, relay, stream = src, None, data, None, False
        else:
            self.drops["unframed"] += 1
            return None
        if len(payload) > MAX_DATAGRAM:
            self.drops["oversize"] += 1
            return None
        if not payload:
            self.drops["empty"] += 1
            return None
        if payload[0] <= STUN_LAST:  # authenticated by the session, not here
            ufrag = binding_request_server_ufrag(payload)
            if ufrag is not None:
                session = self.by_ufrag.get(ufrag)
                if session is None:
                    self.drops["unknown_ufrag"] += 1
                    return Unrouted(ufrag, client, relay, ingress, stream)
                return Delivery(session, client, payload, relay, ingress, stream)
            session = self.probing.get(client)
            if session is not None:
                return Delivery(session, client, payload, relay, ingress, stream)
        session = self.by_client.get(client)
        if session is None:
            self.drops["unvalidated"] += 1
            return None
        if cache_as:
            if len(self.headers) >= MAX_CACHED_HEADERS:
                self.headers.clear()
            self.headers[cache_as] = (client, ingress, stream)  # type: ignore[assignment]
        self._note_route(client, relay, ingress, stream)
        return Delivery(session, client, payload, relay, ingress, stream)

    def note_route(self, session: S, delivery: Delivery[S]) -> None:
        """`delivery`'s client authenticated: answers to it go back the way it came."""
        self.clients_of.setdefault(id(session), set()).add(delivery.client)
        self._note_route(delivery.client, delivery.relay, delivery.ingress, delivery.stream)

    def _note_route(
        self, client: Address, relay: Address | None, ingress: Address | None, stream: bool
    ) -> None:
        route = self.routes.get(client)
        if (
            route is None
            or route.relay != relay
            or route.ingress != ingress
            or route.stream != stream
        ):
            header = build_proxy_v2(ingress, client, stream=stream) if ingress is not None else b""
            self.routes[client] = Route(relay, ingress, header, stream)

    def frame_for(self, client: Address, payload: bytes) -> tuple[bytes, Address] | None:
        """The datagram to send and where, to reach `client` (None: no route known)."""
        route = self.routes.get(client)
        if route is None:
            self.drops["no_route"] += 1
            return None
        if route.relay is None:
            return payload, client
        return route.header + payload, route.relay
