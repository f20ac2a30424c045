"""The relay's flow table: a sans-IO core that says where every datagram goes.

A relay worker has three sockets and this table decides for each datagram (docs/architecture.md
§2-4):

* `on_client`: from a client on the public socket. A known client goes to its flow's
  destination, PROXY-v2 framed. An unknown client must open with a STUN Binding request
  whose server ufrag is a valid route token: the token names a transceiver in this relay's
  cluster (the flow goes there) or another cluster (the flow goes to that cluster's relay,
  a Global Relay hop). Anything else from an unknown client is recovered from the Redis
  flow cache (`Recover`) or dropped.
* `on_tcp_client`: a frame from an ICE-TCP connection (RFC 6544, `tcp_ingress.py`): the
  same rules as `on_client`, in a table of its own keyed by the connection's remote address
  (unique per live connection), so a flow is pinned to its connection and a UDP client can
  never reach it. Its frames say STREAM (`proxy_v2`), so replies name it apart from a UDP
  client of the same address; it is never written to nor recovered from the flow cache (the
  connection dies with the worker).
* `on_peer`: a framed datagram from a peer cluster's relay (we are the second hop). Same
  rules, keyed by the client address in the PROXY header; forwarded unchanged.
* `on_return`: a framed datagram from a destination. Its PROXY header names the client; the
  payload goes to that client only if the client has a flow *and* the datagram came from
  that flow's destination. The relay never sends to an address without a flow.

Flow safety: a new flow is *pending* until its destination answers the client's check with a
STUN Binding *success* response — the one thing on the return path the relay reads, since a
transceiver answers only checks that authenticate (RFC 8445 §7.3); anything else coming back
for a pending flow is dropped, so no amount of unauthenticated traffic establishes a flow.
Pending flows expire after `pending_ttl` and are capped per source IP (an IPv6 source counts
by its /64, `address.source_key`), per route token and globally, with the global pool shared
fairly between tokens (`token_ledger.py`); established
flows are capped per token (the least recently used yields) and expire after `idle_ttl`
without traffic. A Binding request from an established client with a different valid token
(ICE restart, or a spoofed source) becomes a *candidate*: its STUN goes to the new
destination, everything else keeps going to the old one, and the flow re-points only when
the new destination answers with a success response.

Revocation: a transceiver that gets a check for a token none of its sessions holds (the call
ended) says so with a TOKEN_REVOKED TLV (`proxy_v2.revocation_tlv`). The relay believes it
only from where that token routes to, then refuses the token for new flows and drops its
flows; the notice outlives nothing (it expires with the token, and the list is bounded).

Strategy: every decision a datagram needs is one dict lookup keyed by bytes or an address
tuple. Frames toward a destination are built once per flow (`Flow.header`); frames coming
back are recognised by their exact header bytes (`Flow.return_key`), so the I/O loop can
run the common cases inline and call into this class only for the rest. Time is passed in
(unix seconds, float); nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from firsthop.services.relay.flows import (
    CONSUMED,
    FORWARDED_AS_IS,
    HELD,
    MAX_DATAGRAM,
    Candidate,
    Decision,
    Deliver,
    Drop,
    Flow,
    FlowEvents,
    Forward,
    Recover,
    RelayLimits,
    ReturnToPeer,
    is_binding_success,
)
from firsthop.services.relay.token_ledger import TokenLedger
from firsthop.shared.address import Address, ip_family, source_key
from firsthop.shared.ratelimit import KeyedLimiter, TokenBucket
from firsthop.shared.wire.demux import STUN_LAST
from firsthop.shared.wire.proxy_v2 import (
    ProxyError,
    ProxyHeader,
    build_proxy_v2,
    parse_proxy_v2,
    plain_header_length,
    revoked_token,
)
from firsthop.shared.wire.route_token import (
    DestinationFilter,
    Keyring,
    RouteToken,
    TokenError,
    verify_route_token,
)
from firsthop.shared.wire.stun import binding_request_server_ufrag

MAX_RECOVERY_BUFFER = 8  # datagrams held per client while its flow is looked up


def _by_family(*addrs: Address | None) -> dict[int, Address]:
    out: dict[int, Address] = {}
    for addr in addrs:
        if addr is not None:
            out.setdefault(ip_family(addr[0]), addr)
    return out


class FlowTable:
    def __init__(
        self,
        *,
        cluster: int,
        keys: Mapping[int, bytes],
        ingress: Address,
        allow_dest: DestinationFilter,
        peers: Mapping[int, Address] | None = None,
        limits: RelayLimits | None = None,
        recovery: bool = False,
        now: float = 0.0,
        ingress_tcp: Address | None = None,
        ingress_other: Address | None = None,
        ingress_tcp_other: Address | None = None,
    ) -> None:
        self.cluster = cluster
        self.keys = Keyring(keys)
        self.ingress = ingress
        self.ingress_tcp = ingress_tcp or ingress
        # The ingress a new flow's frames name, by the client's IP family (PROXY v2 writes
        # src and dst in one family, §2.2): a relay listening on both has one of each.
        self.ingress_by_family = _by_family(ingress, ingress_other)
        self.ingress_tcp_by_family = _by_family(self.ingress_tcp, ingress_tcp_other)
        self.allow_dest = allow_dest
        self.peers = dict(peers or {})
        self.peer_hosts = frozenset(host for host, _ in self.peers.values())
        self.limits = limits or RelayLimits()
        self.recovery = recovery
        # client address -> flow, for clients on our public socket
        self.flows: dict[Address, Flow] = {}
        # ICE-TCP connection's remote address -> flow
        self.tcp_flows: dict[Address, Flow] = {}
        # first-hop relay's header bytes (src = client, dst = its ingress) -> second-hop flow
        self.hop_flows: dict[bytes, Flow] = {}
        # exact return header bytes -> flow (both kinds)
        self.by_return: dict[bytes, Flow] = {}
        self.pending = 0
        self.pending_per_ip: Counter[str] = Counter()  # by `source_key` (an IPv6 /64)
        self.ledger: TokenLedger[Flow] = TokenLedger(
            self.limits.max_pending_per_token, self.limits.max_flows_per_token
        )
        # revoked token -> when it would have expired anyway (unix s), oldest first
        self.revoked: dict[bytes, float] = {}
        self.drops: Counter[str] = Counter()
        self.evictions: Counter[str] = Counter()  # flows that yielded to another, by cap
        self.revocations = 0
        self.recoveries = 0
        self.events = FlowEvents()
        self._new_flow_limiter = KeyedLimiter(self.limits.new_flow_rate, self.limits.new_flow_burst)
        self._lookup_bucket = TokenBucket(self.limits.lookup_rate, self.limits.lookup_rate, now)
        self._negative: dict[Address, float] = {}
        self.recovering: dict[Address, list[tuple[bytes, Address | None]]] = {}
        self._sweep: list[Flow] | None = None
        self._sweep_pos = 0
        self._refresh_due: list[Flow] = []

    # -- the common cases, for the data plane's loop ---------------------------------------
    #
    # The data-plane thread runs these per datagram, inline, with no allocation: each is the
    # first branch of `on_client`, `on_return` or `on_peer`, and sets what those would set.
    # None means "not the common case": call the full method. (Tested: the same sequences
    # through fast-then-full and full-only give the same decisions and the same table.)

    def known_client(self, client: Address, n: int, first: int, now: float) -> Flow | None:
        """A non-STUN datagram of `n` bytes from a client with a flow: it goes to
        `flow.dest`, framed with `flow.header`."""
        flow = self.flows.get(client)
        if flow is None or first <= STUN_LAST or not 0 < n <= MAX_DATAGRAM:
            return None
        flow.last_seen = now
        return flow

    def known_tcp_client(self, client: Address, n: int, first: int, now: float) -> Flow | None:
        """`known_client` for a frame from an ICE-TCP connection."""
        flow = self.tcp_flows.get(client)
        if flow is None or first <= STUN_LAST or not 0 < n <= MAX_DATAGRAM:
            return None
        flow.last_seen = now
        return flow

    def known_return(self, header: bytes, src: Address, payload: int, now: float) -> Flow | None:
        """A datagram from `src` whose exact PROXY header (no TLVs) is an established flow's
        return key, carrying `payload` bytes: it goes to `flow.client` (or, on a second hop,
        as it is to `flow.via`)."""
        flow = self.by_return.get(header)
        if flow is None or not flow.established or flow.dest != src or payload > MAX_DATAGRAM:
            return None
        flow.last_seen = now
        return flow

    def known_peer(
        self, header: bytes, src: Address, first: int, payload: int, now: float
    ) -> Flow | None:
        """A non-STUN datagram from the first-hop relay `src` of a second-hop flow, whose
        exact PROXY header is the flow's, carrying `payload` bytes: it goes as it is to
        `flow.dest`."""
        flow = self.hop_flows.get(header)
        if flow is None or src != flow.via or first <= STUN_LAST or payload > MAX_DATAGRAM:
            return None
        flow.last_seen = now
        return flow

    # -- datagrams from clients (public socket) -------------------------------------------

    def on_client(self, client: Address, data: bytes, now: float) -> Decision:
        if len(data) > MAX_DATAGRAM:
            return self._drop("oversize")
        flow = self.flows.get(client)
        if flow is not None:
            return self._known(flow, data, 0, now)
        ingress = self.ingress_by_family.get(ip_family(client[0]))
        if ingress is None:  # (no socket of that family feeds this table)
            return self._drop("ingress_family")
        return self._unknown(client, data, 0, None, ingress, now)

    # -- frames from ICE-TCP connections ---------------------------------------------------

    def on_tcp_client(self, client: Address, data: bytes, now: float) -> Decision:
        if len(data) > MAX_DATAGRAM:
            return self._drop("oversize")
        flow = self.tcp_flows.get(client)
        if flow is not None:
            return self._known(flow, data, 0, now)
        ingress = self.ingress_tcp_by_family.get(ip_family(client[0]))
        if ingress is None:
            return self._drop("ingress_family")
        return self._unknown(client, data, 0, None, ingress, now, stream=True)

    def forget_tcp(self, client: Address) -> None:
        """The connection from `client` closed: its flow goes with it."""
        flow = self.tcp_flows.get(client)
        if flow is not None:
            self._remove(flow)

    # -- datagrams from peer relays (we are the second hop) --------------------------------

    def on_peer(self, src: Address, data: bytes, now: float) -> Decision:
        # A first-hop relay talks from any of its workers' ports, from a host we peer with
        # or one the destination allow-list covers (a relay fleet lives in internal ranges).
        if src[0] not in self.peer_hosts and not self.allow_dest.allows_host(src[0]):
            return self._drop("peer_not_allowed")
        found = self._framed(self.hop_flows, data)
        if isinstance(found, Drop):
            return found
        flow, hlen, hdr = found
        if flow is None:
            assert hdr is not None
            if len(data) - hlen > MAX_DATAGRAM:
                return self._drop("oversize")
            return self._unknown(hdr.src, data, hlen, src, hdr.dst, now, stream=hdr.stream)
        if len(data) - hlen > MAX_DATAGRAM:
            return self._drop("oversize")
        flow.via = src
        return self._known(flow, data, hlen, now)

    # -- shared paths ------------------------------------------------------------------------

    def _known(self, flow: Flow, data: bytes, off: int, now: float) -> Decision:
        flow.last_seen = now
        hop = flow.via is not None
        if len(data) > off and data[off] <= STUN_LAST:  # STUN: maybe an ICE restart
            ufrag = binding_request_server_ufrag(data[off:] if off else data)
            if ufrag is not None and ufrag != flow.token:
                cand = flow.candidate
                if cand is not None and ufrag == cand.token:
                    return Forward(cand.dest, FORWARDED_AS_IS if hop else cand.header, off)
                route = self._route(ufrag, flow.client, flow.via, flow.ingress, now, flow.stream)
                if isinstance(route, Drop):
                    return route
                dest, header = route
                if dest == flow.dest:
                    if (
                        not flow.established
                        and self.ledger.pending_count(ufrag) >= self.limits.max_pending_per_token
                    ):
                        return self._drop("pending_per_token")
                    self._retoken(flow, ufrag)  # new token, same place: nothing to re-point
                    if flow.established:
                        self.events.established.append(flow)  # the cache learns the token
                else:
                    flow.candidate = Candidate(dest, ufrag, header, now)
                return Forward(dest, FORWARDED_AS_IS if hop else header, off)
        return Forward(flow.dest, FORWARDED_AS_IS if hop else flow.header, off)

    def _unknown(
        self,
        client: Address,
        data: bytes,
        off: int,
        via: Address | None,
        ingress: Address,
        now: float,
        *,
        stream: bool = False,
    ) -> Decision:
        payload = data[off:] if off else data
        ufrag = binding_request_server_ufrag(payload)
        if ufrag is None:
            if stream:  # an ICE-TCP flow lives and dies with its connection
                return self._drop("no_flow")
            return self._recover_or_drop(client, data, via, now)
        lim = self.limits
        source = source_key(client[0])
        if not self._new_flow_limiter.take(source, now):
            return self._drop("rate_limited")
        if self.size >= lim.max_flows:
            return self._drop("table_full")
        if self.pending_per_ip[source] >= lim.max_pending_per_ip:
            return self._drop("pending_per_ip")
        if self.ledger.pending_count(ufrag) >= lim.max_pending_per_token:
            return self._drop("pending_per_token")
        victim = None
        if self.pending >= lim.max_pending:
            victim = self.ledger.victim(ufrag)
            if victim is None:
                return self._drop("pending_full")
        route = self._route(ufrag, client, via, ingress, now, stream)
        if isinstance(route, Drop):
            return route
        if victim is not None:  # only a verified token may take another's slot
            self._remove(victim)
            self.evictions["pending_fair_share"] += 1
        dest, header = route
        flow = self._add(
            client, dest, ufrag, header, via, ingress, now, established=False, stream=stream
        )
        return Forward(flow.dest, FORWARDED_AS_IS if via else flow.header, off)

    def _route(
        self,
        ufrag: bytes,
        client: Address,
        via: Address | None,
        ingress: Address,
        now: float,
        stream: bool = False,
    ) -> tuple[Address, bytes] | Drop:
        """Verify a token and say where its flow goes, with the frame toward there."""
        if ufrag in self.revoked:
            return self._drop("token_revoked")
        try:
            token = verify_route_token(
                ufrag, self.keys, now, max_age=self.limits.token_max_age, allow_dest=None
            )
        except TokenError as exc:
            return self._drop(exc.reason)
        dest = self._destination(token, via)
        if isinstance(dest, Drop):
            return dest
        return dest, build_proxy_v2(client, ingress, stream=stream)

    def _destination(self, token: RouteToken, via: Address | None) -> Address | Drop:
        if token.cluster == self.cluster:
            # The relay that delivers to a transceiver enforces the allow-list (§7 note).
            if not self.allow_dest.allows(token.packed_ip):
                return self._drop("dest_not_allowed")
            return token.dest
        if via is not None:
            return self._drop("hop_loop")  # a second hop never forwards again
        peer = self.peers.get(token.cluster)
        if peer is None:
            return self._drop("unknown_cluster")
        return peer

    def _add(
        self,
        client: Address,
        dest: Address,
        token: bytes,
        header: bytes,
        via: Address | None,
        ingress: Address,
        now: float,
        *,
        established: bool,
        stream: bool = False,
    ) -> Flow:
        flow = Flow(
            client=client,
            dest=dest,
            token=token,
            header=header,
            return_key=build_proxy_v2(ingress, client, stream=stream),
            via=via,
            ingress=ingress,
            established=established,
            created=now,
            last_seen=now,
            stream=stream,
        )
        clients = self.tcp_flows if stream else self.flows
        old = self.hop_flows.get(header) if via is not None else clients.get(client)
        if old is not None:
            self._remove(old)
        if via is None:
            clients[client] = flow
        else:
            self.hop_flows[header] = flow
        self.by_return[flow.return_key] = flow
        if established:
            self._admit_established(flow)
        else:
            self.pending += 1
            self.pending_per_ip[source_key(client[0])] += 1
            self.ledger.add_pending(token, flow)
        return flow

    def _remove(self, flow: Flow) -> None:
        if flow.via is None:
            clients = self.tcp_flows if flow.stream else self.flows
            if clients.get(flow.client) is flow:
                del clients[flow.client]
        elif self.hop_flows.get(flow.header) is flow:
            del self.hop_flows[flow.header]
        if self.by_return.get(flow.return_key) is flow:
            del self.by_return[flow.return_key]
        if flow.established:
            self.ledger.remove_established(flow.token, flow)
        else:
            self._unpend(flow)

    def _admit_established(self, flow: Flow) -> None:
        """Count `flow` as established under its token; beyond the cap, the token's least
        recently used flow yields (a NAT rebinding's new path displaces the dead one)."""
        self.ledger.add_established(flow.token, flow)
        flows = self.ledger.established(flow.token)
        if len(flows) > self.limits.max_flows_per_token:
            lru = min((f for f in flows if f is not flow), key=lambda f: f.last_seen)
            self._remove(lru)
            self.evictions["established_per_token"] += 1

    def _retoken(self, flow: Flow, token: bytes) -> None:
        if flow.established:
            self.ledger.remove_established(flow.token, flow)
            flow.token = token
            self._admit_established(flow)
        else:
            self.ledger.remove_pending(flow.token, flow)
            flow.token = token
            self.ledger.add_pending(token, flow)

    def _unpend(self, flow: Flow) -> None:
        self.ledger.remove_pending(flow.token, flow)
        self.pending -= 1
        ip = source_key(flow.client[0])
        left = self.pending_per_ip[ip] - 1
        if left > 0:
            self.pending_per_ip[ip] = left
        else:
            del self.pending_per_ip[ip]

    # -- datagrams from destinations (internal socket) ------------------------------------

    def on_return(self, src: Address, data: bytes, now: float) -> Decision:
        found = self._framed(self.by_return, data)
        if isinstance(found, Drop):
            return found
        flow, hlen, hdr = found
        if hdr is not None:
            token = revoked_token(data, hdr)
            if token is not None:
                return self._revocation_notice(src, token, flow, now)
        if flow is None:
            return self._drop("return_no_flow")
        if len(data) - hlen > MAX_DATAGRAM:
            return self._drop("oversize")
        if src != flow.dest:
            cand = flow.candidate
            if cand is None or src != cand.dest:
                return self._drop("return_wrong_source")
            if not is_binding_success(data, hlen):
                return self._drop("return_unconfirmed")
            flow.last_seen = now
            self._repoint(flow, cand)
        elif not flow.established:
            if not is_binding_success(data, hlen):
                return self._drop("return_unconfirmed")
            flow.last_seen = now
            self._establish(flow)
        flow.last_seen = now
        if flow.via is not None:
            return ReturnToPeer(flow.via)
        return Deliver(flow.client, hlen, flow.stream)

    def _framed(
        self, index: dict[bytes, Flow], data: bytes
    ) -> tuple[Flow | None, int, ProxyHeader | None] | Drop:
        """The flow a framed datagram belongs to in `index` (keyed by exact header bytes),
        with the payload offset; a header with TLVs or another spelling is parsed and looked
        up in its canonical form."""
        hlen = plain_header_length(data)
        flow = index.get(data[:hlen]) if hlen else None
        if flow is not None:
            return flow, hlen, None
        try:
            hdr = parse_proxy_v2(data)
        except ProxyError as exc:
            return self._drop(exc.reason)
        canonical = build_proxy_v2(hdr.src, hdr.dst, stream=hdr.stream)
        return index.get(canonical), hdr.payload_offset, hdr

    def _establish(self, flow: Flow) -> None:
        self._unpend(flow)
        flow.established = True
        flow.established_at = flow.last_seen
        self._admit_established(flow)
        self.events.established.append(flow)

    def _repoint(self, flow: Flow, cand: Candidate) -> None:
        self._retoken(flow, cand.token)
        flow.dest, flow.candidate = cand.dest, None
        if flow.via is None:
            flow.header = cand.header
        if not flow.established:
            self._establish(flow)
        else:
            self.events.established.append(flow)  # the cache must learn the new token

    # -- revocation ----------------------------------------------------------------------------

    def _revocation_notice(
        self, src: Address, token: bytes, flow: Flow | None, now: float
    ) -> Decision:
        """A TOKEN_REVOKED notice came back: believe it only from where `token` routes (its
        transceiver, or the peer relay of its cluster), and pass it on to a first hop."""
        try:
            verified = verify_route_token(
                token, self.keys, now, max_age=self.limits.token_max_age, allow_dest=None
            )
        except TokenError:
            return self._drop("revocation_invalid")
        if verified.cluster == self.cluster:
            routes_to: Address | None = verified.dest
        else:
            routes_to = self.peers.get(verified.cluster)
        if routes_to != src:
            return self._drop("revocation_wrong_source")
        via = flow.via if flow is not None else None
        self.revoke(token, verified.issued_at + self.limits.token_max_age)
        return ReturnToPeer(via) if via is not None else CONSUMED

    def revoke(self, token: bytes, until: float) -> None:
        """Route `token` no more (until it would have expired anyway) and drop its flows."""
        if token not in self.revoked:
            while len(self.revoked) >= self.limits.max_revoked:
                del self.revoked[next(iter(self.revoked))]
            self.revoked[token] = until
            self.revocations += 1
        for flow in self.ledger.flows_of(token):
            self._remove(flow)

    # -- recovery from the flow cache --------------------------------------------------------

    def _recover_or_drop(
        self, client: Address, data: bytes, via: Address | None, now: float
    ) -> Decision:
        if not self.recovery:
            return self._drop("no_flow")
        held = self.recovering.get(client)
        if held is not None:
            if len(held) >= MAX_RECOVERY_BUFFER:
                return self._drop("recovery_buffer_full")
            held.append((data, via))
            return HELD
        neg = self._negative.get(client)
        if neg is not None and neg > now:
            return self._drop("no_flow")
        if len(self.recovering) >= self.limits.max_lookups_in_flight:
            return self._drop("recovery_busy")
        if not self._lookup_bucket.take(now):
            return self._drop("recovery_rate_limited")
        self.recovering[client] = [(data, via)]
        return Recover(client, via)

    def _replay(
        self, client: Address, held: list[tuple[bytes, Address | None]], now: float
    ) -> list[tuple[bytes, Decision]]:
        out: list[tuple[bytes, Decision]] = []
        for data, hop in held:
            if hop is None:
                out.append((data, self.on_client(client, data, now)))
            else:
                out.append((data, self.on_peer(hop, data, now)))
        return out

    def recovered(
        self, client: Address, token: bytes | None, now: float, *, negative: bool = True
    ) -> list[tuple[bytes, Decision]]:
        """The cache answered for `client` (`token` None: no entry; `negative=False`: the
        cache could not be asked, so do not remember the miss). Returns what to send."""
        held = self.recovering.pop(client, [])
        if token is None:
            if negative:
                self._negative[client] = now + self.limits.negative_ttl
            self.drops["no_flow"] += len(held)
            return []
        if not held:
            return []
        first, via = held[0]
        ingress = self.ingress_by_family.get(ip_family(client[0]), self.ingress)
        if via is not None:
            try:
                ingress = parse_proxy_v2(first).dst
            except ProxyError:
                return []
            exists = build_proxy_v2(client, ingress) in self.hop_flows
        else:
            exists = client in self.flows
        if not exists:  # (a Binding request may have re-created the flow meanwhile)
            route = self._route(token, client, via, ingress, now)
            if isinstance(route, Drop):
                self.drops[route.reason] += len(held) - 1
                return []
            dest, header = route
            flow = self._add(client, dest, token, header, via, ingress, now, established=True)
            flow.stored_at = now  # it came from the cache
            self.recoveries += 1
        return self._replay(client, held, now)

    # -- housekeeping ----------------------------------------------------------------------------

    def expire(self, now: float) -> int:
        """A whole sweep at once (tests, small tables); returns how many flows expired."""
        return self.sweep(now, budget=None)

    def sweep(self, now: float, budget: int | None) -> int:
        """Look at up to `budget` flows (None: all) for expiry and for a due cache refresh,
        resuming where the last call stopped, so a big table never stalls forwarding for
        a whole pass. Returns how many flows expired."""
        lim = self.limits
        if self._sweep is None:
            self._sweep = [
                *self.flows.values(),
                *self.tcp_flows.values(),
                *self.hop_flows.values(),
            ]
            self._sweep_pos = 0
            for client in [c for c, t in self._negative.items() if t <= now]:
                del self._negative[client]
            revoked = self.revoked
            while revoked and next(iter(revoked.values())) <= now:  # roughly oldest first
                del revoked[next(iter(revoked))]
            self._new_flow_limiter.prune(now)
        batch = self._sweep
        stop = len(batch) if budget is None else min(len(batch), self._sweep_pos + budget)
        expired = 0
        for flow in batch[self._sweep_pos : stop]:
            if not self._is_live(flow):
                continue
            if flow.established:
                if now - flow.last_seen > lim.idle_ttl:
                    self._remove(flow)
                    expired += 1
                    continue
                if now - flow.stored_at >= lim.store_refresh and flow.last_seen > flow.stored_at:
                    self._refresh_due.append(flow)
            elif now - flow.created > lim.pending_ttl:
                self._remove(flow)
                expired += 1
                continue
            cand = flow.candidate
            if cand is not None and now - cand.created > lim.pending_ttl:
                flow.candidate = None
        self._sweep_pos = stop
        if stop >= len(batch):
            self._sweep = None
        return expired

    def _is_live(self, flow: Flow) -> bool:
        if flow.via is None:
            return (self.tcp_flows if flow.stream else self.flows).get(flow.client) is flow
        return self.hop_flows.get(flow.header) is flow

    def due_for_store(self, now: float) -> list[Flow]:
        """Established flows the cache should (re)learn: new ones at once, and live ones the
        sweep found due (every `store_refresh` seconds while they carry traffic)."""
        due: list[Flow] = []
        for flow in (*self.events.established, *self._refresh_due):
            if (
                flow.established
                and not flow.stream  # a connection cannot be recovered; its flow is not kept
                and flow.stored_at != now
                and self._is_live(flow)
            ):
                flow.stored_at = now
                due.append(flow)
        self.events.established.clear()
        self._refresh_due.clear()
        return due

    def _drop(self, reason: str) -> Drop:
        self.drops[reason] += 1
        return Drop(reason)

    def count_drop(self, reason: str, n: int = 1) -> None:
        self.drops[reason] += n

    @property
    def size(self) -> int:
        return len(self.flows) + len(self.tcp_flows) + len(self.hop_flows)

    @property
    def established_count(self) -> int:
        return self.size - self.pending
