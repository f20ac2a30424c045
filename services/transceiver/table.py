"""Every session of a transceiver, sans-IO: admission, credentials, routing, ICE, lifetimes.

The transceiver's decisions live here, the way a relay's live in `FlowTable`: the Trio and
asyncio code around it (`service.py`, `session.py`, `rtc/`) owns sockets, tasks and aiortc,
feeds this class datagrams and state changes with the time, and carries out the commands it
gets back. Nothing here does I/O or reads a clock, so every lifecycle path is unit-tested in
milliseconds with a fake one.

What it owns:

* **admission**: `credentials` mints a session's ICE ufrag (its signed route token) and
  password; `open` admits it, refused while draining or at capacity;
* **routing**: the `SessionMux` says which session a datagram is for; every STUN datagram
  then goes through that session's `LiteIce` (authentication, consent, path validation)
  before anything reaches aiortc;
* **lifetimes**: a session must connect within `setup_timeout`; once connected it lives as
  long as the caller's authenticated checks keep coming (`consent_timeout`, RFC 7675); a
  drain ends what is left when its grace runs out. `next_deadline()` says when to call
  `on_deadline(now)`, which returns what ended (`Ended`);
* **one source of truth for credentials**: a session's current ufrag and password are its
  `LiteIce.creds`; ICE restart (`restart_ice`) replaces them there and routes the new ufrag;
* **revocation**: a check for a ufrag no session holds, and every ufrag of a session that
  ends, produce TOKEN_REVOKED notices to the relays that carried them (`proxy_v2`). A
  session that had connected lingers `LINGER` seconds first: its caller's authenticated
  checks get a signed 403 "call ended" (`LiteIce.call_ended`), so the caller's ICE agent
  learns at its next check that the call is over (a browser's connection leaves
  "connected" then, not after ~5 s of checks nobody answers); no media reaches it. It is
  the fallback: the call's DTLS end (`rtc/dtls_hooks.closing_datagram`) has made a browser's
  connection fail already, within a round trip;
* **why sessions ended**, remembered for signaling (bounded), and which drained sessions'
  reasons nobody has read yet.

Commands and events are small frozen classes; a session is known to the I/O side by the
handle it gave `open` (generic: tests use plain objects).
"""

from __future__ import annotations

import heapq
import itertools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from firsthop.services.transceiver.ice_lite import (
    SILENT,
    Accepted,
    Credentials,
    LiteIce,
    PathValidated,
    Refused,
)
from firsthop.services.transceiver.mux import Delivery, SessionMux, Unrouted
from firsthop.shared.address import Address
from firsthop.shared.ratelimit import TokenBucket
from firsthop.shared.wire.demux import STUN_LAST
from firsthop.shared.wire.proxy_v2 import build_proxy_v2, revocation_tlv

H = TypeVar("H")
SETUP_TIMEOUT = 30.0  # offer to connected
CONSENT_TIMEOUT = 30.0  # RFC 7675 §5.1: no authenticated check for this long ends the call
# A phone call has no consent checks: no RTP or RTCP from its trunk for this long ends it
# (a held call still gets RTCP reports, RFC 3550 §6.2; SBCs' RTP timeouts are 30-300 s).
MEDIA_TIMEOUT = 60.0
ENDED_REMEMBERED = 10_000
NOTICE_INTERVAL = 1.0  # one TOKEN_REVOKED per (relay, token) per second, at most
MAX_NOTICES_REMEMBERED = 10_000
# An ended call's ufrags answer its caller's checks with 403 this long: a browser checks a
# stable pair every 2.5 s (libwebrtc's STABLE_WRITABLE_CONNECTION_PING_INTERVAL). (A fallback
# for callers the DTLS end did not tell: `rtc/dtls_hooks.closing_datagram`.)
LINGER = 3.0
MAX_LINGERING = 10_000  # and never more than the table's capacity
# Ufrags of earlier ICE restarts still routed to their session (a check of the previous one
# in flight); restarts are signaling's to limit (3, then one per 2 s), a call's memory ours.
MAX_OLD_UFRAGS = 2
# Datagrams a session's caller may have handled each second (media, and its authenticated
# checks): an audio call sends 50-100, its data channel in bursts; beyond is dropped and
# counted, so one caller cannot spend the thread every call on the process shares.
SESSION_RATE, SESSION_BURST = 1000.0, 2000.0


# -- commands (the I/O side carries them out) ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    """Put `data` on the shared socket toward `dest`."""

    data: bytes
    dest: Address


@dataclass(frozen=True, slots=True)
class ToMedia(Generic[H]):
    """DTLS, SRTP or RTCP from a validated client of the session; `elsewhere`: not from
    the session's media path (tell `media_authenticated` if it authenticates)."""

    handle: H
    payload: bytes
    client: Address
    elsewhere: bool = False


@dataclass(frozen=True, slots=True)
class PathChanged(Generic[H]):
    """The session's media now goes to `client`, which proved it is the caller."""

    handle: H
    client: Address


# -- events ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ended(Generic[H]):
    """The session is over (`reason`: setup_timeout, consent_expired, drain, ...); the I/O
    side tears it down, then calls `SessionTable.remove`."""

    handle: H
    reason: str


Command = Send | ToMedia[H] | PathChanged[H]


class Refusal(Exception):
    """`open` refused a session: `status` is the HTTP status to answer with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(eq=False)
class Entry(Generic[H]):
    session_id: str
    handle: H
    ice: LiteIce
    opened: float
    connected_at: float | None = None
    ended: str | None = None  # why, once it has ended
    old_ufrags: list[str] = field(default_factory=list)
    notices: list[Send] = field(default_factory=list)  # held while it lingers
    budget: TokenBucket = field(init=False)  # what its caller may send (`SESSION_RATE`)
    pinned: Address | None = None  # a phone call: its media's one address (no ICE)
    last_media: float = 0.0  # (a pinned session: when its media last came)

    def __post_init__(self) -> None:
        self.budget = TokenBucket(SESSION_RATE, SESSION_BURST, self.opened)

    @property
    def ufrags(self) -> list[str]:
        return [self.ice.creds.local_ufrag, *self.old_ufrags]


class SessionTable(Generic[H]):
    def __init__(
        self,
        *,
        mint_ufrag: Callable[[], str],
        mint_password: Callable[[], str],
        capacity: int = 200,
        accept_direct: bool = False,
        setup_timeout: float = SETUP_TIMEOUT,
        consent_timeout: float = CONSENT_TIMEOUT,
        media_timeout: float = MEDIA_TIMEOUT,
    ) -> None:
        self.mint_ufrag = mint_ufrag
        self.mint_password = mint_password
        self.capacity = capacity
        self.setup_timeout = setup_timeout
        self.consent_timeout = consent_timeout
        self.media_timeout = media_timeout
        self.mux: SessionMux[Entry[H]] = SessionMux(accept_direct=accept_direct)
        self.entries: dict[str, Entry[H]] = {}
        self.counters: Counter[str] = Counter()
        self.draining = False
        self.ended: dict[str, str] = {}  # session id -> why it ended, oldest first
        self._unread: set[str] = set()  # drained sessions whose end reason nobody asked
        self._drain_at: float | None = None
        # timers: (when, seq, session id, kind); stale ones are skipped when they come up
        self._timers: list[tuple[float, int, str, str]] = []
        self._seq = itertools.count()
        self._noticed: dict[tuple[Address, bytes], float] = {}
        self._lingering: dict[str, Entry[H]] = {}  # ended, answering checks with 403

    # -- admission --------------------------------------------------------------------------

    def credentials(self, remote_ufrag: str, remote_pwd: str) -> Credentials:
        """Fresh local credentials for a new session (or an ICE restart) of this caller."""
        return Credentials(self.mint_ufrag(), self.mint_password(), remote_ufrag, remote_pwd)

    def check_admission(self) -> None:
        """Raise `Refusal` if a new session would be refused now (before any work on it)."""
        if self.draining:
            raise Refusal(503, "transceiver is draining")
        if len(self.entries) >= self.capacity:
            raise Refusal(503, "transceiver at capacity")

    def open(self, now: float, session_id: str, handle: H, creds: Credentials) -> None:
        """Admit a session whose answer is built: its ufrag routes, its setup clock runs."""
        self.check_admission()
        entry = Entry(session_id, handle, LiteIce(creds), opened=now)
        self.entries[session_id] = entry
        self.mux.add_ufrag(creds.local_ufrag, entry)
        self._arm(now + self.setup_timeout, session_id, "setup")

    def open_pinned(
        self, now: float, session_id: str, handle: H, creds: Credentials, client: Address
    ) -> None:
        """Admit a phone call: no ICE, its media path is the trunk's address its offer
        named (`client`), as its relay frames it. Its checks would be refused (nobody knows
        its password); it lives while media comes (`media_timeout`, from now)."""
        self.check_admission()
        entry = Entry(session_id, handle, LiteIce(creds), opened=now, pinned=client)
        entry.connected_at = entry.last_media = now
        self.entries[session_id] = entry
        self.mux.add_ufrag(creds.local_ufrag, entry)  # (its relays are told of it at its end)
        self.mux.validated(entry, client)
        self._arm(now + self.media_timeout, session_id, "media")

    def __len__(self) -> int:
        return len(self.entries)

    def creds(self, session_id: str) -> Credentials:
        return self.entries[session_id].ice.creds

    def selected(self, session_id: str) -> Address | None:
        entry = self.entries.get(session_id)
        if entry is None:
            return None
        return entry.pinned or entry.ice.selected

    # -- datagrams ----------------------------------------------------------------------------

    def on_datagram(self, now: float, src: Address, data: bytes) -> Sequence[Command[H]]:
        """What to do with one datagram from the shared socket (nothing: dropped, counted)."""
        d = self.mux.on_datagram(src, data)
        if d is None:
            return ()
        if type(d) is Unrouted:
            return self._notice(now, d.ufrag, d.client, d.relay, d.ingress, d.stream)
        assert isinstance(d, Delivery)
        if d.session.session_id in self._lingering:
            return self._on_ended_check(now, d)
        if d.payload[0] > STUN_LAST:  # DTLS, SRTP, RTCP: from a validated client only
            if not d.session.budget.take(now):
                self.counters["session_rate_limited"] += 1
                return ()
            entry = d.session
            entry.last_media = now
            if d.client == entry.ice.selected or entry.pinned is not None:
                return (ToMedia(entry.handle, d.payload, d.client),)
            return (ToMedia(entry.handle, d.payload, d.client, elsewhere=True),)
        return self._on_stun(now, d)

    def media_heard(self, now: float, session_id: str) -> None:
        """A datagram of `ToMedia` from the media path authenticated (SRTP/SRTCP): the
        path carries the caller's media (what `LiteIce` judges its silence by)."""
        entry = self.entries.get(session_id)
        if entry is not None:
            entry.ice.media_heard(now)

    def media_authenticated(
        self, now: float, session_id: str, client: Address
    ) -> Sequence[Command[H]]:
        """A datagram of `ToMedia(elsewhere=True)` authenticated (SRTP/SRTCP: the caller's
        own, fresh): the caller's media comes from `client`, a proven address, and the media
        path may follow it there once it answers our check (`LiteIce.on_authentic_media`)."""
        entry = self.entries.get(session_id)
        if entry is None or entry.pinned is not None or session_id in self._lingering:
            return ()
        request = entry.ice.on_authentic_media(now, client)
        if request is None:
            return ()
        return self._validate(entry, client, request)

    def _on_stun(self, now: float, d: Delivery[Entry[H]]) -> Sequence[Command[H]]:
        entry, client, payload = d.session, d.client, d.payload
        ice = entry.ice
        if len(payload) < 2 or payload[0] & 0x01 or payload[1] & 0x10:
            # not a request (RFC 8489 §5: class bits 0x0110 of the type): our check's answer?
            outcome = ice.on_response(now, client, payload)
            if ice.probing() is None:
                self.mux.unexpect(entry)
            if isinstance(outcome, Refused):
                self.counters[outcome.reason] += 1
                return ()
            assert isinstance(outcome, PathValidated)
            self.mux.validated(entry, client)
            if outcome.cause is None:  # the caller's chosen path is alive: it keeps the media
                self.counters["path_validated_kept"] += 1
                return ()
            self.counters["path_moved"] += 1
            if outcome.cause != SILENT:
                self.counters[f"path_moved_{outcome.cause}"] += 1
            return (PathChanged(entry.handle, client),)
        verdict = ice.on_request(now, client, payload)
        if isinstance(verdict, Refused):
            self.counters[verdict.reason] += 1  # dropped unanswered
            return ()
        assert isinstance(verdict, Accepted)
        if not entry.budget.take(now):  # the caller's own checks: answered within its budget
            self.counters["session_rate_limited"] += 1
            return ()
        self.mux.note_route(entry, d)
        commands: list[Command[H]] = []
        for gone in ice.forgotten:
            self.mux.forget(entry, gone)
        ice.forgotten.clear()
        answer = self.frame_for(client, verdict.response)  # (the route was just noted)
        if answer is not None:
            commands.append(answer)
        if verdict.selects:
            self.mux.validated(entry, client)
            commands.append(PathChanged(entry.handle, client))  # DTLS may start
            if d.stream:  # the caller reached the relay over ICE-TCP (PROXY v2 STREAM)
                self.counters["ice_tcp_path_selected"] += 1
        if verdict.probe is not None:
            commands.extend(self._validate(entry, client, verdict.probe))
        return commands

    def _validate(self, entry: Entry[H], client: Address, request: bytes) -> Sequence[Send]:
        """Send our check `request` to `client` (its answer validates the path)."""
        self.mux.expect(entry, client)
        self.counters["path_validations"] += 1
        expires = entry.ice.next_deadline()
        if expires is not None:
            self._arm(expires, entry.session_id, "probe")
        probe = self.frame_for(client, request)
        return (probe,) if probe is not None else ()

    def _on_ended_check(self, now: float, d: Delivery[Entry[H]]) -> Sequence[Command[H]]:
        """A STUN message for a lingering session: an authenticated check is told the call
        ended (403, signed); anything else is dropped."""
        payload = d.payload
        if len(payload) < 2 or payload[0] & 0x01 or payload[1] & 0x10:
            self.counters["stun_unexpected"] += 1
            return ()
        verdict = d.session.ice.on_request(now, d.client, payload)
        if isinstance(verdict, Refused):
            self.counters[verdict.reason] += 1
            return ()
        answer = d.session.ice.call_ended(payload)
        self.counters["ended_checks_answered"] += 1
        if d.relay is None or d.ingress is None:
            return (Send(answer, d.client),)
        header = build_proxy_v2(d.ingress, d.client, stream=d.stream)  # an ICE-TCP caller too
        return (Send(header + answer, d.relay),)

    def frame_for(self, client: Address, payload: bytes) -> Send | None:
        """The datagram that carries `payload` to `client` (None: no route known)."""
        framed = self.mux.frame_for(client, payload)
        return Send(*framed) if framed is not None else None

    def _notice(
        self,
        now: float,
        token: bytes,
        client: Address,
        relay: Address | None,
        ingress: Address | None,
        stream: bool = False,
    ) -> Sequence[Command[H]]:
        """TOKEN_REVOKED to `relay` (at most once per `NOTICE_INTERVAL` per token and relay;
        a direct client is told nothing)."""
        if relay is None or ingress is None:
            return ()
        key = (relay, token)
        last = self._noticed.get(key)
        if last is not None and now - last < NOTICE_INTERVAL:
            return ()
        if len(self._noticed) >= MAX_NOTICES_REMEMBERED:
            self._noticed.clear()
        self._noticed[key] = now
        self.counters["revocations_sent"] += 1
        notice = build_proxy_v2(ingress, client, revocation_tlv(token), stream=stream)
        return (Send(notice, relay),)

    # -- what the session's connection says ------------------------------------------------------

    def connected(self, now: float, session_id: str) -> None:
        """ICE and DTLS are up: the setup clock stops, the consent clock starts."""
        entry = self.entries.get(session_id)
        if entry is not None and entry.connected_at is None and entry.ended is None:
            entry.connected_at = now
            self._arm(now + self.consent_timeout, session_id, "consent")

    def end(self, session_id: str, reason: str) -> Ended[H] | None:
        """End a session (DELETE, a failed connection, an agent that hung up...); None if it
        is unknown or already ending."""
        entry = self.entries.get(session_id)
        if entry is None or entry.ended is not None:
            return None
        entry.ended = reason
        return Ended(entry.handle, reason)

    def restart_ice(self, session_id: str, remote_ufrag: str, remote_pwd: str) -> Credentials:
        """ICE restart (RFC 8445 §9): new credentials both ways; the last `MAX_OLD_UFRAGS`
        old ufrags still route to the session (their checks no longer authenticate) until it
        ends."""
        entry = self.entries[session_id]
        creds = self.credentials(remote_ufrag, remote_pwd)
        entry.old_ufrags.append(entry.ice.creds.local_ufrag)
        if len(entry.old_ufrags) > MAX_OLD_UFRAGS:
            # Routed nowhere now: a relay still sending its checks here is told then (the
            # TOKEN_REVOKED any unknown ufrag gets), not all at the session's end.
            self.mux.remove_ufrag(entry.old_ufrags.pop(0))
        entry.ice.restart(creds)
        self.mux.add_ufrag(creds.local_ufrag, entry)
        return creds

    def remove(self, session_id: str, now: float | None = None) -> Sequence[Send]:
        """Forget a session the I/O side has torn down. Returns TOKEN_REVOKED notices for the
        relays that carried it, so they stop routing its tokens; given `now`, a session that
        had connected lingers first (`LINGER`; not while draining), and its notices come
        from `on_deadline` when that is over."""
        entry = self.entries.pop(session_id, None)
        if entry is None:
            return ()
        reason = entry.ended or "ended"
        entry.ended = reason
        self.ended[session_id] = reason
        while len(self.ended) > ENDED_REMEMBERED:
            oldest = next(iter(self.ended))
            del self.ended[oldest]
            self._unread.discard(oldest)
        self.counters[f"ended_{reason}"] += 1
        notices: list[Send] = []
        for client, route in self.mux.remove_session(entry, entry.ufrags):
            if route.relay is None or route.ingress is None:
                continue
            for ufrag in entry.ufrags:
                tlv = revocation_tlv(ufrag.encode())
                notice = build_proxy_v2(route.ingress, client, tlv, stream=route.stream)
                notices.append(Send(notice, route.relay))
        if now is None or entry.connected_at is None or self.draining:
            self.counters["revocations_sent"] += len(notices)
            return notices
        entry.notices = notices
        for ufrag in entry.ufrags:  # its checks still come here; its media no longer does
            self.mux.add_ufrag(ufrag, entry)
        self._lingering[session_id] = entry
        self._arm(now + LINGER, session_id, "linger")
        if len(self._lingering) > min(MAX_LINGERING, self.capacity):
            return self._unlinger(next(iter(self._lingering)))
        return ()

    def _unlinger(self, session_id: str) -> list[Send]:
        """A lingering session is over: its ufrags route nowhere, its relays are told."""
        entry = self._lingering.pop(session_id, None)
        if entry is None:
            return []
        for ufrag in entry.ufrags:
            if self.mux.by_ufrag.get(ufrag.encode()) is entry:
                self.mux.remove_ufrag(ufrag)
        self.counters["revocations_sent"] += len(entry.notices)
        notices, entry.notices = entry.notices, []
        return notices

    # -- drain ----------------------------------------------------------------------------------

    def drain(self, now: float, grace: float) -> None:
        """Admit no more sessions; those left when `grace` runs out end with `drain`."""
        self.draining = True
        at = now + grace
        if self._drain_at is None or at < self._drain_at:
            self._drain_at = at
            self._arm(at, "", "drain")

    def reason_read(self, session_id: str) -> None:
        """Someone (signaling's call watcher) has learnt why `session_id` ended."""
        self._unread.discard(session_id)

    @property
    def reasons_unread(self) -> int:
        return len(self._unread)

    # -- timers -----------------------------------------------------------------------------------

    def _arm(self, when: float, session_id: str, kind: str) -> None:
        heapq.heappush(self._timers, (when, next(self._seq), session_id, kind))

    def next_deadline(self) -> float | None:
        return self._timers[0][0] if self._timers else None

    def on_deadline(self, now: float) -> list[Ended[H] | Send]:
        """Everything due by `now`: what ended, in order, and the revocations of sessions
        that have lingered their time."""
        out: list[Ended[H] | Send] = []
        while self._timers and self._timers[0][0] <= now:
            _, _, session_id, kind = heapq.heappop(self._timers)
            if kind == "drain":
                out.extend(self._drain_due(now))
                continue
            if kind == "linger":
                out.extend(self._unlinger(session_id))
                continue
            entry = self.entries.get(session_id)
            if entry is None or entry.ended is not None:
                continue  # stale: the session is gone or going
            ended = self._due(now, entry, kind)
            if ended is not None:
                out.append(ended)
        return out

    def _due(self, now: float, entry: Entry[H], kind: str) -> Ended[H] | None:
        if kind == "setup":
            if entry.connected_at is not None:
                return None
            return self.end(entry.session_id, "setup_timeout")
        if kind == "consent":
            assert entry.connected_at is not None
            expires = max(entry.ice.last_check or 0.0, entry.connected_at) + self.consent_timeout
            if now < expires:  # refreshed since it was armed: look again then
                self._arm(expires, entry.session_id, "consent")
                return None
            return self.end(entry.session_id, "consent_expired")
        if kind == "media":
            expires = entry.last_media + self.media_timeout
            if now < expires:
                self._arm(expires, entry.session_id, "media")
                return None
            return self.end(entry.session_id, "media_timeout")
        if kind == "probe":
            lapsed = entry.ice.on_deadline(now)
            if lapsed is not None:
                self.counters[lapsed.reason] += 1
                self.mux.unexpect(entry)
            elif (later := entry.ice.next_deadline()) is not None:
                self._arm(later, entry.session_id, "probe")  # another validation since
        return None

    def _drain_due(self, now: float) -> list[Ended[H]]:
        if self._drain_at is None or now < self._drain_at:
            return []
        out = []
        for session_id in list(self.entries):
            ended = self.end(session_id, "drain")
            if ended is not None:
                self._unread.add(session_id)
                out.append(ended)
        return out
