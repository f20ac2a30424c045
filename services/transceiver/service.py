"""`firsthop transceiver`: every session of the process behind ONE shared UDP socket.

Trio owns the lifecycle: the media socket's receive loop, the internal API, the registry
heartbeat and every session are tasks in nurseries; aiortc runs on the asyncio host loop
behind `rtc.py`. The receive loop hands each datagram to the `SessionMux`; a STUN datagram
then goes through the session's `LiteIce` (authenticated, or dropped unanswered) before
aioice sees it, and DTLS/SRTP from a validated client straight to aiortc. Sessions send
through `send_to_client`, which frames the datagram to the relay that last delivered that
client's traffic.

When a check names a ufrag no session holds (its call ended), and when a session ends, the
relays that carried it are told with a TOKEN_REVOKED notice, so they stop routing the token
at once instead of for the rest of its hours-long lifetime (`services/relay/flow_table.py`).
"""

from __future__ import annotations

import base64
import logging
import os
import secrets
import socket
import time
from collections import Counter
from dataclasses import dataclass, field

import trio
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from services.transceiver.ice_lite import Credentials, PathValidated, Refused
from services.transceiver.mux import Delivery, SessionMux, Unrouted
from services.transceiver.rtc import watch_readable
from services.transceiver.session import Session
from shared.metrics import Histogram
from shared.sdp import check_offer, classify_candidate, mark_ice_lite, strip_candidates
from shared.telemetry import context_from_traceparent, traceparent_of, tracer
from shared.wire.proxy_v2 import build_proxy_v2, revocation_tlv
from shared.wire.route_token import encode_route_token, fresh_nonce

log = logging.getLogger("firsthop.transceiver")

Address = tuple[str, int]
RECV_BUFFER = 2048
DRAIN_BATCH = 64  # datagrams read per readiness callback before yielding to the loop
TRACER = tracer("firsthop.transceiver")
ENDED_REMEMBERED = 10_000
SETUP_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
END_REASON_GRACE = 5.0  # after a drain, how long signaling may take to read why calls ended
ANSWER_FLUSH = 0.5  # time for an answer in flight to leave before the API goes down
NOTICE_INTERVAL = 1.0  # one TOKEN_REVOKED per (relay, token) per second, at most
MAX_NOTICES_REMEMBERED = 10_000


@dataclass
class TransceiverConfig:
    media: Address = ("0.0.0.0", 5004)
    api: Address = ("0.0.0.0", 8081)
    id: str = "tx-1"
    region: str = "local"
    cluster: int = 1
    keys: dict[int, bytes] = field(default_factory=dict)
    key_id: int = 1
    redis: str | None = None
    agent_url: str | None = None
    advertise_media: Address | None = None
    accept_direct: bool = False
    capacity: int = 200
    deny_candidate_cidr: list[str] = field(default_factory=list)
    internal_token: str | None = None
    drain_seconds: float = 3600.0
    consent_timeout: float = 30.0  # RFC 7675 §5.1

    @property
    def advertised(self) -> Address:
        return self.advertise_media or self.media


class CreateError(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def ice_password() -> str:
    # 18 random bytes -> 24 base64 chars: ice-char only (RFC 8839 §5.4), 144 bits.
    return base64.b64encode(os.urandom(18)).decode()


class Transceiver:
    def __init__(self, config: TransceiverConfig) -> None:
        self.config = config
        self.mux: SessionMux[Session] = SessionMux(accept_direct=config.accept_direct)
        self.sessions: dict[str, Session] = {}
        self.counters: Counter[str] = Counter()
        self.setup_seconds = Histogram(
            "firsthop_session_setup_seconds",
            "Offer received to ICE+DTLS connected",
            SETUP_BUCKETS,
        )
        self.draining = False
        # why recent sessions ended (oldest first), so signaling can tell its clients
        self.ended: dict[str, str] = {}
        self._unread: set[str] = set()  # drained sessions whose end reason nobody asked yet
        self._all_read = trio.Event()
        self._session_removed = trio.Event()
        self.media_addr: Address | None = None
        # (ufrag, traceparent) pairs for the Redis trace hand-off; None without Redis.
        self.trace_writes: trio.MemorySendChannel[tuple[str, str]] | None = None
        self._sock: socket.socket | None = None
        self._sessions_nursery: trio.Nursery | None = None
        self._noticed: dict[tuple[Address, bytes], float] = {}  # (relay, token) -> when

    # -- the shared socket ----------------------------------------------------------------

    def send_to_client(self, payload: bytes, client: Address) -> None:
        framed = self.mux.frame_for(client, payload)
        if framed is None or self._sock is None:
            return
        data, dest = framed
        try:
            self._sock.sendto(data, dest)
            self.counters["packets_out"] += 1
        except (BlockingIOError, InterruptedError):
            self.counters["send_would_block"] += 1
        except OSError:
            self.counters["send_error"] += 1

    async def _receive_loop(self, sock: socket.socket) -> None:
        """Own the media socket's reading for as long as this task lives.

        The reads themselves run as a reader callback on the asyncio host loop (measured:
        waking Trio's guest run for every datagram was about a fifth of the transceiver's
        main-thread CPU); this task starts and stops that reader, so Trio still owns when the
        socket is read and closed.
        """
        buf = bytearray(RECV_BUFFER)
        view = memoryview(buf)

        def drain() -> None:
            for _ in range(DRAIN_BATCH):
                try:
                    n, src = sock.recvfrom_into(buf)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    self.counters["recv_error"] += 1
                    continue
                self._on_datagram(src, bytes(view[:n]))

        stop = watch_readable(sock, drain)
        try:
            await trio.sleep_forever()
        finally:
            stop()

    def _on_datagram(self, src: Address, data: bytes) -> None:
        delivery = self.mux.on_datagram(src, data)
        if delivery is None:
            return
        if isinstance(delivery, Unrouted):
            self._revoked(delivery.ufrag, delivery.client, delivery.relay, delivery.ingress)
            return
        if delivery.payload[0] < 4:  # STUN (RFC 7983)
            self._on_stun(delivery)
        else:
            self._to_rtc(delivery.session, delivery.payload, delivery.client)

    def _to_rtc(self, session: Session, payload: bytes, client: Address) -> None:
        try:
            if not session.rtc.datagram_received(payload, client):
                self.counters["session_queue_full"] += 1
        except Exception:  # aioice raises struct.error & co on crafted STUN
            self.counters["session_datagram_error"] += 1
            log.debug("datagram for session %s raised", session.session_id, exc_info=True)

    def _on_stun(self, delivery: Delivery[Session]) -> None:
        """Every STUN datagram goes through the session's `LiteIce` first (`ice_lite.py`)."""
        session, client, payload = delivery.session, delivery.client, delivery.payload
        ice = session.ice
        now = time.monotonic()
        if len(payload) < 2 or payload[0] & 0x01 or payload[1] & 0x10:
            # not a request (RFC 8489 §5: class bits 0x0110 of the type): our check's answer?
            outcome = ice.on_response(now, client, payload)
            if ice.probing() is None:
                self.mux.unexpect(session)
            if isinstance(outcome, Refused):
                self.counters[outcome.reason] += 1
                return
            assert isinstance(outcome, PathValidated)
            self.mux.validated(session, client)
            session.rtc.select_path(client)
            self.counters["path_moved"] += 1
            session.timer_changed()
            return
        verdict = ice.on_request(now, client, payload)
        if isinstance(verdict, Refused):
            self.counters[verdict.reason] += 1  # dropped unanswered
            return
        self.mux.note_route(session, delivery)
        for gone in ice.forgotten:
            self.mux.forget(session, gone)
            session.rtc.forget_path(gone)
        ice.forgotten.clear()
        if verdict.selects:
            self.mux.validated(session, client)
        self._to_rtc(session, payload, client)  # aioice answers it (one response)
        if verdict.probe is not None:
            self.mux.expect(session, client)
            self.send_to_client(verdict.probe, client)
            self.counters["path_validations"] += 1
            session.timer_changed()

    def _revoked(
        self, token: bytes, client: Address, relay: Address | None, ingress: Address | None
    ) -> None:
        """Tell `relay` that `token` routes to no session here any more (at most once per
        `NOTICE_INTERVAL`; a direct client is told nothing)."""
        if relay is None or ingress is None or self._sock is None:
            return
        now = time.monotonic()
        key = (relay, token)
        last = self._noticed.get(key)
        if last is not None and now - last < NOTICE_INTERVAL:
            return
        if len(self._noticed) >= MAX_NOTICES_REMEMBERED:
            self._noticed.clear()
        self._noticed[key] = now
        try:
            self._sock.sendto(build_proxy_v2(ingress, client, revocation_tlv(token)), relay)
            self.counters["revocations_sent"] += 1
        except OSError:
            self.counters["send_error"] += 1

    # -- sessions ---------------------------------------------------------------------------

    def mint_ufrag(self) -> str:
        host, port = self.config.advertised
        return encode_route_token(
            key_id=self.config.key_id,
            key=self.config.keys[self.config.key_id],
            cluster=self.config.cluster,
            host=host,
            port=port,
            issued_at=int(time.time()),
            nonce=fresh_nonce(),
        )

    async def create_session(
        self,
        *,
        call_id: str,
        offer_sdp: str,
        ingress: list[Address],
        agent_url: str | None,
        region: str | None,
        traceparent: str | None = None,
    ) -> tuple[str, str]:
        if self.draining:
            raise CreateError(503, "transceiver is draining")
        if len(self.sessions) >= self.config.capacity:
            raise CreateError(503, "transceiver at capacity")
        if not ingress:
            raise CreateError(400, "no ingress address to advertise")
        try:
            offer = check_offer(offer_sdp)
        except ValueError as exc:
            raise CreateError(400, str(exc)) from exc
        for candidate in offer.candidates:
            reason = classify_candidate(candidate, self.config.deny_candidate_cidr)
            self.counters[f"candidate_{reason or 'ignored'}"] += 1
        assert self._sessions_nursery is not None
        span = TRACER.start_span(
            "transceiver.session",
            context=context_from_traceparent(traceparent),
            kind=SpanKind.SERVER,
            attributes={
                "firsthop.call_id": call_id,
                "firsthop.region": region or self.config.region,
                "firsthop.transceiver": self.config.id,
                "firsthop.ingress": ",".join(f"{h}:{p}" for h, p in ingress),
            },
        )
        remote = offer.media[0]
        assert remote.ufrag is not None and remote.pwd is not None  # check_offer saw to it
        session = Session(
            session_id=secrets.token_urlsafe(12),
            call_id=call_id,
            agent_url=agent_url or self.config.agent_url,
            region=region or self.config.region,
            ingress=ingress,
            creds=Credentials(self.mint_ufrag(), ice_password(), remote.ufrag, remote.pwd),
            send=self.send_to_client,
            counters=self.counters,
            traceparent=traceparent,
            span=span,
            consent_timeout=self.config.consent_timeout,
        )
        span.set_attribute("firsthop.session_id", session.session_id)
        try:
            with trace.use_span(span, end_on_exit=False):
                with TRACER.start_as_current_span("transceiver.answer"):
                    answer = await session.answer(strip_candidates(offer_sdp))
        except Exception as exc:  # aiortc's own checks: AssertionError, ValueError, ...
            self.counters["offer_rejected"] += 1
            await session.rtc.close()
            span.set_status(trace.StatusCode.ERROR, "offer rejected")
            span.end()
            raise CreateError(400, f"offer rejected: {exc or type(exc).__name__}") from exc
        self.trace_handoff(session.ufrag, span)
        self.sessions[session.session_id] = session
        self.mux.add_ufrag(session.ufrag, session)
        self._sessions_nursery.start_soon(self._run_session, session)
        return session.session_id, mark_ice_lite(answer)

    async def _run_session(self, session: Session) -> None:
        try:
            await session.run()
        finally:
            self.sessions.pop(session.session_id, None)
            self._session_removed.set()
            ufrags = [session.ufrag, *session.old_ufrags]
            for client, route in self.mux.remove_session(session, ufrags):
                for ufrag in ufrags:  # its relays stop routing the call's tokens now
                    self._revoked(ufrag.encode(), client, route.relay, route.ingress)
            setup = session.milestones.get("dtls_connected")
            if setup is not None:
                self.setup_seconds.observe(setup)
            self.counters[f"ended_{session.end_reason}"] += 1
            self.ended[session.session_id] = session.end_reason or "ended"
            while len(self.ended) > ENDED_REMEMBERED:
                del self.ended[next(iter(self.ended))]

    def restart_ice(self, session_id: str, remote_ufrag: str, remote_pwd: str) -> tuple[str, str]:
        session = self.sessions[session_id]
        ufrag, pwd = self.mint_ufrag(), ice_password()
        session.restart_ice(Credentials(ufrag, pwd, remote_ufrag, remote_pwd))
        if session.span is not None:
            session.span.add_event("ice_restart")
            self.trace_handoff(ufrag, session.span)
        self.mux.add_ufrag(ufrag, session)
        return ufrag, pwd

    def trace_handoff(self, ufrag: str, span: Span) -> None:
        """Leave the session's traceparent at `firsthop:trace:{ufrag}` for the relay's
        first-packet span (ARCHITECTURE §9), off the request path."""
        traceparent = traceparent_of(span)
        if traceparent and self.trace_writes is not None:
            try:
                self.trace_writes.send_nowait((ufrag, traceparent))
            except trio.WouldBlock:
                self.counters["trace_handoff_dropped"] += 1

    def end_session(self, session_id: str, reason: str) -> bool:
        session = self.sessions.get(session_id)
        if session is None:
            return False
        session.end(reason)
        return True

    async def drain(self, deadline: float) -> None:
        """Stop accepting; let calls finish until `deadline` seconds, then end them."""
        self.draining = True
        with trio.move_on_after(deadline):
            await self._all_sessions_gone()
        for session in list(self.sessions.values()):
            session.end("drain")
            self._unread.add(session.session_id)
        await self._all_sessions_gone()

    def reason_read(self, session_id: str) -> None:
        """Someone (signaling's call watcher) has learnt why `session_id` ended."""
        self._unread.discard(session_id)
        if not self._unread:
            self._all_read.set()

    async def end_reasons_read(self, grace: float = END_REASON_GRACE) -> None:
        """Before the process exits after a drain: give signaling up to `grace` seconds to
        read why the drained calls ended, so their clients hear "drain", not "transceiver
        lost" (a REST-only client never asks: then the grace runs out)."""
        if self._unread:
            with trio.move_on_after(grace):
                await self._all_read.wait()
                await trio.sleep(ANSWER_FLUSH)  # the answer that told the last one, sent

    async def _all_sessions_gone(self) -> None:
        while self.sessions:
            await self._session_removed.wait()
            self._session_removed = trio.Event()

    # -- serving -----------------------------------------------------------------------------

    async def serve(
        self, *, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
    ) -> None:
        sock = socket.socket(
            socket.AF_INET6 if ":" in self.config.media[0] else socket.AF_INET, socket.SOCK_DGRAM
        )
        sock.setblocking(False)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, 4 * 1024 * 1024)
            except OSError:
                pass
        sock.bind(self.config.media)
        self._sock = sock
        self.media_addr = sock.getsockname()[:2]
        if self.config.advertise_media is None:
            self.config.advertise_media = self.media_addr
        try:
            async with trio.open_nursery() as nursery:
                self._sessions_nursery = nursery
                nursery.start_soon(self._receive_loop, sock)
                task_status.started(self.media_addr)
        finally:
            sock.close()
            self._sock = None
