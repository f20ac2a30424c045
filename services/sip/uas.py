"""A SIP user agent server for trunks, sans-IO: transactions, dialogs, admission, bounds.

The edge answers calls from SIP trunks (RFC 3261). This class makes every SIP decision; the
Trio I/O around it (`server.py`) owns the socket, feeds it datagrams with the time, sends what
`datagrams_to_send()` returns, calls `handle_timer(now)` when `get_timer()` says, and reads
`next_event()` until None. The application (which agent, which media) answers what it is
told with `ring`, `answer`, `reject` and `hangup`. A call is known by its handle: our To tag.

What it owns:

* **admission**: a request is looked at only if its source address is in a trunk's
  allow-list (CIDRs); any other source gets 403, at most `FORBIDDEN_RATE` a second in all
  (past that, a counted drop: a spoofed flood must not turn us into a reflector). A trunk
  with a password (`Trunk.secret`) must also answer a Digest challenge on each INVITE that
  starts a call (`trunk_auth.py`): the challenge, and any refusal of the answer, are
  stateless, at most `AUTH_RATE` a second a source, and no bigger than the request;
* **server transactions** (§17.2): a retransmitted request is answered with the last
  response again and never reaches the application; an INVITE's non-2xx final response is
  retransmitted (Timer G) until its ACK or Timer H; a non-INVITE's is kept for Timer J;
* **dialogs** (§12, §13.3.1.4): our 2xx to an INVITE is retransmitted (T1 doubling to T2)
  until the ACK; without one in 64*T1 the call ends (`no_ack`) with a BYE. In-dialog
  requests are matched by Call-ID and tags (481 otherwise) and must raise the CSeq (500);
  BYE ends a call, CANCEL ends a ringing one (487 to its INVITE, §9.2), a re-INVITE or
  UPDATE is a new offer for the application (491 while one is pending, §14.2);
* **our requests**: BYE, REFER and UPDATE as client transactions (§17.1.2: Timer E
  retransmits, Timer F gives up), always to the address the trunk's requests come from
  (symmetric, like responses: never to a host a message names), on the transport its INVITE
  came on (`Outgoing.reliable`, §18.2.2); a 401/407 to one is answered once with the trunk's
  `Trunk.login` (§22.2); a REFER's outcome (its NOTIFYs, RFC 3515) is `CallTransferred`;
* **no state for what cannot change a call**: only a new INVITE (authenticated, when its
  trunk has a password), a CANCEL of one of our INVITE transactions and a request of a live
  dialog get a transaction; anything else is answered statelessly (§8.2.7), over UDP at
  most `STATELESS_RATE` a second a source address and no bigger than the request;
* **bounds**: at most `Limits.transactions` live transactions, `Limits.per_source` from one
  source, `Limits.calls` calls; past them a new INVITE gets 503 and a request of a dialog is
  a counted drop. A call rings at most `Limits.ring_timeout` before it is given up (480).

Responses go to the source of the request (RFC 3581 symmetric response routing, whether or
not `rport` was asked), never to the Via's sent-by. Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import ipaddress
import itertools
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from firsthop.services.sip.trunk_auth import OFFERED, TrunkAuth, TrunkSecret, Verdict
from firsthop.shared.ratelimit import KeyedLimiter, TokenBucket
from firsthop.shared.wire import sip, sip_digest
from firsthop.shared.wire.sip import SipRequest, SipResponse

if TYPE_CHECKING:  # (shared.address imports socket, for its resolver)
    from firsthop.shared.address import Address

T1, T2, T4 = 0.5, 4.0, 5.0  # §17.1.1.1
TIMEOUT = 64 * T1  # Timers B, F, H and J (UDP), and the 2xx's retransmission (§13.3.1.4)
TRANSFER_TIMEOUT = 180.0  # s: a REFER's outcome not told by then (the target rang on): failed
FORBIDDEN_RATE, FORBIDDEN_BURST = 20.0, 40.0  # 403s a second to sources of no trunk
STATELESS_RATE, STATELESS_BURST = 50.0, 100.0  # other stateless answers, a source, over UDP
SOURCES = 4096  # source addresses whose answers are paced (the least recently heard go)
AUTH_RATE, AUTH_BURST = 50.0, 100.0  # answers a second to INVITEs not authenticated, a source
# (each no bigger than its INVITE; a budget of its own, which other stateless answers of the
# same address cannot spend)
EVENTS = 4096  # events waiting for the application; past that the oldest are dropped
ALLOW = "INVITE, ACK, CANCEL, BYE, OPTIONS, UPDATE, INFO"
KNOWN = {"REGISTER", "SUBSCRIBE", "NOTIFY", "PUBLISH", "MESSAGE", "REFER", "PRACK", "INFO"}
ENDED = {"bye", "cancel", "no_ack", "rejected", "hangup", "ring_timeout", "session_expired"}
MIN_SE = 90  # s: the shortest session interval we take (RFC 4028 §4: at least 90)
MAX_SE = 7200  # s: the longest; a longer one is answered with this (RFC 4028 §9 lets a UAS)
# The short reason phrases (§21) a stateless answer falls back to when it must shrink to fit
PHRASES = {
    200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
    405: "Not Allowed", 481: "No Such Call", 483: "Too Many Hops", 501: "Not Implemented",
    503: "Unavailable", 513: "Too Large",
}  # fmt: skip
REFUSALS = {  # a Digest answer that is no new challenge's business
    Verdict.FAILED: (403, "Forbidden"),
    Verdict.MALFORMED: (400, "Bad Authorization"),
    Verdict.FULL: (503, "Service Unavailable"),
}
HEAP_SLACK = 4  # timer entries kept per live transaction or call before stale ones go


@dataclass(frozen=True)
class Trunk:
    name: str
    networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]
    secret: TrunkSecret | None = None  # its INVITEs must answer a Digest challenge
    login: TrunkSecret | None = None  # what our requests answer its challenges with

    @classmethod
    def of(
        cls,
        name: str,
        cidrs: Sequence[str],
        secret: TrunkSecret | None = None,
        login: TrunkSecret | None = None,
    ) -> Trunk:
        networks = tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)
        return cls(name, networks, secret, login)


@dataclass(frozen=True)
class Limits:
    # A transaction is kept 32 s after its answer (Timers H, J): a trunk placing 10 calls a
    # second from one address has some 700 live (INVITE, ACK-less BYE, OPTIONS pings).
    transactions: int = 20_000
    per_source: int = 2_000
    calls: int = 1000
    ring_timeout: float = 60.0


class Outgoing(NamedTuple):
    """A message to send: `reliable`, on the connection `dest` holds with us (none: drop it,
    never UDP); else as a UDP datagram."""

    data: bytes
    dest: Address
    reliable: bool


# -- events (past-tense facts for the application) ------------------------------------------


@dataclass(frozen=True)
class CallOffered:
    """A new call: answer it (`ring`, `answer`) or `reject` it. `request` is its INVITE
    (the offer is its body; the Request-URI's user names what was called)."""

    call: str
    trunk: str
    request: SipRequest
    source: Address


@dataclass(frozen=True)
class CallConfirmed:
    """The trunk acknowledged our 2xx: the call is up."""

    call: str


@dataclass(frozen=True)
class CallReoffered:
    """A re-INVITE or UPDATE in the call (hold, resume, a codec change): `answer` or
    `reject` it. `request.body` is the new offer (empty: we are to offer)."""

    call: str
    request: SipRequest


@dataclass(frozen=True)
class CallEnded:
    call: str
    reason: str  # one of ENDED


@dataclass(frozen=True)
class CallTransferred:
    """What became of the transfer we last asked for in the call (`refer`): `status` is the
    final status the trunk reported, its NOTIFY's (RFC 3515 §2.4.5: the target's answer, as
    a `message/sipfrag`), or the REFER's own when it refused it; 487 when its subscription
    ended with no final status, 408 when the REFER went unanswered or no outcome came within
    `TRANSFER_TIMEOUT`. A 2xx: the caller reached the target (the trunk's BYE ends our leg
    next); anything else: the transfer failed and the call goes on. A REFER sent while an
    earlier one's outcome is not known replaces it: only the latest is told."""

    call: str
    status: int


SipEvent = CallOffered | CallConfirmed | CallReoffered | CallEnded | CallTransferred


# -- state --------------------------------------------------------------------------------


@dataclass(eq=False)
class _Timed:
    deadline: float | None = field(default=None, init=False)


@dataclass(eq=False)
class _ServerTx(_Timed):
    """§17.2: one request and our answers to it, for its retransmissions."""

    key: tuple[str, str, str]
    request: SipRequest
    source: Address
    call: _Call | None = None
    final: bytes | None = None  # the final response, for retransmissions
    provisional: bytes | None = None  # the last 1xx, likewise
    done_at: float = 0.0  # Timer H/J: when it is forgotten
    retransmit: float = 0.0  # Timer G's interval (an INVITE's non-2xx)
    acked: bool = False
    failed: bool = False  # its final answer is a non-2xx (Timer G until the ACK)
    reliable: bool = False  # it came over TCP or TLS: no Timer G (§17.2.1)


@dataclass(eq=False)
class _ClientTx(_Timed):
    """§17.1.2: a request of ours (BYE, REFER, UPDATE), retransmitted until answered."""

    branch: str
    data: bytes
    dest: Address
    method: str
    dialog: _Call  # the call it is in (its trunk's answer alone settles it)
    cseq: int
    extra: tuple[tuple[str, str], ...] = ()  # its own fields (Refer-To, ...)
    answers: int = 0  # challenges it answers already (one of each kind; once more if `stale`)
    credentials: tuple[tuple[str, str], ...] = ()  # its (Proxy-)Authorization fields
    interval: float = T1
    give_up_at: float = 0.0
    reliable: bool = False  # over TCP or TLS: no Timer E, only Timer F (§17.1.2.2)


@dataclass(eq=False)
class _Transfer(_Timed):
    """A REFER of ours whose outcome is not known yet; told failed (408) at its deadline."""

    call: str
    cseq: int  # its REFER's: what a NOTIFY's `Event: refer;id=` names (RFC 3515 §2.4.6)


@dataclass(eq=False)
class _Call(_Timed):
    tag: str  # ours: the call's handle
    call_id: str
    remote_tag: str
    trunk: str
    source: Address  # where the trunk's signaling comes from; everything goes back there
    invite: _ServerTx
    local_uri: str  # the INVITE's To (without our tag)
    remote_uri: str  # its From (with their tag)
    remote_target: str  # its Contact's URI (the Request-URI of our BYE)
    route: tuple[str, ...]  # its Record-Route, in order (§12.1.1)
    remote_cseq: int
    local_cseq: int = 0
    state: str = "ringing"  # ringing, answering (2xx sent), up, closing, ended
    ok: bytes | None = None  # our 2xx, retransmitted until the ACK
    ok_interval: float = T1
    ok_give_up: float = 0.0
    ring_until: float = 0.0
    reoffer: _ServerTx | None = None  # a re-INVITE or UPDATE waiting for our answer
    reoffer_ok: bytes | None = None  # our 2xx to a re-INVITE, until its ACK
    rang: bool = False
    transport: str = "UDP"  # its INVITE's (our requests in its dialog go the same way)
    interval: int = 0  # RFC 4028 session interval, s (0: no session timer)
    refresher: str = "uac"  # who refreshes: "uac" (the trunk) or "uas" (we do, by UPDATE)
    timer_supported: bool = False  # the trunk said `Supported: timer` (our 2xx then requires it)
    transfer: _Transfer | None = None  # our latest REFER, while its outcome is not known


class SipUas:
    def __init__(
        self,
        *,
        trunks: Sequence[Trunk],
        contact: str,
        token: Callable[[], str],
        now: float,
        limits: Limits = Limits(),
        counters: Counter[str] | None = None,
        wall_offset: float = 0.0,
        auth_algorithms: Sequence[str] = OFFERED,
    ) -> None:
        self.trunks = list(trunks)
        self._login = {t.name: t.login for t in self.trunks if t.login is not None}
        self.auth = TrunkAuth(
            {t.name: t.secret for t in self.trunks if t.secret is not None},
            capacity=limits.transactions,
            algorithms=auth_algorithms,
        )
        self.wall_offset = wall_offset  # the wall clock minus `now` (for Digest nonces)
        # stateless answers over UDP, per source address (a forger spending one address's
        # budget cannot silence another address of the trunk)
        self._quiet = KeyedLimiter(
            STATELESS_RATE, STATELESS_BURST, max_keys=SOURCES, when_full="evict"
        )
        self._size: int | None = None  # the UDP message being handled's (None: a connection's)
        self._auth_replies = KeyedLimiter(  # (challenges, per source address too)
            AUTH_RATE, AUTH_BURST, max_keys=SOURCES, when_full="evict"
        )
        self.contact = contact  # our Contact URI, e.g. sip:firsthop@203.0.113.5:5060
        self.token = token  # random tags and branches (injected)
        self._tag_key = self.token().encode()  # (the To tags of stateless answers)
        self.limits = limits
        self.counters: Counter[str] = Counter() if counters is None else counters  # `sip_*`
        self._forbidden = TokenBucket(FORBIDDEN_RATE, FORBIDDEN_BURST, now)
        self._server: dict[tuple[str, str, str], _ServerTx] = {}
        self._client: dict[str, _ClientTx] = {}
        self._per_source: Counter[str] = Counter()
        self._calls: dict[str, _Call] = {}  # by our tag
        self._dialogs: dict[tuple[str, str], _Call] = {}  # (Call-ID, our tag)
        self._out: list[Outgoing] = []
        self._events: deque[SipEvent] = deque()
        self._heap: list[tuple[float, int, _Timed]] = []
        self._seq = itertools.count()
        self._now = now  # of the datagram being handled

    # -- the I/O side's interface --------------------------------------------------------------

    def receive_datagram(
        self, data: bytes, source: Address, now: float, reliable: bool = False
    ) -> None:
        """One message from `source`; `reliable`: it came on a TCP or TLS connection (whose
        handshake proved the address: its stateless answers are neither paced nor bound to
        its size)."""
        self._now = now
        self._size = None if reliable else len(data)
        trunk = self.trunk_of(source[0])
        try:
            message = sip.parse_sip(data)
        except sip.SipError as exc:
            self.counters[exc.reason] += 1
            salvaged = sip.salvage_request(data) if trunk is not None else None
            if trunk is not None and salvaged is not None and salvaged.method != "ACK":
                status = 513 if isinstance(exc, sip.SipTooLarge) else 400
                self._stateless(salvaged, source, trunk, status, str(exc)[:100])
            return
        if isinstance(message, SipResponse):
            if trunk is not None:
                self._on_response(message, trunk)
            else:
                self.counters["sip_dropped_not_trunk"] += 1
            return
        try:
            message.check()
        except sip.SipError as exc:
            self.counters[exc.reason] += 1
            if trunk is not None and message.method != "ACK":  # (not to too many Vias)
                self._stateless(message, source, trunk, 400, str(exc)[:100])
            return
        if trunk is None:
            self._refuse_stranger(message, source, now, len(data))
            return
        self._on_request(message, source, trunk, now)

    def datagrams_to_send(self) -> list[Outgoing]:
        """What to send, each on the transport its transaction's request came on (§18.2.2):
        a connection's, or UDP (the same address may have both)."""
        out, self._out = self._out, []
        return out

    def next_event(self) -> SipEvent | None:
        return self._events.popleft() if self._events else None

    def get_timer(self) -> float | None:
        heap = self._heap
        while heap and heap[0][2].deadline != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def handle_timer(self, now: float) -> None:
        self._now = now
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, _, item = heapq.heappop(heap)
            if item.deadline != when:
                continue  # rescheduled or done since
            item.deadline = None
            if isinstance(item, _ServerTx):
                self._server_timer(item, now)
            elif isinstance(item, _ClientTx):
                self._client_timer(item, now)
            elif isinstance(item, _Call):
                self._call_timer(item, now)
            elif isinstance(item, _Transfer):
                self._transferred(item.call, item.cseq, 408)  # (no outcome came in time)

    def carries_calls(self, source: Address) -> bool:
        """Whether a live call's signaling comes from `source` (a connection to keep)."""
        return any(c.source == source for c in self._calls.values())

    def trunk_of(self, host: str) -> str | None:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return None
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        for trunk in self.trunks:
            if any(address in network for network in trunk.networks):
                return trunk.name
        return None

    @property
    def calls(self) -> int:
        return len(self._calls)

    @property
    def transactions(self) -> int:
        return len(self._server) + len(self._client)

    # -- the application's answers ------------------------------------------------------------

    def ring(self, call: str) -> None:
        """180 Ringing, once, while the call rings."""
        c = self._calls.get(call)
        if c is None or c.state != "ringing" or c.rang:
            return
        c.rang = True
        self._provisional(c.invite, 180, "Ringing")

    def answer(self, call: str, sdp: bytes, now: float) -> bool:
        """200 OK with `sdp` to the ringing call's INVITE, or to its pending re-offer."""
        self._now = now
        c = self._calls.get(call)
        if c is None:
            return False
        if c.state == "ringing":
            c.state = "answering"
            c.ok = self._final_bytes(c.invite, 200, "OK", sdp, c.tag, _timer_headers(c))
            c.invite.final = c.ok
            self._send(c.ok, c.source, c.invite.reliable)
            c.ok_interval, c.ok_give_up = T1, now + TIMEOUT
            self._arm(c, now + T1)
            self._forget_server(c.invite, now + TIMEOUT)  # its retransmits: answered with ok
            return True
        tx = c.reoffer
        if tx is None or c.state == "ended":
            return False
        c.reoffer = None
        refreshed = _session_timer(tx.request)  # a refresh (RFC 4028 §9): its interval now
        if c.interval and refreshed is not None and refreshed[0] >= MIN_SE:
            c.interval = min(refreshed[0], MAX_SE)
        data = self._final_bytes(tx, 200, "OK", sdp, c.tag, _timer_headers(c))
        tx.final = data
        self._send(data, tx.source, tx.reliable)
        if c.interval and c.state == "up":
            self._arm_session(c, now)
        if tx.request.method == "INVITE":
            c.reoffer_ok = data  # the ACK ends it; its retransmits are answered from `tx`
        self._forget_server(tx, now + TIMEOUT)
        return True

    def reject(self, call: str, status: int, reason: str, now: float) -> bool:
        """A final non-2xx (`status` 300-699) to the ringing call's INVITE (the call ends), or
        to its pending re-offer (the call goes on as it was)."""
        self._now = now
        c = self._calls.get(call)
        if c is None or not 300 <= status <= 699:
            return False
        if c.state == "ringing":
            self._fail_invite(c.invite, status, reason, now)
            self._end(c, "rejected")
            return True
        tx = c.reoffer
        if tx is None:
            return False
        c.reoffer = None
        if tx.request.method == "INVITE":
            self._fail_invite(tx, status, reason, now)
        else:
            tx.final = self._final_bytes(tx, status, reason, b"", c.tag)
            self._send(tx.final, tx.source, tx.reliable)
            self._forget_server(tx, now + TIMEOUT)
        return True

    def hangup(self, call: str, now: float) -> bool:
        """End the call from our side: 480 if it still rings, else a BYE."""
        self._now = now
        c = self._calls.get(call)
        if c is None or c.state == "ended":
            return False
        if c.state == "ringing":
            self._fail_invite(c.invite, 480, "Temporarily Unavailable", now)
        elif c.state == "answering":  # §15: no BYE before the ACK (or its timeout)
            self._end(c, "hangup")
            c.state = "closing"
            self._dialogs[(c.call_id, c.tag)] = c
            self._arm(c, c.ok_give_up)
            return True
        elif c.state == "up":
            self._bye(c, now)
        self._end(c, "hangup")
        return True

    # -- requests -----------------------------------------------------------------------------

    def _on_request(self, request: SipRequest, source: Address, trunk: str, now: float) -> None:
        via = sip.parse_via(request.vias()[0])
        sent_by = f"{via.host}:{via.port or 5060}"
        method = request.method
        if method == "ACK":
            self._on_ack(request, via.branch, sent_by, trunk, source)
            return
        key = (via.branch, sent_by, method)
        tx = self._server.get(key)
        if tx is not None and (tx.source != source or tx.reliable != (self._size is None)):
            # another address's transaction (another trunk's, or another host of this one's),
            # or the same address's on the other transport (UDP forges a connection's): its
            # answer (our SDP, an SDES key) is not this one's, its retransmissions come from
            # where, and the way, it did
            self.counters["sip_not_dialog_peer"] += 1
            return
        if tx is not None:  # a retransmission: the last answer again, nothing else (§17.2)
            self.counters["sip_retransmissions_absorbed"] += 1
            again = tx.final or tx.provisional
            if again is not None:
                self._send(again, source, self._size is None)  # (as this one came)
            return
        self.counters[f"sip_requests_{method.lower() if method in ALLOW else 'other'}"] += 1
        forwards = request.get("max-forwards")
        if forwards is not None and int(forwards) == 0:
            self._stateless(request, source, trunk, 483, "Too Many Hops")
            return
        # Only what can change a call gets a transaction: a new INVITE (its answer, when the
        # trunk has a password), a CANCEL of one of our INVITE transactions, a request of a
        # live dialog. Anything else is answered statelessly (§8.2.7), paced and no bigger
        # than itself over UDP: a host forging a trunk's address leaves no state behind.
        to_tag = sip.parse_name_addr(request.get("to") or "").tag
        invite: _ServerTx | None = None
        call: _Call | None = None
        if method == "INVITE" and to_tag is None:
            if self.auth.protects(trunk) and not self._authenticated(request, source, trunk, now):
                return
        elif method == "CANCEL":
            invite = self._server.get((via.branch, sent_by, "INVITE"))
            if invite is None or invite.source[0] != source[0]:  # (§9.1: where it came from)
                self._stateless(request, source, trunk, 481, "Call/Transaction Does Not Exist")
                return
        elif to_tag is not None:
            call = self._dialog_of(request, to_tag, trunk)
            if call is None:
                self._stateless(request, source, trunk, 481, "Call/Transaction Does Not Exist")
                return
        else:
            self._out_of_dialog(request, source, trunk)
            return
        if invite is None and (  # (a CANCEL is bound by its INVITE's transaction: let in)
            len(self._server) >= self.limits.transactions
            or self._per_source[source[0]] >= self.limits.per_source
        ):
            self.counters["sip_dropped_over_limit"] += 1
            if method == "INVITE":  # (stateless: a trunk tries another edge, or later)
                self._stateless(request, source, trunk, 503, "Service Unavailable")
            return
        # (Timer G: what it came on, not what its Via claims)
        tx = _ServerTx(key, request, source, reliable=self._size is None)
        self._server[key] = tx
        self._per_source[source[0]] += 1
        if invite is not None:
            self._on_cancel(tx, invite, now)
        elif call is not None:
            self._in_dialog(tx, call, now)
        else:
            self._on_invite(tx, trunk, now)

    def _out_of_dialog(self, request: SipRequest, source: Address, trunk: str) -> None:
        """A request that names no dialog and starts none: answered, statelessly."""
        method = request.method
        allow = [("Allow", ALLOW)]
        if method == "OPTIONS":  # (its optional fields go first if the answer must shrink)
            allow.append(("Accept", "application/sdp"))
            self._stateless(request, source, trunk, 200, "OK", allow, optional=2)
        elif method in ("BYE", "UPDATE", "INFO"):
            self._stateless(request, source, trunk, 481, "Call/Transaction Does Not Exist")
        elif method in KNOWN:  # (§21.4.6: a 405 carries Allow)
            self._stateless(request, source, trunk, 405, "Method Not Allowed", allow)
        else:
            self._stateless(request, source, trunk, 501, "Not Implemented", allow)

    def _stateless(
        self,
        request: SipRequest,
        source: Address,
        trunk: str,
        status: int,
        reason: str,
        headers: list[tuple[str, str]] | None = None,
        optional: int = 0,
    ) -> None:
        """A stateless answer to a trunk's request: over UDP at most `STATELESS_RATE` a
        second a source address (past that, `sip_replies_paced`) and no bigger than the
        request."""
        if self._size is not None and not self._quiet.take(source[0], self._now):
            self.counters["sip_replies_paced"] += 1
            return
        self._reply(request, source, status, reason, self._size, headers, optional)

    def _on_invite(self, tx: _ServerTx, trunk: str, now: float) -> None:
        request = tx.request
        unsupported = [o for o in request.get_all("require") if o.lower() != "timer"]
        if unsupported:
            self._fail_invite(
                tx, 420, "Bad Extension", now, [("Unsupported", ", ".join(unsupported)[:200])]
            )
            return
        if len(self._calls) >= self.limits.calls:
            self.counters["sip_calls_refused_full"] += 1
            self._fail_invite(tx, 503, "Service Unavailable", now, [("Retry-After", "5")])
            return
        contacts = request.get_all("contact")
        try:
            target = sip.parse_name_addr(contacts[0]).uri if contacts else ""
            remote = sip.parse_name_addr(request.get("from") or "")
        except sip.SipError:
            target = ""
        if not contacts or not target or remote.tag is None:
            self._fail_invite(tx, 400, "INVITE needs a Contact and a From tag", now)
            return
        timer = _session_timer(request)
        if timer is not None and 0 < timer[0] < MIN_SE:  # RFC 4028 §8.1
            self._fail_invite(tx, 422, "Session Interval Too Small", now, [("Min-SE", str(MIN_SE))])
            return
        tag = self.token()
        call = _Call(
            tag=tag,
            call_id=request.call_id,
            remote_tag=remote.tag,
            trunk=trunk,
            source=tx.source,
            invite=tx,
            local_uri=request.get("to") or "",
            remote_uri=request.get("from") or "",
            remote_target=target,
            route=tuple(request.get_all("record-route")),
            remote_cseq=request.cseq,
            ring_until=now + self.limits.ring_timeout,
            transport=sip.parse_via(request.vias()[0]).transport,
        )
        if timer is not None:
            call.interval, call.refresher = min(timer[0], MAX_SE), timer[1] or "uac"
            call.timer_supported = "timer" in [o.lower() for o in request.get_all("supported")]
        tx.call = call
        self._calls[tag] = call
        self._dialogs[(call.call_id, tag)] = call
        self._arm(call, call.ring_until)
        self._provisional(tx, 100, "Trying")
        self._emit(CallOffered(tag, trunk, request, tx.source))

    def _authenticated(self, request: SipRequest, source: Address, trunk: str, now: float) -> bool:
        """Whether the INVITE answers the trunk's challenge; if not, a stateless 401 (a new
        challenge), 403, 400 or 503, paced and no bigger than the request (a forged source
        must not make us a reflector toward the trunk)."""
        wall = now + self.wall_offset
        verdict = self.auth.check(
            trunk, request.method, request.uri, request.get("authorization"), source[0], wall
        )
        self.counters[f"sip_auth_{verdict.value}"] += 1
        if verdict is Verdict.OK:
            return True
        if not self._auth_replies.take(source[0], now):
            self.counters["sip_auth_unanswered"] += 1
            return False
        refusal = REFUSALS.get(verdict)
        if refusal is not None:
            sent = self._reply(request, source, *refusal, most=self._size)
        else:  # (no answer, or a stale or spent nonce: a new challenge)
            stale = verdict is Verdict.STALE
            headers = [
                ("WWW-Authenticate", value)
                for value in self.auth.challenges(trunk, source[0], wall, stale=stale)
            ]
            sent = self._reply(  # (the preferred challenges, as many as fit)
                request,
                source,
                401,
                "Unauthorized",
                most=self._size,
                headers=headers,
                optional=len(headers) - 1,
            )
        if not sent:
            self.counters["sip_auth_unanswered"] += 1
        return False

    def _on_cancel(self, tx: _ServerTx, invite: _ServerTx, now: float) -> None:
        """A CANCEL of `invite` (its branch and sent-by, from its address): a ringing call
        ends; a re-INVITE still waiting for the application's answer gets its 487 (§9.2) and
        the call goes on as it was."""
        self._complete(tx, 200, "OK", now)
        call = invite.call
        if call is not None and call.state == "ringing" and call.invite is invite:
            self._fail_invite(invite, 487, "Request Terminated", now)
            self._end(call, "cancel")
        elif call is not None and call.reoffer is invite and invite.final is None:
            self.reject(call.tag, 487, "Request Terminated", now)

    def _dialog_of(self, request: SipRequest, to_tag: str, trunk: str) -> _Call | None:
        """The live call a request names: its Call-ID, our tag and the peer's (§12: the
        three name a dialog), from the call's trunk (another trunk, or a forged From tag:
        None, and a 481)."""
        call = self._dialogs.get((request.call_id, to_tag))
        from_tag = sip.parse_name_addr(request.get("from") or "").tag
        if (
            call is None
            or call.state == "ended"
            or call.trunk != trunk
            or from_tag != call.remote_tag
        ):
            return None
        return call

    def _in_dialog(self, tx: _ServerTx, call: _Call, now: float) -> None:
        """A request of the dialog of `call` (`_dialog_of`)."""
        request = tx.request
        tx.call = call
        if request.cseq <= call.remote_cseq:  # §12.2.2
            self._complete(tx, 500, "CSeq Out of Order", now)
            return
        call.remote_cseq = request.cseq
        method = request.method
        if method == "BYE":
            self._complete(tx, 200, "OK", now)
            self._end(call, "bye")
        elif method in ("INVITE", "UPDATE"):
            if call.reoffer is not None or call.state != "up":
                self._complete_or_fail(tx, 491, "Request Pending", now)
                return
            call.reoffer = tx
            if method == "INVITE":
                self._provisional(tx, 100, "Trying")
            self._arm(tx, now + TIMEOUT)  # (unanswered by then, it is refused: `_server_timer`)
            self._emit(CallReoffered(call.tag, request))
        elif method in ("OPTIONS", "INFO", "NOTIFY"):  # (NOTIFY: a REFER's progress, RFC 3515)
            self._complete(tx, 200, "OK", now)
            if method == "NOTIFY" and call.transfer is not None:
                self._transfer_notified(call, call.transfer, request)
        else:
            self._complete(tx, 405, "Method Not Allowed", now, headers=[("Allow", ALLOW)])

    def _on_ack(
        self, request: SipRequest, branch: str, sent_by: str, trunk: str, source: Address
    ) -> None:
        invite = self._server.get((branch, sent_by, "INVITE"))
        if invite is not None and invite.failed:
            if invite.source[0] != source[0]:  # (its INVITE's transaction: from where it came)
                self.counters["sip_not_dialog_peer"] += 1
                return
            invite.acked = True  # the ACK of our non-2xx: same transaction (§17.2.1)
            return
        if invite is not None and self.trunk_of(invite.source[0]) != trunk:
            self.counters["sip_not_dialog_peer"] += 1  # (another trunk's call: not its ACK)
            return
        to_tag = sip.parse_name_addr(request.get("to") or "").tag
        call = self._dialogs.get((request.call_id, to_tag or ""))
        from_tag = sip.parse_name_addr(request.get("from") or "").tag
        if call is None or call.trunk != trunk or from_tag != call.remote_tag:
            self.counters["sip_ack_unmatched"] += 1
            return
        if call.state in ("answering", "closing") and request.cseq == call.invite.request.cseq:
            call.ok, call.deadline = None, None
            if call.state == "closing":  # hung up before the ACK: the BYE may go now (§15)
                self._bye(call, self._now)
                self._forget_call(call)
                return
            call.state = "up"
            if call.interval:
                self._arm_session(call, self._now)
            self._emit(CallConfirmed(call.tag))
        elif call.reoffer_ok is not None:
            call.reoffer_ok = None

    # -- responses to our requests --------------------------------------------------------------

    def _on_response(self, response: SipResponse, trunk: str) -> None:
        vias = response.vias()
        try:
            branch = sip.parse_via(vias[0]).branch if vias else ""
            cseq = sip.parse_cseq(response.get("cseq") or "")
        except sip.SipError:
            return
        tx = self._client.get(branch)
        if tx is None or tx.dialog.trunk != trunk or cseq != (tx.cseq, tx.method):
            self.counters["sip_response_unmatched"] += 1  # (§17.1.3: branch and CSeq method)
            return
        if response.status >= 200:
            tx.deadline = None
            del self._client[branch]
            if response.status in (401, 407) and self._answer_challenge(tx, response):
                return
            if tx.method == "REFER" and response.status < 300:
                self.counters["sip_refers_accepted"] += 1  # (under way: its NOTIFYs tell)
            elif tx.method == "REFER":
                self.counters["sip_refers_refused"] += 1
                self._transferred(tx.dialog.tag, tx.cseq, response.status)

    def _answer_challenge(self, tx: _ClientTx, response: SipResponse) -> bool:
        """Send `tx`'s request again with the trunk's `login` answering the challenge (§22.2:
        a new CSeq and branch, the first challenge we can answer, RFC 8760 §2.4, and the
        answers it carried to challenges of the other kind: a proxy's 407, then the trunk's
        401, §22.3); False, so the request is refused, if there is no login, no challenge
        we can answer, the request is no longer current (a REFER replaced since, a call that
        ended under an UPDATE or REFER), or it answers a challenge of that kind already (the
        login is wrong; unless the new one says `stale=true`, RFC 7616 §3.3, once)."""
        call, login = tx.dialog, self._login.get(tx.dialog.trunk)
        name = "www-authenticate" if response.status == 401 else "proxy-authenticate"
        field = "Authorization" if response.status == 401 else "Proxy-Authorization"
        kinds = {k for k, _ in tx.credentials}  # (one answer of each kind a request holds)
        challenge = None
        for value in (v for k, v in response.headers if k == name):
            try:
                challenge = sip_digest.parse_challenge(value)
                break
            except sip_digest.DigestError:
                continue
        transfer = call.transfer
        live = call.state == "up" and self._calls.get(call.tag) is call
        latest = tx.method != "REFER" or (transfer is not None and transfer.cseq == tx.cseq)
        current = tx.method == "BYE" or (live and latest)
        if (
            login is None
            or challenge is None
            or not current
            or (field in kinds and (not challenge.stale or tx.answers > len(kinds)))
            or len(self._client) >= self.limits.transactions
        ):
            self.counters["sip_challenges_unanswered"] += 1
            return False
        answer = sip_digest.answer(
            challenge, tx.method, call.remote_target, login.username, login.password, self.token()
        )
        credentials = (*((k, v) for k, v in tx.credentials if k != field), (field, answer))
        self._request(call, tx.method, self._now, list(tx.extra), credentials, tx.answers + 1)
        if tx.method == "REFER" and transfer is not None:
            transfer.cseq = call.local_cseq  # (its NOTIFYs name the REFER sent again)
        self.counters["sip_challenges_answered"] += 1
        return True

    # -- timers -------------------------------------------------------------------------------

    def _server_timer(self, tx: _ServerTx, now: float) -> None:
        call = tx.call
        if call is not None and call.reoffer is tx and tx.final is None:
            # A re-offer the application never answered: the trunk has given up on it by
            # now (Timer B); refused, so its transaction ends too (the call goes on).
            self.counters["sip_reoffers_unanswered"] += 1
            self.reject(call.tag, 500, "Server Internal Error", now)
            return
        if now >= tx.done_at:
            self._drop_server(tx)
            return
        if tx.retransmit and not tx.acked and tx.final is not None:  # Timer G
            self._send(tx.final, tx.source, tx.reliable)
            tx.retransmit = min(2 * tx.retransmit, T2)
            self._arm(tx, min(now + tx.retransmit, tx.done_at))
        else:
            self._arm(tx, tx.done_at)

    def _client_timer(self, tx: _ClientTx, now: float) -> None:
        if now >= tx.give_up_at:  # Timer F
            del self._client[tx.branch]
            self.counters["sip_requests_unanswered"] += 1
            if tx.method == "REFER":
                self._transferred(tx.dialog.tag, tx.cseq, 408)
            return
        self._send(tx.data, tx.dest, tx.reliable)  # Timer E
        tx.interval = min(2 * tx.interval, T2)
        self._arm(tx, min(now + tx.interval, tx.give_up_at))

    def _call_timer(self, call: _Call, now: float) -> None:
        if call.state == "up" and call.interval:
            if call.refresher == "uas":  # our turn (RFC 4028 §10): an UPDATE refreshes it
                self._request(call, "UPDATE", now, _timer_headers(call))
                self.counters["sip_session_refreshes_sent"] += 1
                self._arm_session(call, now)
            else:  # §10: no refresh came before the session expired: it is over
                self.counters["sip_session_expired"] += 1
                self._bye(call, now)
                self._end(call, "session_expired")
            return
        if call.state == "ringing":
            self.counters["sip_ring_timeouts"] += 1
            self._fail_invite(call.invite, 480, "Temporarily Unavailable", now)
            self._end(call, "ring_timeout")
        elif call.state == "closing":  # hung up, and no ACK came either
            self._bye(call, now)
            self._forget_call(call)
        elif call.state == "answering" and call.ok is not None:
            if now >= call.ok_give_up:  # §13.3.1.4: no ACK; the call is over
                self.counters["sip_no_ack"] += 1
                self._bye(call, now)
                self._end(call, "no_ack")
                return
            self._send(call.ok, call.source, call.invite.reliable)
            call.ok_interval = min(2 * call.ok_interval, T2)
            self._arm(call, min(now + call.ok_interval, call.ok_give_up))

    # -- helpers --------------------------------------------------------------------------------

    def _end(self, call: _Call, reason: str) -> None:
        if call.state == "ended":
            return
        if call.state == "closing":  # (hung up before the ACK: its end was told then)
            call.state = "ended"
            self._forget_call(call)
            return
        if call.invite.final is None:  # §15.1.2: a BYE in the early dialog; its INVITE gets 487
            self._fail_invite(call.invite, 487, "Request Terminated", self._now)
        call.state = "ended"
        self._forget_call(call)
        self.counters[f"sip_calls_ended_{reason}"] += 1
        self._emit(CallEnded(call.tag, reason))

    def _arm_session(self, call: _Call, now: float) -> None:
        """The session timer from `now` (RFC 4028 §10): the refresher refreshes at half the
        interval; the other side gives up at the interval less min(32, interval / 3)."""
        if call.refresher == "uas":
            self._arm(call, now + call.interval / 2)
        else:
            self._arm(call, now + call.interval - min(32.0, call.interval / 3))

    def _forget_call(self, call: _Call) -> None:
        call.ok, call.deadline = None, None
        if call.transfer is not None:
            call.transfer.deadline = None
        self._calls.pop(call.tag, None)
        self._dialogs.pop((call.call_id, call.tag), None)

    def refer(self, call: str, target: str, now: float) -> bool:
        """Transfer the caller (RFC 3515): a REFER in the call's dialog asking the trunk to
        call `target` (a sip:, sips: or tel: URI); the trunk then ends our leg with a BYE.
        False if the call is not up, or `target` is no such URI."""
        self._now = now
        c = self._calls.get(call)
        if c is None or c.state != "up" or not referable(target):
            return False
        if len(self._client) >= self.limits.transactions:  # (it could not be followed)
            self.counters["sip_refers_not_sent"] += 1
            return False
        self._request(
            c, "REFER", now, [("Refer-To", f"<{target}>"), ("Referred-By", f"<{self.contact}>")]
        )
        if c.transfer is not None:  # another still under way: only the latest is told
            c.transfer.deadline = None
        c.transfer = _Transfer(c.tag, c.local_cseq)
        self._arm(c.transfer, now + TRANSFER_TIMEOUT)
        self.counters["sip_refers_sent"] += 1
        return True

    def _transfer_notified(self, call: _Call, transfer: _Transfer, notify: SipRequest) -> None:
        """A NOTIFY in the call (RFC 3515 §2.4.4): the final status of the latest REFER's
        target, or its subscription ended without one (failed, 487)."""
        event, _, params = (notify.get("event") or "").partition(";")
        try:
            named = sip.parse_params(params).get("id")
        except sip.SipError:
            return
        if event.strip().lower() != "refer" or named not in (None, str(transfer.cseq)):
            return  # (another package's, or an earlier REFER's)
        status = sip.refer_notify_status(notify)
        state = (notify.get("subscription-state") or "").partition(";")[0].strip().lower()
        if status is not None and status >= 200:
            self._transferred(call.tag, transfer.cseq, status)
        elif state == "terminated":
            self._transferred(call.tag, transfer.cseq, 487)

    def _transferred(self, call: str, cseq: int, status: int) -> None:
        """The outcome of `call`'s REFER `cseq`, told once and only for its latest."""
        c = self._calls.get(call)
        if c is None or c.transfer is None or c.transfer.cseq != cseq:
            return
        c.transfer.deadline, c.transfer = None, None
        self.counters["sip_transfers_completed" if status < 300 else "sip_transfers_failed"] += 1
        self._emit(CallTransferred(call, status))

    def _bye(self, call: _Call, now: float) -> None:
        self._request(call, "BYE", now)

    def _request(
        self,
        call: _Call,
        method: str,
        now: float,
        extra: list[tuple[str, str]] | None = None,
        credentials: tuple[tuple[str, str], ...] = (),
        answers: int = 0,
    ) -> None:
        """A request of ours in `call`'s dialog, as a client transaction (Timer E, F), with
        its own fields `extra`; `credentials`: the fields answering challenges (a proxy's
        and the trunk's at most), after `answers` of them (not kept with `extra`: a next
        challenge gets new ones)."""
        call.local_cseq += 1
        branch = sip.BRANCH_COOKIE + self.token()
        local = call.local_uri if ";tag=" in call.local_uri else f"{call.local_uri};tag={call.tag}"
        host = self.contact.partition("@")[2] or self.contact.partition(":")[2]
        reliable = call.invite.reliable  # (where its INVITE came, not what its Via said)
        via = (call.transport if call.transport != "UDP" else "TCP") if reliable else "UDP"
        headers = [("Via", f"SIP/2.0/{via} {host};branch={branch};rport")]
        headers += [("Route", r) for r in call.route]
        headers += [
            ("Max-Forwards", "70"),
            ("From", local),
            ("To", call.remote_uri),
            ("Call-ID", call.call_id),
            ("CSeq", f"{call.local_cseq} {method}"),
            *(extra or []),
            *credentials,
        ]
        data = sip.request(method, call.remote_target, headers).encode()
        tx = _ClientTx(
            branch,
            data,
            call.source,
            method,
            call,
            call.local_cseq,
            tuple(extra or ()),
            answers,
            credentials,
            give_up_at=now + TIMEOUT,
            reliable=reliable,
        )
        if len(self._client) < self.limits.transactions:
            self._client[branch] = tx
            self._arm(tx, tx.give_up_at if reliable else now + T1)
        self._send(data, call.source, reliable)

    def _provisional(self, tx: _ServerTx, status: int, reason: str) -> None:
        tag = tx.call.tag if tx.call is not None and status > 100 else None
        headers = [("Contact", f"<{self.contact}>")] if tag else []
        response = sip.response_to(
            tx.request, status, reason, to_tag=tag, headers=headers, via_received=tx.source
        )
        tx.provisional = response.encode()
        self._send(tx.provisional, tx.source, tx.reliable)

    def _final_bytes(
        self,
        tx: _ServerTx,
        status: int,
        reason: str,
        sdp: bytes,
        tag: str | None,
        extra: list[tuple[str, str]] | None = None,
    ) -> bytes:
        headers = [("Contact", f"<{self.contact}>"), *(extra or [])]
        if status < 300 and tx.request.method == "INVITE":
            headers.append(("Allow", ALLOW))
        if sdp:
            headers.append(("Content-Type", "application/sdp"))
        return sip.response_to(
            tx.request,
            status,
            reason,
            to_tag=tag,
            headers=headers,
            body=sdp,
            via_received=tx.source,
        ).encode()

    def _response(
        self,
        tx: _ServerTx,
        status: int,
        reason: str,
        tag: str | None,
        headers: list[tuple[str, str]] | None,
    ) -> bytes:
        return sip.response_to(
            tx.request, status, reason, to_tag=tag, headers=headers or [], via_received=tx.source
        ).encode()

    def _fail_invite(
        self,
        tx: _ServerTx,
        status: int,
        reason: str,
        now: float,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        """A non-2xx final answer to an INVITE: retransmitted until its ACK (Timer G, H)."""
        tag = tx.call.tag if tx.call is not None else self.token()
        tx.final = self._response(tx, status, reason, tag, headers)
        tx.failed = True
        self._send(tx.final, tx.source, tx.reliable)
        tx.done_at = now + TIMEOUT
        if tx.reliable:  # (Timer H alone: the transport does not lose it)
            self._arm(tx, tx.done_at)
        else:
            tx.retransmit = T1
            self._arm(tx, now + T1)

    def _complete(
        self,
        tx: _ServerTx,
        status: int,
        reason: str,
        now: float,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        """A final answer to a non-INVITE request, kept for its retransmissions (Timer J)."""
        tag = tx.call.tag if tx.call is not None else (self.token() if status > 100 else None)
        tx.final = self._response(tx, status, reason, tag, headers)
        self._send(tx.final, tx.source, tx.reliable)
        self._forget_server(tx, now + TIMEOUT)

    def _complete_or_fail(self, tx: _ServerTx, status: int, reason: str, now: float) -> None:
        if tx.request.method == "INVITE":
            self._fail_invite(tx, status, reason, now)
        else:
            self._complete(tx, status, reason, now)

    def _forget_server(self, tx: _ServerTx, when: float) -> None:
        tx.done_at = when
        self._arm(tx, when)

    def _drop_server(self, tx: _ServerTx) -> None:
        if self._server.pop(tx.key, None) is not None:
            host = tx.source[0]
            self._per_source[host] -= 1
            if self._per_source[host] <= 0:
                del self._per_source[host]

    def _reply(
        self,
        request: SipRequest,
        source: Address,
        status: int,
        reason: str,
        most: int | None = None,
        headers: list[tuple[str, str]] | None = None,
        optional: int = 0,
    ) -> bool:
        """A stateless answer (no transaction kept): to a request we will not process. Not
        sent (False, counted) to a request with more Via values than a path has, or when it
        would be more than `most` bytes even without the last `optional` of `headers` (left
        out from the last to fit), with the status's short reason phrase instead of `reason`
        (`PHRASES`) and in compact form; a request it cannot be built for is a counted drop."""
        if len(request.vias()) > sip.MAX_HOPS:
            self.counters["sip_reply_not_sent"] += 1
            return False
        headers = headers or []
        # §8.2.7: a stateless UAS gives a request the same To tag each time it comes again
        vias = request.vias()
        what = "\n".join(
            [vias[0] if vias else "", request.get("call-id") or "", request.get("cseq") or ""]
        )
        tag = hmac.new(self._tag_key, what.encode(), hashlib.sha256).hexdigest()[:16]
        # to fit: the short reason phrase, then optional fields left out (the last first),
        # then the fields' compact names (§7.3.3)
        short = PHRASES.get(status, reason)
        tries = [(reason, 0, False), (short, 0, False)]
        tries += [(short, n, False) for n in range(1, optional + 1)] + [(short, optional, True)]
        for phrase, leave_out, compact in tries:
            try:
                response = sip.response_to(
                    request,
                    status,
                    phrase,
                    to_tag=tag,
                    headers=headers[: len(headers) - leave_out],
                    via_received=source,
                ).encode(compact)
            except sip.SipError:
                break
            if most is None or len(response) <= most:
                self._send(response, source, self._size is None)
                return True
        self.counters["sip_reply_not_sent"] += 1
        return False

    def _refuse_stranger(self, request: SipRequest, source: Address, now: float, size: int) -> None:
        """A 403, no bigger than the request (a spoofed source must not be a reflector),
        at most FORBIDDEN_RATE a second from all strangers together."""
        self.counters["sip_forbidden"] += 1
        if request.method == "ACK" or not self._forbidden.take(now):
            self.counters["sip_forbidden_unanswered"] += 1
        elif not self._reply(request, source, 403, "Forbidden", most=size):
            self.counters["sip_forbidden_unanswered"] += 1

    def _send(self, data: bytes, dest: Address, reliable: bool) -> None:
        self._out.append(Outgoing(data, dest, reliable))

    def _emit(self, event: SipEvent) -> None:
        if len(self._events) >= EVENTS:
            self._events.popleft()
            self.counters["sip_events_dropped"] += 1
        self._events.append(event)

    def _arm(self, item: _Timed, when: float) -> None:
        item.deadline = when
        heap = self._heap
        heapq.heappush(heap, (when, next(self._seq), item))
        live = len(self._server) + len(self._client) + len(self._calls)
        if len(heap) > HEAP_SLACK * live + 64:
            # Entries whose item was re-armed or is done leave only from the top; a call
            # refreshed every second would pile them up under a far deadline. Keep the live.
            heap[:] = [entry for entry in heap if entry[2].deadline == entry[0]]
            heapq.heapify(heap)


def referable(target: str) -> bool:
    """A transfer target we put in a Refer-To: a sip:, sips: or tel: URI, nothing that could
    break out of the header (no whitespace, quotes, angle brackets or line breaks), and no
    URI headers (`?Replaces=...`, `?P-Asserted-Identity=...`: RFC 3261 §19.1.1 lets them
    into the request the trunk then makes; since stop 42)."""
    scheme, _, rest = target.partition(":")
    return (
        scheme.lower() in ("sip", "sips", "tel")
        and 0 < len(rest) <= 256
        and target.isprintable()
        and not any(c in target for c in ' \t<>"?')
    )


def _session_timer(request: SipRequest) -> tuple[int, str | None] | None:
    """A request's `Session-Expires: delta[;refresher=uac|uas]` (RFC 4028 §4), or None."""
    value = request.get("session-expires")
    if value is None:
        return None
    delta, _, params = value.partition(";")
    delta = delta.strip()
    if not delta.isascii() or not delta.isdigit() or len(delta) > 9:
        return None
    try:
        refresher = sip.parse_params(params).get("refresher")
    except sip.SipError:
        return None
    return int(delta), refresher if refresher in ("uac", "uas") else None


def _timer_headers(call: _Call) -> list[tuple[str, str]]:
    """What a 2xx of a call with a session timer says (RFC 4028 §9)."""
    if not call.interval:
        return []
    headers = [("Session-Expires", f"{call.interval};refresher={call.refresher}")]
    if call.timer_supported:
        headers.append(("Require", "timer"))
    return headers
