"""The shared-socket mux: which session a datagram on the transceiver's ONE UDP socket is for.

Datagrams arrive PROXY-v2 framed from relays (src = the client as the relay saw it, dst = the
ingress it used), or unframed straight from clients with `--accept-direct`. Rules:

* a STUN Binding request goes to the session whose ufrag (the route token) is the server
  half of its USERNAME — ICE then authenticates it (MESSAGE-INTEGRITY) and answers;
* anything else goes to a session only from a client address ICE has validated (a
  succeeded pair), so no unauthenticated DTLS or SRTP ever reaches aiortc;
* the route back to a client is the relay that most recently delivered its traffic, framed
  with (src = ingress, dst = client); direct clients are answered unframed.

Pure: no sockets, no clock; the Trio loop in `service.py` feeds it and sends what it says.
Generic over the session type so tests can use plain objects.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from shared.wire.proxy_v2 import (
    FAMILY_INET6_DGRAM,
    SIGNATURE,
    V4_HEADER,
    V6_HEADER,
    ProxyError,
    build_proxy_v2,
    parse_proxy_v2,
)
from shared.wire.stun import binding_request_server_ufrag

S = TypeVar("S")
Address = tuple[str, int]

MAX_DATAGRAM = 1500
MAX_CACHED_HEADERS = 65536


@dataclass(slots=True)
class Route:
    relay: Address | None  # None: a direct client
    ingress: Address | None
    header: bytes  # PROXY v2 toward the client (src = ingress, dst = client); b"" if direct


@dataclass(slots=True)
class Delivery(Generic[S]):
    session: S
    client: Address
    payload: bytes


@dataclass
class SessionMux(Generic[S]):
    accept_direct: bool = False
    by_ufrag: dict[bytes, S] = field(default_factory=dict)
    by_client: dict[Address, S] = field(default_factory=dict)  # validated clients only
    routes: dict[Address, Route] = field(default_factory=dict)
    clients_of: dict[int, set[Address]] = field(default_factory=dict)  # id(session) -> clients
    drops: Counter[str] = field(default_factory=Counter)
    received: int = 0
    headers: dict[bytes, tuple[Address, Address]] = field(default_factory=dict)

    # -- sessions -------------------------------------------------------------------------

    def add_ufrag(self, ufrag: str, session: S) -> None:
        self.by_ufrag[ufrag.encode()] = session

    def remove_ufrag(self, ufrag: str) -> None:
        self.by_ufrag.pop(ufrag.encode(), None)

    def validated(self, session: S, client: Address) -> None:
        """ICE found a valid pair to `client`: its non-STUN traffic may now reach `session`."""
        self.by_client[client] = session
        self.clients_of.setdefault(id(session), set()).add(client)

    def remove_session(self, session: S, ufrags: list[str]) -> None:
        for ufrag in ufrags:
            self.remove_ufrag(ufrag)
        for client in self.clients_of.pop(id(session), set()):
            if self.by_client.get(client) is session:
                del self.by_client[client]
            self.routes.pop(client, None)

    # -- datagrams ------------------------------------------------------------------------

    def on_datagram(self, src: Address, data: bytes) -> Delivery[S] | None:
        """Decide where one datagram goes; None means dropped (counted by reason)."""
        self.received += 1
        if data.startswith(SIGNATURE):
            # A flow's header is the same on every datagram: parse it once, then look the
            # exact bytes up (bounded cache; a header with TLVs is parsed each time).
            hlen = V6_HEADER if len(data) > 13 and data[13] == FAMILY_INET6_DGRAM else V4_HEADER
            known = self.headers.get(data[:hlen])
            if known is None:
                try:
                    hdr = parse_proxy_v2(data)
                except ProxyError as exc:
                    self.drops[exc.reason] += 1
                    return None
                known = (hdr.src, hdr.dst)
                hlen = hdr.payload_offset
                if hlen in (V4_HEADER, V6_HEADER):
                    if len(self.headers) >= MAX_CACHED_HEADERS:
                        self.headers.clear()
                    self.headers[data[:hlen]] = known
            client, ingress = known
            payload = data[hlen:]
            relay: Address | None = src
        elif self.accept_direct:
            client, ingress, payload, relay = src, None, data, None
        else:
            self.drops["unframed"] += 1
            return None
        if len(payload) > MAX_DATAGRAM:
            self.drops["oversize"] += 1
            return None
        if not payload:
            self.drops["empty"] += 1
            return None
        session = None
        if payload[0] < 4:  # STUN (RFC 7983)
            ufrag = binding_request_server_ufrag(payload)
            if ufrag is not None:
                session = self.by_ufrag.get(ufrag)
                if session is None:
                    self.drops["unknown_ufrag"] += 1
                    return None
                self.clients_of.setdefault(id(session), set()).add(client)
        if session is None:
            session = self.by_client.get(client)
            if session is None:
                self.drops["unvalidated"] += 1
                return None
        self._note_route(client, relay, ingress)
        return Delivery(session, client, payload)

    def _note_route(self, client: Address, relay: Address | None, ingress: Address | None) -> None:
        route = self.routes.get(client)
        if route is None or route.relay != relay or route.ingress != ingress:
            header = build_proxy_v2(ingress, client) if ingress is not None else b""
            self.routes[client] = Route(relay, ingress, header)

    def frame_for(self, client: Address, payload: bytes) -> tuple[bytes, Address] | None:
        """The datagram to send and where, to reach `client` (None: no route known)."""
        route = self.routes.get(client)
        if route is None:
            self.drops["no_route"] += 1
            return None
        if route.relay is None:
            return payload, client
        return route.header + payload, route.relay
