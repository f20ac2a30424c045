"""`firsthop transceiver`: every session of the process behind ONE shared UDP socket.

The decisions are the `SessionTable`'s (`table.py`, sans-IO): which session a datagram is
for, whether a check authenticates, where media goes, when a session ends. This module is
the Trio I/O around it: the media socket's receive loop feeds it datagrams and carries out
the commands it returns (send, hand to aiortc, move a path), one timer task calls it when its
next deadline is due and ends what it says ended, and the internal API admits, restarts and
ends sessions through it. aiortc runs on the asyncio host loop behind `rtc/`.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import math
import os
import secrets
import socket
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NoReturn

import redis
import trio
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from firsthop.services.transceiver.agents import TLS_SCHEMES
from firsthop.services.transceiver.ice_lite import Credentials
from firsthop.services.transceiver.recordings import RecordingError, RecordingStore
from firsthop.services.transceiver.registry import FlowPins
from firsthop.services.transceiver.rtc import (
    Milestone,
    PlainRtpSession,
    around_ticks,
    call_asyncio,
    gather_counts,
    watch_readable,
    work_left,
)
from firsthop.services.transceiver.session import Session
from firsthop.services.transceiver.table import (
    LINGER,
    Command,
    PathChanged,
    Refusal,
    Send,
    SessionTable,
    ToMedia,
)
from firsthop.shared import memory, mmsg
from firsthop.shared.address import Address
from firsthop.shared.metrics import Histogram
from firsthop.shared.sdp import (
    SdpError,
    ask_for_opus_fec,
    check_offer,
    classify_candidate,
    mark_ice_lite,
    only_opus,
    strip_candidates,
)
from firsthop.shared.telemetry import context_from_traceparent, traceparent_of, tracer
from firsthop.shared.wire.route_token import encode_route_token, fresh_nonce

log = logging.getLogger("firsthop.transceiver")

RECV_BUFFER = 2048
SOCKET_BUFFER = 4 * 1024 * 1024  # the media socket's, each way
DRAIN_BATCH = 64  # datagrams read per readiness callback (one recvmmsg) before yielding
SEND_BATCH = 64  # datagrams a sendmmsg takes (a read batch's or a media tick's sends)
TRACER = tracer("firsthop.transceiver")
SETUP_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0)
RTT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.4, 0.8)
JITTER_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08)
END_REASON_GRACE = 5.0  # after a drain, how long signaling may take to read why calls ended
ANSWER_FLUSH = 0.5  # time for an answer in flight to leave before the API goes down
# Seconds idle (no live call) before freed memory is handed back: an ended call's session
# is held while it lingers (`table.LINGER`), and is freed only after.
RELEASE_AFTER = LINGER + 1.0


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
    realtime_api_key: str | None = None  # `Authorization: Bearer` to Realtime backends
    agent_ca_file: str | None = None  # CAs for wss:// agents (default: the system's)
    record_dir: str | None = None  # call recordings (off without it: `recordings.py`)
    record_keep: float = 24 * 3600.0  # seconds a finished recording is kept
    record_max_bytes: int = 10 << 30  # all recordings together; the oldest go first
    gather: float = 0.002  # seconds a busy loop lets its next batch gather (`rtc/bridge.py`)

    @property
    def advertised(self) -> Address:
        return self.advertise_media or self.media


def ice_password() -> str:
    # 18 random bytes -> 24 base64 chars: ice-char only (RFC 8839 §5.4), 144 bits.
    return base64.b64encode(os.urandom(18)).decode()


class Transceiver:
    def __init__(self, config: TransceiverConfig) -> None:
        self.config = config
        self.table: SessionTable[Session] = SessionTable(
            mint_ufrag=self.mint_ufrag,
            mint_password=ice_password,
            capacity=config.capacity,
            accept_direct=config.accept_direct,
            consent_timeout=config.consent_timeout,
        )
        self.counters = self.table.counters
        self.recordings = (
            RecordingStore(
                config.record_dir, config.record_keep, config.record_max_bytes, self.counters
            )
            if config.record_dir
            else None
        )
        self.setup_seconds = Histogram(
            "firsthop_session_setup_seconds",
            "Offer received to ICE+DTLS connected",
            SETUP_BUCKETS,
        )
        self.call_rtt = Histogram(
            "firsthop_call_rtt_seconds",
            "Round-trip time to the caller (RTCP), at call end",
            RTT_BUCKETS,
        )
        self.call_jitter = Histogram(
            "firsthop_call_jitter_seconds",
            "Interarrival jitter of the caller's audio, at call end",
            JITTER_BUCKETS,
        )
        self.media_addr: Address | None = None
        # (ufrag, traceparent) pairs for the Redis trace hand-off; None without Redis.
        self.trace_writes: trio.MemorySendChannel[tuple[str, str]] | None = None
        self._sock: socket.socket | None = None
        self._out = mmsg.Sender(SEND_BATCH)  # a batch's sends, in one syscall
        self._batch: list[tuple[bytes, Address]] | None = None
        self._sessions_nursery: trio.Nursery | None = None
        self._session_removed = trio.Event()
        self._went_idle = trio.Event()  # the last live call ended
        self.memory_released = 0  # bytes of RSS handed back when idle (`shared/memory.py`)
        self._all_read = trio.Event()
        self._timer_at = math.inf  # when the timer task will next wake
        self._timer_moved = trio.Event()
        self._agent_tls: ssl.SSLContext | None = None
        self.flow_pins: FlowPins | None = None  # with Redis: phone calls' relay flows
        self.ready = False  # serving, and in the registry (with Redis): `serve_transceiver`

    def agent_tls(self) -> ssl.SSLContext:
        """The TLS context of wss:// agents (made once: loading CAs is not free)."""
        if self._agent_tls is None:
            self._agent_tls = ssl.create_default_context(cafile=self.config.agent_ca_file)
        return self._agent_tls

    def event_counts(self) -> Counter[str]:
        """The counters, with what live calls' media cores have counted so far (each call's
        own are added to `counters` once, at its end)."""
        counts = Counter(self.counters)
        for entry in self.table.entries.values():
            counts.update(entry.handle.rtc.live_stats())
        counts.update(gather_counts())  # (the loop's: `rtc/bridge.py`)
        return counts

    @property
    def draining(self) -> bool:
        return self.table.draining

    def session(self, session_id: str) -> Session | None:
        entry = self.table.entries.get(session_id)
        return entry.handle if entry is not None else None

    # -- the shared socket ----------------------------------------------------------------

    def send_to_client(self, payload: bytes, client: Address) -> None:
        """aiortc's way out: frame `payload` to the relay that last delivered `client`."""
        framed = self.table.frame_for(client, payload)
        if framed is not None:
            self._send(framed.data, framed.dest)

    def _send(self, data: bytes, dest: Address) -> None:
        """One datagram onto the shared socket: at once, or, inside a batch (a read batch, a
        media clock tick: `_batch_start`), with the batch's others in one sendmmsg."""
        sock = self._sock
        if sock is None:
            return
        batch = self._batch
        if batch is not None:
            batch.append((data, dest))
            return
        try:
            sock.sendto(data, dest)
            self.counters["packets_out"] += 1
        except (BlockingIOError, InterruptedError):
            self.counters["send_would_block"] += 1
        except OSError:
            self.counters["send_error"] += 1

    def _batch_start(self) -> None:
        self._batch = []

    def _batch_end(self) -> None:
        """Send what the batch queued: one datagram as it is, more in sendmmsg calls."""
        batch, self._batch = self._batch, None
        if not batch:
            return
        if len(batch) == 1 or self._sock is None:
            for data, dest in batch:
                self._send(data, dest)
            return
        out, fd = self._out, self._sock.fileno()
        for data, dest in batch:
            if out.full():
                self._flush(fd)
            try:
                out.add_buffer(data, dest)
            except (OSError, ValueError):  # (an address this socket's family cannot name)
                self.counters["send_error"] += 1
        self._flush(fd)

    def _flush(self, fd: int) -> None:
        """Send what is queued; a datagram the kernel refused is counted as `_send` counts
        it: `send_would_block` (the buffer was full) or `send_error`, one each."""
        out = self._out
        if out.pending:
            self.counters["packets_out"] += out.flush(fd)
            if out.dropped:
                self.counters["send_would_block"] += out.would_block
                self.counters["send_error"] += out.dropped - out.would_block

    async def _receive_loop(self, sock: socket.socket) -> None:
        """Own the media socket's reading for as long as this task lives.

        The reads themselves run as a reader callback on the asyncio host loop (measured:
        waking Trio's guest run for every datagram was about a fifth of the transceiver's
        main-thread CPU); this task starts and stops that reader, so Trio still owns when the
        socket is read and closed.
        """
        batch = mmsg.Receiver(DRAIN_BATCH, RECV_BUFFER)
        fd = sock.fileno()

        def drain() -> None:
            got = batch.receive(fd)
            if got == DRAIN_BATCH:  # more is waiting: the loop must come back at once
                work_left()
            if batch.errors:
                self.counters["recv_error"] += batch.errors
                batch.errors = 0
            sources, payload, truncated = batch.sources, batch.payload, batch.truncated
            self._batch_start()
            try:
                for i in range(got):
                    if truncated(i):  # past RECV_BUFFER: no datagram of ours is
                        self.counters["recv_oversize"] += 1
                        continue
                    self._on_datagram(sources[i], bytes(payload(i)))
            finally:  # (a raise must not leave the batch open: every send would wait in it)
                self._batch_end()

        around_ticks(self._batch_start, self._batch_end)  # a media tick's frames go together
        stop = watch_readable(sock, drain)
        try:
            await trio.sleep_forever()
        finally:
            stop()

    def _on_datagram(self, src: Address, data: bytes) -> None:
        commands = self.table.on_datagram(time.monotonic(), src, data)
        for command in commands:
            self._carry_out(command)
        self._rearm()

    def _carry_out(self, command: Command[Session]) -> None:
        match command:
            case ToMedia(session, payload, client, elsewhere):
                self._to_rtc(session, payload, client, elsewhere)
            case Send(data, dest):
                self._send(data, dest)
            case PathChanged(session, _):
                session.rtc.path_selected()

    def _to_rtc(self, session: Session, payload: bytes, client: Address, elsewhere: bool) -> None:
        rtc = session.rtc
        before = rtc.authenticated
        try:
            if not rtc.datagram_received(payload, client):
                self.counters["session_queue_full"] += 1
        except Exception:  # (the session's own handlers catch what they raise)
            self.counters["session_datagram_error"] += 1
            log.debug("datagram for session %s raised", session.session_id, exc_info=True)
        if rtc.authenticated == before:
            return
        now = rtc.authenticated_at  # (a dict lookup and a call a datagram: 0.15 us measured)
        if not elsewhere:  # the caller's media on its path (how a path's silence is judged)
            self.table.media_heard(now, session.session_id)
            return
        for command in self.table.media_authenticated(now, session.session_id, client):
            self._carry_out(command)  # (the caller's media, off the path)

    # -- the table's clock ---------------------------------------------------------------------

    def _rearm(self) -> None:
        """Re-read the table's timer: called after every call into the table that takes the
        time (as aioquic's adapters re-read `get_timer()`), not where a timer might move;
        cheap (the heap's top)."""
        deadline = self.table.next_deadline()
        if deadline is not None and deadline < self._timer_at:
            self._timer_moved.set()

    async def _timers(self) -> None:
        """Call the table when its next deadline is due; end the sessions it says ended."""
        while True:
            deadline = self.table.next_deadline()
            self._timer_at = math.inf if deadline is None else deadline
            delay = max(0.0, self._timer_at - time.monotonic())
            with trio.move_on_after(delay) as wait:
                await self._timer_moved.wait()
                self._timer_moved = trio.Event()
            if wait.cancelled_caught:
                for due in self.table.on_deadline(time.monotonic()):
                    if isinstance(due, Send):
                        self._send(due.data, due.dest)  # a lingering session's revocation
                    else:
                        due.handle.end(due.reason)

    async def _release_memory_when_idle(self) -> None:
        """Once the last call has ended and no call came for `RELEASE_AFTER` seconds (its
        tasks have unwound by then), hand the heap it freed back to the OS: RSS then follows
        the calls down instead of staying at the most ever held (`shared/memory.py`)."""
        while True:
            await self._went_idle.wait()
            self._went_idle = trio.Event()
            await trio.sleep(RELEASE_AFTER)
            if len(self.table) == 0:
                self.memory_released += memory.release()
                self.counters["memory_releases"] += 1

    def _on_state(self, session: Session, state: str) -> None:
        """aiortc's connection state for `session` (called on the loop thread)."""
        if state == "connected":
            self.table.connected(time.monotonic(), session.session_id)
            self._rearm()
        elif state in ("failed", "closed"):
            self.end_session(session.session_id, f"connection_{state}")

    def _end_call(self, session: Session, reason: str) -> None:
        """`session` asks to end: its agent hung up (a Media Streams bot closed its socket),
        or it failed (`session_error`)."""
        self.end_session(session.session_id, reason)

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
        session_config: dict[str, Any] | None = None,
        ingress_tcp: list[Address] | None = None,
        record: bool = False,
    ) -> tuple[str, str]:
        self.table.check_admission()
        if not ingress:
            raise Refusal(400, "no ingress address to advertise")
        self._check_recording(record)
        try:
            offer = check_offer(offer_sdp)
        except ValueError as exc:
            raise Refusal(400, str(exc)) from exc
        for candidate in offer.candidates:
            reason = classify_candidate(candidate, self.config.deny_candidate_cidr)
            self.counters[f"candidate_{reason or 'ignored'}"] += 1
        assert self._sessions_nursery is not None
        span = self._session_span(call_id, region, ingress, traceparent)
        remote = offer.media[0]
        assert remote.ufrag is not None and remote.pwd is not None  # check_offer saw to it
        session: Session | None = None
        try:
            creds = self.table.credentials(remote.ufrag, remote.pwd)
            session_id = secrets.token_urlsafe(12)
            session = self._new_session(
                session_id, call_id, agent_url, region, ingress, ingress_tcp or [], creds,
                traceparent, span, session_config,
            )  # fmt: skip
            if record:
                self._record(session, call_id)
            with trace.use_span(span, end_on_exit=False):
                with TRACER.start_as_current_span("transceiver.answer"):
                    answer = await self._answer(session, offer_sdp)
            answer = mark_ice_lite(ask_for_opus_fec(answer))
            self.table.open(time.monotonic(), session_id, session, creds)  # last: may be full
        except BaseException as exc:
            await self._abandon(exc, session, span, call_id)
        self._rearm()
        self.trace_handoff(creds.local_ufrag, span)
        self._sessions_nursery.start_soon(self._run_session, session)
        return session_id, answer

    async def create_phone_session(
        self,
        *,
        call_id: str,
        offer_sdp: str,
        ingress: list[Address],
        agent_url: str | None,
        region: str | None,
        traceparent: str | None = None,
        session_config: dict[str, Any] | None = None,
        record: bool = False,
    ) -> tuple[str, str]:
        """A phone call from a SIP trunk (signaling's SIP front): plain RTP as the trunk's
        offer says (`rtc/plain_rtp.py`), its media pinned to the one address that offer
        names, here (`SessionTable.open_pinned`) and on the relays (`FlowPins`, written
        before the answer leaves). (session id, answer SDP); `Refusal` says why not."""
        self.table.check_admission()
        if not ingress:
            raise Refusal(400, "no ingress address to advertise")
        self._check_recording(record)
        pins = self.flow_pins
        if pins is None and not self.config.accept_direct:
            raise Refusal(503, "phone calls need --redis: their relay flow is published there")
        assert self._sessions_nursery is not None
        span = self._session_span(call_id, region, ingress, traceparent)
        span.set_attribute("firsthop.media", "rtp")
        session: Session | None = None
        pinned: Address | None = None
        try:
            creds = self.table.credentials("-", "-")  # (its token routes; nobody checks it)
            session_id = secrets.token_urlsafe(12)
            session = self._new_session(
                session_id, call_id, agent_url, region, ingress, [], creds, traceparent,
                span, session_config, media="rtp",
            )  # fmt: skip
            if record:
                self._record(session, call_id)
            with trace.use_span(span, end_on_exit=False):
                with TRACER.start_as_current_span("transceiver.answer"):
                    try:
                        answer = await session.answer(offer_sdp)
                    except SdpError as exc:
                        self.counters["offer_rejected"] += 1
                        raise Refusal(400, f"offer rejected: {exc}") from exc
            assert isinstance(session.rtc, PlainRtpSession) and session.rtc.remote is not None
            remote = session.rtc.remote
            self._check_trunk_media(remote)
            if pins is not None:
                try:
                    if not await pins.pin(remote, creds.local_ufrag.encode()):
                        raise Refusal(409, "the offer's media address is another flow's")
                except redis.RedisError as exc:
                    self.counters["redis_errors"] += 1
                    raise Refusal(503, "Redis unavailable: the call's relay flow") from exc
                pinned = remote
            self.table.open_pinned(time.monotonic(), session_id, session, creds, remote)
        except BaseException as exc:
            if pinned is not None and pins is not None:
                with trio.CancelScope(shield=True):
                    await pins.unpin(pinned)
            await self._abandon(exc, session, span, call_id)
        self._rearm()
        self.counters["phone_sessions"] += 1
        self._sessions_nursery.start_soon(self._run_session, session)
        return session_id, answer

    def _check_recording(self, record: bool) -> None:
        if record and self.recordings is None:
            raise Refusal(400, "recording is off on this transceiver (no --record-dir)")

    def _record(self, session: Session, call_id: str) -> None:
        """The call is recorded (its file opened now: it is written from its media's start)."""
        assert self.recordings is not None
        try:
            session.rtc.recording = self.recordings.open(call_id)
        except (RecordingError, OSError) as exc:
            raise Refusal(400, f"cannot record this call: {exc}") from exc

    def _check_trunk_media(self, remote: Address) -> None:
        """Where a trunk's offer may ask for media: not an address of no host, not one a live
        call of ours has. (Not `--deny-candidate-cidr`: a trunk on a private interconnect is
        in those ranges, and an offer cannot aim media anywhere: the relay sends to an
        address only once a datagram from it found the call's flow.)"""
        try:
            ip = ipaddress.ip_address(remote[0])
        except ValueError as exc:
            raise Refusal(400, "the offer's media address is not an IP address") from exc
        if ip.is_unspecified or ip.is_multicast or remote[1] == 0:
            self.counters["trunk_media_denied"] += 1
            raise Refusal(400, "the offer's media address is no host's")
        if remote in self.table.mux.by_client:
            self.counters["trunk_media_in_use"] += 1
            raise Refusal(409, "the offer's media address is another call's")

    def _session_span(
        self, call_id: str, region: str | None, ingress: list[Address], traceparent: str | None
    ) -> Span:
        return TRACER.start_span(
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

    def _new_session(
        self,
        session_id: str,
        call_id: str,
        agent_url: str | None,
        region: str | None,
        ingress: list[Address],
        ingress_tcp: list[Address],
        creds: Credentials,
        traceparent: str | None,
        span: Span,
        session_config: dict[str, Any] | None,
        media: str = "webrtc",
    ) -> Session:
        url = agent_url or self.config.agent_url or ""
        span.set_attribute("firsthop.session_id", session_id)
        return Session(
            session_id=session_id,
            call_id=call_id,
            agent_url=url or None,
            region=region or self.config.region,
            ingress=ingress,
            ingress_tcp=ingress_tcp,
            creds=creds,
            send=self.send_to_client,
            selected=lambda: self.table.selected(session_id),
            on_state=self._on_state,
            counters=self.counters,
            traceparent=traceparent,
            span=span,
            session_config=session_config,
            agent_headers=self._agent_headers(),
            agent_tls=self.agent_tls() if url.startswith(TLS_SCHEMES) else None,
            end_call=self._end_call,
            media=media,
        )

    async def _answer(self, session: Session, offer_sdp: str) -> str:
        """The answer to a checked offer; aiortc's own checks of it (AssertionError,
        ValueError, ...) are the offer's fault: 400."""
        try:
            return await session.answer(only_opus(strip_candidates(offer_sdp)))
        except Exception as exc:
            self.counters["offer_rejected"] += 1
            raise Refusal(400, f"offer rejected: {exc or type(exc).__name__}") from exc

    async def _abandon(
        self, exc: BaseException, session: Session | None, span: Span, call_id: str
    ) -> NoReturn:
        """A session whose setup raised `exc`: closed, its span ended, and `exc` raised on
        if it is a `Refusal` (the offer's fault) or a cancellation; anything else is a bug,
        for this one call only: 500."""
        with trio.CancelScope(shield=True):
            if session is not None:
                await self._close_unopened(session)
        span.set_status(trace.StatusCode.ERROR, "session not opened")
        span.end()
        if isinstance(exc, Refusal) or not isinstance(exc, Exception):
            raise exc
        self.counters["session_errors"] += 1
        self.counters["session_error_setup"] += 1
        log.error("session setup for call %s failed", call_id, exc_info=exc)
        raise Refusal(500, "session setup failed") from exc

    async def _close_unopened(self, session: Session) -> None:
        try:
            with trio.move_on_after(5):
                await call_asyncio(session.rtc.close())
        except Exception:
            log.exception("closing the unopened session %s failed", session.session_id)

    def _agent_headers(self) -> list[tuple[str, str]]:
        key = self.config.realtime_api_key
        return [("Authorization", f"Bearer {key}")] if key else []

    async def _run_session(self, session: Session) -> None:
        try:
            await session.run()
        except Exception as exc:  # run() handles its own failures; this is the last line
            session.fail("close", exc)
        finally:
            for notice in self.table.remove(session.session_id, time.monotonic()):
                self._send(notice.data, notice.dest)  # its relays stop routing its tokens
            if isinstance(session.rtc, PlainRtpSession) and session.rtc.remote is not None:
                if self.flow_pins is not None:
                    with trio.CancelScope(shield=True):
                        await self.flow_pins.unpin(session.rtc.remote)
            self._rearm()  # it lingers: its revocations are due later
            self._session_removed.set()
            if len(self.table) == 0:
                self._went_idle.set()
            quality = session.rtc.quality()
            if "rtt_s" in quality:
                self.call_rtt.observe(quality["rtt_s"])
            if "jitter_s" in quality:
                self.call_jitter.observe(quality["jitter_s"])
            setup = session.milestones.get(Milestone.DTLS_CONNECTED)
            if setup is not None:
                self.setup_seconds.observe(setup)

    def restart_ice(self, session_id: str, remote_ufrag: str, remote_pwd: str) -> Credentials:
        creds = self.table.restart_ice(session_id, remote_ufrag, remote_pwd)
        self._rearm()
        session = self.table.entries[session_id].handle
        session.rtc.restart_ice(
            creds.local_ufrag, creds.local_pwd, creds.remote_ufrag, creds.remote_pwd
        )
        if session.span is not None:
            session.span.add_event("ice_restart")
            self.trace_handoff(creds.local_ufrag, session.span)
        return creds

    def trace_handoff(self, ufrag: str, span: Span) -> None:
        """Leave the session's traceparent at `firsthop:trace:{ufrag}` for the relay's
        first-packet span (docs/architecture.md §9), off the request path."""
        traceparent = traceparent_of(span)
        if traceparent and self.trace_writes is not None:
            try:
                self.trace_writes.send_nowait((ufrag, traceparent))
            except trio.WouldBlock:
                self.counters["trace_handoff_dropped"] += 1

    def end_session(self, session_id: str, reason: str) -> bool:
        """End a live session (False: no such session, or it is already ending)."""
        ended = self.table.end(session_id, reason)
        self._rearm()
        if ended is None:
            return False
        ended.handle.end(ended.reason)
        return True

    def start_drain(self, grace: float) -> None:
        """Admit no more sessions; end those left after `grace` seconds."""
        self.table.drain(time.monotonic(), grace)
        self._rearm()

    async def drain(self, grace: float) -> None:
        """`start_drain`, then wait until every session is gone."""
        self.start_drain(grace)
        while self.table.entries:
            await self._session_removed.wait()
            self._session_removed = trio.Event()

    def reason_read(self, session_id: str) -> None:
        """Someone (signaling's call watcher) has learnt why `session_id` ended."""
        self.table.reason_read(session_id)
        if not self.table.reasons_unread:
            self._all_read.set()

    async def end_reasons_read(self, grace: float = END_REASON_GRACE) -> None:
        """Before the process exits after a drain: give signaling up to `grace` seconds to
        read why the drained calls ended, so their clients hear "drain", not "transceiver
        lost" (a REST-only client never asks: then the grace runs out)."""
        if self.table.reasons_unread:
            with trio.move_on_after(grace):
                while self.table.reasons_unread:
                    # a fresh event: the one a read of an earlier call's reason set (unread
                    # was empty then) says nothing about these (it let the process exit at
                    # once, and a drained call's client heard "transceiver_lost")
                    self._all_read = trio.Event()
                    await self._all_read.wait()
                await trio.sleep(ANSWER_FLUSH)  # the answer that told the last one, sent

    # -- serving -----------------------------------------------------------------------------

    async def serve(
        self, *, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
    ) -> None:
        host = self.config.media[0]
        v6 = ":" in host
        sock = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
        if host == "::":
            # --media [::]:PORT is dual stack whatever net.ipv6.bindv6only says: relays of
            # either family reach it (an IPv4 one is seen as ::ffff:a.b.c.d, and answered
            # so; the clients in its frames are as the relay wrote them).
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.setblocking(False)
        for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
            try:
                sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
            except OSError:
                pass
        granted = sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)  # (Linux: doubled)
        if granted < SOCKET_BUFFER:
            log.warning(
                "the media socket's receive buffer is %d bytes, not the %d asked (the "
                "kernel's net.core.rmem_max caps it): a burst past it is dropped unread",
                granted,
                SOCKET_BUFFER,
            )
        sock.bind(self.config.media)
        self._sock = sock
        self.media_addr = sock.getsockname()[:2]
        if self.config.advertise_media is None:
            self.config.advertise_media = self.media_addr
        try:
            async with trio.open_nursery() as nursery:
                self._sessions_nursery = nursery
                nursery.start_soon(self._receive_loop, sock)
                nursery.start_soon(self._timers)
                nursery.start_soon(self._release_memory_when_idle)
                task_status.started(self.media_addr)
        finally:
            sock.close()
            self._sock = None
