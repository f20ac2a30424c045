"""Signaling's SIP front: phone calls from SIP trunks, placed like WebRTC calls.

`--sip-listen HOST:PORT` opens a UDP socket and a TCP listener on the same port (RFC 3261
§18: a UAS takes both; a message on a connection is answered on it, framed by
`shared/wire/sip.SipStream`; only a trunk's address may keep a connection, at most
`MAX_TCP_PER_SOURCE` each and `MAX_TCP` in all, each idle at most `TCP_IDLE` and each with a
bounded queue of what we send it). `SipUas` (`services/sip/uas.py`) makes every SIP
decision; this is its Trio I/O, and what it answers with:

* a new call (`CallOffered`) rings (180) and is placed through `Calls` like any other, with
  media "rtp": the transceiver answers the trunk's SDP with the region's relay ingress (the
  one public UDP port) and publishes the relay flow for the trunk's media address
  (`registry.FlowPins`); its answer goes back in our 200 OK. The Request-URI's user names
  the agent (`sip:echo@edge` -> `--agent-url echo=...`; an unknown one: 404);
* what placing said no to becomes a SIP status: an offer the transceiver cannot take 488,
  no capacity 503 (with Retry-After), anything else 500;
* a BYE, a CANCEL, a missing ACK or a ring timeout ends the transceiver's session; a session
  that ends on its own (its agent hung up, the trunk's media stopped) is found by a poll
  (`call_poll_interval`, as `/v1/ws` watches its calls) and the trunk gets a BYE;
* a re-INVITE or UPDATE (hold, resume) is answered with the call's answer again, its
  direction answering the new offer's.

With `--sip-webhook URL` the app decides instead, as with OpenAI's SIP calls: the call rings
while a `realtime.call.incoming` event (`data.call_id`, `data.sip_headers`) is posted to URL,
signed as Standard Webhooks (`webhook-id`, `webhook-timestamp`, `webhook-signature: v1,...`
with `--sip-webhook-secret`), and waits (at most the ring timeout) for the app's `accept`
(its session config: the model names the agent), `reject` or, once up, `refer` on
`/v1/realtime/calls/{call_id}/...`, which any replica may take (`sip_calls.py`).

Every call is one task, at most `Limits.calls` of them (the UAS refuses more with 503).
"""

from __future__ import annotations

import base64
import contextlib
import errno
import hashlib
import hmac
import json
import logging
import math
import secrets
import socket
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio

from firsthop.services.signaling.auth import Principal
from firsthop.services.signaling.calls import CallRequest, Calls, OfferBody
from firsthop.services.signaling.errors import Problem
from firsthop.services.signaling.session_watch import SessionWatch
from firsthop.services.signaling.sip_calls import DECISION_POLL, PhoneRecord, SipCalls
from firsthop.services.signaling.stores import StoreUnavailable
from firsthop.services.sip.trunk_auth import OFFERED
from firsthop.services.sip.uas import (
    CallConfirmed,
    CallEnded,
    CallOffered,
    CallReoffered,
    CallTransferred,
    Limits,
    Outgoing,
    SipUas,
    Trunk,
)
from firsthop.shared.address import Address, format_hostport
from firsthop.shared.redis_store import CallRecord
from firsthop.shared.rtp_offer import ANSWERING, parse_rtp_offer
from firsthop.shared.sdp import SdpError
from firsthop.shared.wire import sip

log = logging.getLogger("firsthop.signaling.sip")

# What placing a call said, as the status the trunk hears (RFC 3261 §21).
STATUS_OF_PROBLEM = {400: (488, "Not Acceptable Here"), 503: (503, "Service Unavailable")}


BROKEN = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)  # a connection gone
MAX_TCP, MAX_TCP_PER_SOURCE = 1024, 16  # SIP connections, in all and from one address
TCP_IDLE = 300.0  # s without a message (or a keep-alive) before a connection is closed
TLS_HANDSHAKE = 5.0  # s a TLS connection has to finish its handshake (since stop 42)
TCP_QUEUE = 64  # messages waiting to be written to one connection; past that, dropped
STREAM_BATCH = 16  # messages of one read handled between passes of Trio's scheduler
WEBHOOK_ATTEMPTS = 3  # posts of one event (Standard Webhooks: retried on a failure)
WEBHOOK_TIMEOUT = 5.0  # s, each, in all (its answer's body is never read)
ACCEPTING_MAX = 60.0  # s an ended call waits for an accept that is placing it
WEBHOOK_CONNECTIONS = 64  # posts at once: a pool of their own (`main.serve_signaling`)
SEND_WITHIN = 1.0  # s: what the core has to send goes out, even from a cancelled task
PORT_TRIES = 16  # port 0: UDP ports the kernel picks until one is free for TCP as well
# What of an INVITE its webhook carries (`data.sip_headers`), bounded: not the routing, and
# not a trunk's Digest answer (an offline guess at its password could start from it).
HIDDEN_HEADERS = {
    "via", "route", "record-route", "max-forwards", "content-length", "authorization",
    "proxy-authorization",
}  # fmt: skip
MAX_WEBHOOK_HEADERS, MAX_WEBHOOK_VALUE = 32, 512


@dataclass
class SipConfig:
    listen: Address
    trunks: list[Trunk]
    public: Address | None = None  # our Contact's host:port (default: `listen`)
    record: frozenset[str] = frozenset()  # trunks whose every call is recorded
    limits: Limits = field(default_factory=Limits)
    poll_interval: float = 1.0  # each transceiver's calls, probed this often (all at once)
    lost_after: float = 5.0  # a transceiver that does not answer this long lost its calls
    tls_listen: Address | None = None  # SIP over TLS (RFC 3261 §26.2; 5061), with `tls`
    tls: ssl.SSLContext | None = None  # our certificate and key
    webhook: str | None = None  # OpenAI's SIP flow: where `realtime.call.incoming` goes
    webhook_secret: str | None = None  # its signing key (`whsec_` + base64, or raw)
    auth_algorithms: tuple[str, ...] = OFFERED  # Digest challenges (`Trunk.secret`'s trunks)


@dataclass(eq=False)
class PhoneCall:
    call: str  # the UAS's handle (our To tag)
    ended: trio.Event = field(default_factory=trio.Event)
    end_reason: str | None = None
    answer: str | None = None  # our SDP answer, once placed
    version: int = 1
    offered: tuple[str, int] | None = None  # the trunk's media address, as first offered


def webhook_headers(request: sip.SipRequest) -> list[dict[str, str]]:
    """What of an INVITE `realtime.call.incoming` carries (`data.sip_headers`): its fields
    but `HIDDEN_HEADERS`, at most `MAX_WEBHOOK_HEADERS`, each value cut to its bound."""
    return [
        {"name": sip.canonical_name(name), "value": value[:MAX_WEBHOOK_VALUE]}
        for name, value in request.headers
        if name not in HIDDEN_HEADERS
    ][:MAX_WEBHOOK_HEADERS]


async def bind_udp_and_tcp(
    listen: Address,
) -> tuple[trio.socket.SocketType, list[trio.SocketListener]]:
    """A UDP socket and TCP listeners on one host and port (SIP takes both). Port 0: the
    kernel picks the UDP port, whose number a TCP connection may hold (its local port);
    then another is picked, `PORT_TRIES` times at most. A port given is bound or refused."""
    host, port = listen
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for attempt in range(PORT_TRIES):
        sock = trio.socket.socket(family, socket.SOCK_DGRAM)
        try:
            await sock.bind(listen)
            bound = sock.getsockname()[:2]
            return sock, await trio.open_tcp_listeners(bound[1], host=bound[0])
        except OSError as exc:
            sock.close()
            if port != 0 or exc.errno != errno.EADDRINUSE or attempt == PORT_TRIES - 1:
                raise
    raise AssertionError("unreachable")


class SipFront:
    def __init__(
        self,
        calls: Calls,
        config: SipConfig,
        phones: SipCalls | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.calls = calls
        self.config = config
        self.phones = phones or SipCalls(None)
        self.http = http
        self.counters = calls.stats.counters
        self.uas: SipUas | None = None
        self._sock: trio.socket.SocketType | None = None
        self._live: dict[str, PhoneCall] = {}
        self._timer_moved = trio.Event()
        self._nursery: trio.Nursery | None = None
        self._streams: dict[Address, trio.MemorySendChannel[bytes]] = {}  # TCP, by peer
        self.watch: SessionWatch | None = None
        self._per_source: Counter[str] = Counter()

    async def serve(
        self, *, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
    ) -> None:
        sock, tcp = await bind_udp_and_tcp(self.config.listen)
        listeners: list[trio.abc.Listener[Any]] = list(tcp)
        try:
            with sock:
                await self._serve(sock, listeners, task_status)
        finally:  # (trio.serve_listeners does not close them)
            with trio.CancelScope(shield=True):
                for listener in listeners:
                    await listener.aclose()

    async def _serve(
        self,
        sock: trio.socket.SocketType,
        listeners: list[trio.abc.Listener[Any]],
        task_status: trio.TaskStatus[Address],
    ) -> None:
        bound: Address = sock.getsockname()[:2]
        public = self.config.public or bound
        self.uas = SipUas(
            trunks=self.config.trunks,
            contact=f"sip:firsthop@{format_hostport(public)}",
            token=lambda: secrets.token_hex(8),
            now=trio.current_time(),
            limits=self.config.limits,
            counters=self.counters,  # (signaling's events_total: every `sip_*` name)
            wall_offset=time.time() - trio.current_time(),
            auth_algorithms=self.config.auth_algorithms,
        )
        self._sock = sock
        if self.config.tls_listen is not None and self.config.tls is not None:
            host, port = self.config.tls_listen
            listeners += await trio.open_ssl_over_tcp_listeners(port, self.config.tls, host=host)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            self.watch = SessionWatch(
                self.calls.client,
                self.calls.directory,
                nursery,
                interval=self.config.poll_interval,
                lost_after=self.config.lost_after,
            )
            nursery.start_soon(self._timers)
            nursery.start_soon(trio.serve_listeners, self._connection, listeners)
            log.info(
                "SIP on udp and tcp %s (contact %s), trunks: %s",
                format_hostport(bound),
                self.uas.contact,
                ", ".join(t.name for t in self.config.trunks) or "none (every INVITE: 403)",
            )
            task_status.started(bound)
            await self._receive(sock)

    # -- the socket and the core's clock --------------------------------------------------------

    async def _receive(self, sock: trio.socket.SocketType) -> None:
        assert self.uas is not None
        while True:
            try:
                data, source = await sock.recvfrom(sip.MAX_MESSAGE + 1)
            except OSError:  # (an ICMP error of an earlier send, on Linux)
                self.counters["sip_recv_error"] += 1
                continue
            self._feed(data, (source[0], source[1]))
            await self._carry_out()

    def _feed(self, data: bytes, source: Address, reliable: bool = False) -> None:
        """One message to the core (`reliable`: from a TCP or TLS connection): what it raises
        (a bug no test found) costs that message only, never the SIP front (`sip_errors`)."""
        assert self.uas is not None
        try:
            self.uas.receive_datagram(data, source, trio.current_time(), reliable)
        except Exception:
            self.counters["sip_errors"] += 1
            log.exception("the SIP core raised on a message from %s", format_hostport(source))

    async def _timers(self) -> None:
        assert self.uas is not None
        while True:
            at = self.uas.get_timer()
            with trio.move_on_at(math.inf if at is None else at):
                await self._timer_moved.wait()
                self._timer_moved = trio.Event()
                continue
            try:
                self.uas.handle_timer(trio.current_time())
            except Exception:  # (a bug: the timers of the calls it touched are gone, not SIP)
                self.counters["sip_errors"] += 1
                log.exception("the SIP core raised on its timer")
            await self._carry_out()

    async def _carry_out(self) -> None:
        """Send what the core has to send, act on its events, re-read its timer."""
        uas, sock = self.uas, self._sock
        assert uas is not None and sock is not None and self._nursery is not None
        while (event := uas.next_event()) is not None:
            match event:
                case CallOffered():
                    phone = PhoneCall(event.call)
                    self._live[event.call] = phone
                    run = self._run_app_call if self.config.webhook else self._run_call
                    self._nursery.start_soon(self._guarded, run, phone, event)
                case CallEnded(call, reason):
                    phone_call = self._live.get(call)
                    if phone_call is not None and phone_call.end_reason is None:
                        phone_call.end_reason = reason
                        phone_call.ended.set()
                case CallReoffered(call, request):
                    self._reanswer(call, request)
                case CallConfirmed(call):
                    self.counters["sip_calls_confirmed"] += 1
                case CallTransferred(call, status):
                    outcome = "completed" if status < 300 else "failed, the call goes on"
                    log.info("SIP call %s: transfer %s (%d)", call, outcome, status)
        # Taken from the core, they go out even if the task carrying them out is cancelled (a
        # connection's reader as its peer goes: the rest were other calls' answers), within
        # a second (a UDP send waits only for room in the socket's buffer).
        with trio.CancelScope(shield=True, deadline=trio.current_time() + SEND_WITHIN):
            await self._send_all(sock, uas.datagrams_to_send())
        self._timer_moved.set()

    async def _send_all(self, sock: trio.socket.SocketType, messages: list[Outgoing]) -> None:
        """What the core sends: on the connection its transaction came on (gone: dropped), else
        on the UDP socket. (A UDP request from a connection's address is answered by UDP.)"""
        for data, dest, reliable in messages:
            if reliable:  # on the connection it came on, else the host's latest; none: dropped
                stream = self._streams.get(dest) or next(
                    (s for peer, s in reversed(self._streams.items()) if peer[0] == dest[0]), None
                )
                if stream is None:
                    self.counters["sip_tcp_dropped"] += 1
                    continue
                try:
                    stream.send_nowait(data)
                except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                    self.counters["sip_tcp_dropped"] += 1
                continue
            try:
                await sock.sendto(data, dest)
            except OSError:
                self.counters["sip_send_error"] += 1

    async def _connection(
        self, stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]
    ) -> None:
        """One TCP (or TLS) connection; whatever happens to it (a reset, a TLS peer that
        just drops, a bug) ends that connection alone, never the SIP front."""
        try:
            await self._serve_connection(stream)
        except Exception as exc:  # (a group of them, too: from the connection's nursery)
            self.counters["sip_tcp_errors"] += 1
            log.debug("a SIP connection ended with %r", exc)

    async def _serve_connection(
        self, stream: trio.SocketStream | trio.SSLStream[trio.SocketStream]
    ) -> None:
        """A trunk's only (anyone else is closed at once, before any TLS handshake),
        bounded."""
        assert self.uas is not None
        tcp = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
        try:
            peer_raw = tcp.socket.getpeername()
        except OSError:  # (gone already)
            await tcp.aclose()
            return
        peer: Address = (peer_raw[0], peer_raw[1])
        if (
            self.uas.trunk_of(peer[0]) is None
            or len(self._streams) >= MAX_TCP
            or self._per_source[peer[0]] >= MAX_TCP_PER_SOURCE
        ):
            self.counters["sip_tcp_refused"] += 1
            await tcp.aclose()  # (a TLS stream: before any handshake)
            return
        send, receive = trio.open_memory_channel[bytes](TCP_QUEUE)
        self._streams[peer] = send
        self._per_source[peer[0]] += 1
        self.counters["sip_tcp_connections"] += 1
        try:
            if isinstance(stream, trio.SSLStream):  # (a trickled handshake held it 300 s)
                with trio.move_on_after(TLS_HANDSHAKE) as handshake:
                    await stream.do_handshake()
                if handshake.cancelled_caught:
                    self.counters["sip_tls_handshake_timeouts"] += 1
                    return
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer, stream, receive, nursery.cancel_scope)
                await self._reader(stream, peer, send)
                nursery.cancel_scope.cancel()
        finally:
            with trio.move_on_after(2) as closing, contextlib.suppress(*BROKEN):
                closing.shield = True
                await stream.aclose()
            self._streams.pop(peer, None)
            self._per_source[peer[0]] -= 1
            if self._per_source[peer[0]] <= 0:
                del self._per_source[peer[0]]

    async def _reader(
        self,
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
        peer: Address,
        send: trio.MemorySendChannel[bytes],
    ) -> None:
        assert self.uas is not None
        framer = sip.SipStream()
        while True:
            data: bytes | bytearray = b""
            with trio.move_on_after(TCP_IDLE) as idle:
                try:
                    data = await stream.receive_some(65536)
                except BROKEN:  # a reset, a TLS peer that drops without close_notify, ...
                    return
            if not data and idle.cancelled_caught and self.uas.carries_calls(peer):
                continue  # (idle, but our requests in its calls, a BYE, go on it: kept)
            if not data:
                return  # closed, or idle too long
            try:
                messages = framer.feed(bytes(data))
            except sip.SipError as exc:  # nothing after it can be framed: the connection goes
                self.counters[f"{exc.reason}_tcp"] += 1
                return
            if framer.pings:  # RFC 5626 §3.5.1: a pong (one a read, however many pings)
                with contextlib.suppress(trio.WouldBlock):
                    send.send_nowait(b"\r\n")
            framer.pings = 0
            for i, message in enumerate(messages, 1):
                self._feed(message, peer, reliable=True)
                if i % STREAM_BATCH == 0:  # a read of thousands of tiny messages: others run
                    await self._carry_out()
                    await trio.lowlevel.checkpoint()
            await self._carry_out()

    async def _writer(
        self,
        stream: trio.SocketStream | trio.SSLStream[trio.SocketStream],
        receive: trio.MemoryReceiveChannel[bytes],
        done: trio.CancelScope,
    ) -> None:
        try:
            async for data in receive:  # all that is queued in one write: the reader queues
                batch = [data]  # up to a batch of answers a pass of the loop
                while True:
                    try:
                        batch.append(receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await stream.send_all(b"".join(batch))
        except BROKEN:
            done.cancel()  # (the reader goes too)

    def _reanswer(self, call: str, request: sip.SipRequest) -> None:
        """Hold, resume: the call's answer again, its direction answering the new offer;
        an UPDATE with no offer (a session refresh, RFC 4028) gets a 200 with none."""
        assert self.uas is not None
        offer = request.body
        phone = self._live.get(call)
        if phone is None or phone.answer is None:
            self.uas.reject(call, 491, "Request Pending", trio.current_time())
            return
        if request.method == "UPDATE" and not offer:
            self.uas.answer(call, b"", trio.current_time())
            return
        sdp = phone.answer
        if offer:
            try:
                direction = ANSWERING.get(parse_rtp_offer(offer).direction, "inactive")
                self._same_media(phone, offer)
            except SdpError as exc:  # the call goes on as it was (RFC 3261 §14.2)
                self.counters["sip_reoffers_refused"] += 1
                log.info("SIP call %s: re-offer refused (%s)", call, exc)
                self.uas.reject(call, 488, "Not Acceptable Here", trio.current_time())
                return
            lines = [
                f"a={direction}"
                if line in ("a=sendrecv", "a=sendonly", "a=recvonly", "a=inactive")
                else line
                for line in sdp.split("\r\n")
            ]
            phone.version += 1
            sdp = "\r\n".join(lines).replace(" 1 IN IP", f" {phone.version} IN IP", 1)
        self.uas.answer(call, sdp.encode(), trio.current_time())

    @staticmethod
    def _same_media(phone: PhoneCall, offer: bytes) -> None:
        """A re-offer may change the direction (hold, resume), not the media: the call's
        codec must still be offered, and its address and security stay (the relay's flow
        and the transceiver's pin name them). `SdpError` says what changed."""
        assert phone.answer is not None
        new, ours = parse_rtp_offer(offer), parse_rtp_offer(phone.answer)
        codec = ours.codecs[ours.formats[0]]
        if codec not in new.codecs.values():
            raise SdpError(f"the call's codec ({codec[0]}) is not offered: no codec change")
        if phone.offered is not None and (new.address, new.port) != phone.offered:
            raise SdpError("a new media address: the call's flow cannot follow it")
        if new.secure != ours.secure:
            raise SdpError("SRTP cannot be switched on or off in a call")

    # -- one call --------------------------------------------------------------------------------

    async def _guarded(
        self,
        run: Callable[[PhoneCall, CallOffered], Awaitable[None]],
        phone: PhoneCall,
        offered: CallOffered,
    ) -> None:
        """One call's task: what it raises ends that call (500, or a BYE), never the SIP
        front or the other calls."""
        try:
            await run(phone, offered)
        except Exception:
            self.counters["sip_call_errors"] += 1
            log.exception("SIP call %s failed", phone.call)
            self._live.pop(phone.call, None)
            assert self.uas is not None
            now = trio.current_time()
            if not self.uas.reject(phone.call, 500, "Server Internal Error", now):
                self.uas.hangup(phone.call, now)
            await self._carry_out()

    async def _run_call(self, phone: PhoneCall, offered: CallOffered) -> None:
        uas = self.uas
        assert uas is not None
        record: CallRecord | None = None
        try:
            record = await self._place(phone, offered)
            if record is None:
                return
            if await self._watch(phone, record, None):
                record = None  # (its session is gone already)
        finally:
            self._live.pop(phone.call, None)
            if record is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(5):
                    try:
                        await self.calls.end(record)
                    except Problem:
                        pass

    async def _watch(self, phone: PhoneCall, record: CallRecord, call_id: str | None) -> bool:
        """While the call is up: until the trunk ends it (False), or its session ends on the
        edge's side, and the trunk gets a BYE (True). With `call_id` (an app's call), a
        transfer the app asked for (`refer`) is sent as it comes."""
        uas, watch = self.uas, self.watch
        assert uas is not None and watch is not None
        watched = watch.watch(record)
        try:
            while not phone.ended.is_set():
                with trio.move_on_after(self.config.poll_interval):
                    async with trio.open_nursery() as either:  # the trunk's end, or the edge's
                        for event in (phone.ended, watched.gone):
                            either.start_soon(_set_then_cancel, event, either.cancel_scope)
                if phone.ended.is_set():
                    return False
                if watched.gone.is_set():
                    gone = watched.reason
                    self.counters[
                        f"sip_ended_by_edge_{'drain' if gone == 'drain' else 'other'}"
                    ] += 1
                    log.info("call %s: session ended (%s): BYE", record.call_id, gone)
                    uas.hangup(phone.call, trio.current_time())
                    await self._carry_out()
                    return True
                if call_id is not None:
                    await self._refer_if_asked(phone, call_id)
            return False
        finally:
            watch.unwatch(watched)

    async def _refer_if_asked(self, phone: PhoneCall, call_id: str) -> None:
        current = await self.phones.get(call_id)
        if current is None or not current.refer:
            return
        if await self.phones.move(call_id, "answered", refer=""):  # (sent once)
            assert self.uas is not None
            if self.uas.refer(phone.call, current.refer, trio.current_time()):
                log.info("call %s: transfer to %s asked (REFER)", call_id, current.refer)
            else:
                log.warning("call %s: transfer to %s not sent", call_id, current.refer)
            await self._carry_out()

    async def _place(self, phone: PhoneCall, offered: CallOffered) -> CallRecord | None:
        """Ring, place the call, answer it; None if it ended first or could not be placed."""
        uas = self.uas
        assert uas is not None
        request = offered.request
        agent = sip.uri_user(request.uri)
        if agent is None or agent not in self.calls.agents:
            self.counters["sip_unknown_agent"] += 1
            uas.reject(phone.call, 404, "Not Found", trio.current_time())
            await self._carry_out()
            return None
        uas.ring(phone.call)
        await self._carry_out()
        try:
            record, answer = await self.calls.create(
                CallRequest(
                    offer=OfferBody(request.body.decode("utf-8", "replace"), ""),
                    agent=agent,
                    principal=Principal(kind="sip", tenant=offered.trunk),
                    region_header=None,
                    client_ip=offered.source[0],
                    media="rtp",
                    record=offered.trunk in self.config.record,
                )
            )
        except Problem as problem:
            status, reason = STATUS_OF_PROBLEM.get(problem.status, (500, "Server Internal Error"))
            self.counters[f"sip_refused_{status}"] += 1
            log.info("call from trunk %s refused %d: %s", offered.trunk, status, problem.reason)
            uas.reject(phone.call, status, reason, trio.current_time())
            await self._carry_out()
            return None
        if phone.ended.is_set():  # cancelled while it was being placed
            await self._end_quietly(record)
            return None
        phone.answer = answer
        phone.offered = _media_address(request.body)
        uas.answer(phone.call, answer.encode(), trio.current_time())
        await self._carry_out()
        self.counters["sip_calls_answered"] += 1
        log.info("call %s: SIP call %s answered (agent %s)", record.call_id, phone.call, agent)
        return record

    # -- OpenAI's SIP flow: the app decides ------------------------------------------------------

    async def _run_app_call(self, phone: PhoneCall, offered: CallOffered) -> None:
        """Ring, tell the app, wait for its word (`SipCalls`), then carry the call as above."""
        uas = self.uas
        assert uas is not None
        request = offered.request
        call_id = "rtc_" + secrets.token_hex(16)
        ringing = PhoneRecord(
            call_id,
            offer=request.body.decode("utf-8", "replace"),
            trunk=offered.trunk,
            source=offered.source[0],
            uri=request.uri,
        )
        record: CallRecord | None = None
        answered = False
        try:
            await self.phones.put(ringing)
            uas.ring(phone.call)
            await self._carry_out()
            if not await self._tell_app(call_id, request, phone.ended):
                if await self.phones.move(call_id, "ringing", state="ended"):
                    return  # (the finally tells the trunk: 480)
            decided = await self._decision(phone, call_id)
            if decided is None:
                return
            if decided.state == "rejected":
                uas.reject(phone.call, decided.status, "Rejected", trio.current_time())
                await self._carry_out()
                return
            record = await self.calls.store.get(call_id)
            if phone.ended.is_set() or record is None:
                # ended while the app's accept placed it (the finally ends the session), or
                # the app hung up as it accepted (the finally tells the trunk)
                return
            phone.answer = decided.answer
            phone.offered = _media_address(request.body)
            uas.answer(phone.call, decided.answer.encode(), trio.current_time())
            answered = True
            await self._carry_out()
            self.counters["sip_calls_answered"] += 1
            log.info("call %s: SIP call %s accepted by its app", call_id, phone.call)
            if await self._watch(phone, record, call_id):
                record = None  # (its session is gone already)
        finally:
            self._live.pop(phone.call, None)
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                if not answered and not phone.ended.is_set():
                    # Still ringing, with no answer to come (the webhook failed, the app hung
                    # up as it accepted, or this task is cancelled): the trunk hears 480 now,
                    # not at its ring timeout (a call already rejected is not again).
                    if uas.hangup(phone.call, trio.current_time()):
                        self.counters["sip_calls_given_up"] += 1
                    await self._carry_out()
                await self.phones.move(call_id, "ringing", state="ended")  # (if it still rings)
                # its record goes with the call: a trunk's INVITEs and CANCELs leave nothing
                # behind (an accept still placing it then fails its move and ends it)
                await self.phones.delete(call_id)
                if record is not None:
                    try:
                        await self.calls.end(record)
                    except Problem:
                        pass

    async def _decision(self, phone: PhoneCall, call_id: str) -> PhoneRecord | None:
        """The app's word (`answered` or `rejected`), or None: the call ended first (a
        CANCEL, the ring timeout), and no accept can take it any more."""
        give_up_at = math.inf
        while True:
            with trio.move_on_after(DECISION_POLL):
                await phone.ended.wait()
            if phone.ended.is_set():
                if await self.phones.move(call_id, "ringing", state="ended"):
                    return None
                # an accept is placing it (on some replica): its word comes, or, past
                # `ACCEPTING_MAX` (that replica gone?), the call is over anyway
                give_up_at = min(give_up_at, trio.current_time() + ACCEPTING_MAX)
                if trio.current_time() > give_up_at:
                    return None
                await trio.sleep(DECISION_POLL)  # (not a busy loop)
            try:
                decided = await self.phones.get(call_id, strict=True)
            except StoreUnavailable:  # (a blip is not a verdict: look again; the ring is
                self.counters["sip_decision_unreadable"] += 1  # bounded by its timeout)
                continue
            if decided is None or decided.state == "ended":
                return None
            if decided.state in ("answered", "rejected"):
                return decided
            # ringing, or accepted: the app's accept is placing it (on some replica)

    async def _tell_app(self, call_id: str, request: sip.SipRequest, ended: trio.Event) -> bool:
        """POST `realtime.call.incoming` to the webhook, signed (Standard Webhooks); a
        failure is retried (a fresh signature each time), at most `WEBHOOK_ATTEMPTS`, and
        not once the call has `ended`. Each post has `WEBHOOK_TIMEOUT` in all, and only its
        status is read: a receiver that trickled its answer, or sent a huge one, had held a
        connection of the pool placement uses for as long as it liked (512 ringing calls
        held all of it) and up to its whole body in memory (300 MiB: +600 MB)."""
        assert self.config.webhook is not None and self.http is not None
        headers = webhook_headers(request)
        event_id = "evt_" + secrets.token_hex(12)
        body = json.dumps(
            {
                "object": "event",
                "id": event_id,
                "type": "realtime.call.incoming",
                "created_at": int(time.time()),
                "data": {"call_id": call_id, "sip_headers": headers},
            }
        )
        for attempt in range(WEBHOOK_ATTEMPTS):
            if ended.is_set():
                return False
            signed = sign_webhook(self.config.webhook_secret or "", event_id, body)
            status = 0
            with trio.move_on_after(WEBHOOK_TIMEOUT):
                try:
                    post = self.http.build_request(
                        "POST",
                        self.config.webhook,
                        content=body,
                        headers={"Content-Type": "application/json", **signed},
                        timeout=WEBHOOK_TIMEOUT,
                    )
                    resp = await self.http.send(post, stream=True)
                    status = resp.status_code
                    await resp.aclose()
                except httpx.HTTPError:
                    pass
            if 200 <= status < 300:
                self.counters["sip_webhooks_delivered"] += 1
                return True
            self.counters["sip_webhook_failures"] += 1
            with trio.move_on_after(0.5 * 2**attempt):
                await ended.wait()
        log.warning("call %s: the webhook %s did not take the event", call_id, self.config.webhook)
        return False

    async def _end_quietly(self, record: CallRecord) -> None:
        try:
            await self.calls.end(record)
        except Problem:
            pass


def sign_webhook(secret: str, event_id: str, body: str, now: float | None = None) -> dict[str, str]:
    """Standard Webhooks headers for `body` (as OpenAI signs its webhooks, and as
    `openai`'s `webhooks.unwrap` checks them): HMAC-SHA256 over `id.timestamp.body` with the
    secret (`whsec_` + base64 of the key, or the key's own text), base64, `v1,` in front."""
    key = base64.b64decode(secret[6:]) if secret.startswith("whsec_") else secret.encode()
    timestamp = str(int(time.time() if now is None else now))
    digest = hmac.new(key, f"{event_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return {
        "webhook-id": event_id,
        "webhook-timestamp": timestamp,
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }


async def _set_then_cancel(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def _media_address(sdp: bytes) -> tuple[str, int] | None:
    try:
        offer = parse_rtp_offer(sdp)
    except SdpError:
        return None
    return offer.address, offer.port
