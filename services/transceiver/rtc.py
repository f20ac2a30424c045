"""The asyncio boundary: the only module of firsthop that imports asyncio, aiortc or aioice.

Each session is a stock `RTCPeerConnection(RTCConfiguration(iceServers=[]))` with four hooks
into aioice's `Connection` (pinned versions; `tests/unit/test_rtc_hooks.py` fails loudly if an
upgrade moves them):

* the local ufrag/pwd (`_local_username`, `_local_password`) are set to the route token and
  a fresh password after the offer is applied and before the answer is made;
* `get_component_candidates` creates no socket: it gives aioice a `StunProtocol` on a
  `VirtualTransport` whose `sendto` frames the datagram onto the process's ONE shared UDP
  socket, and returns the relay ingress address(es) as host candidates;
* `check_start` and `connect` are replaced by ICE-lite behaviour (RFC 8445 §2.5): aioice
  sends no connectivity check; the session's `LiteIce` (`ice_lite.py`) has authenticated
  every check aioice sees and says which path is selected. A pair to the selected address
  succeeds and is taken as nominated when its check arrives (setup waits neither on a server
  check racing the answer nor on the caller's nomination round); a pair to any other address
  waits, in progress, until `LiteIce` has validated that address (`select_path`). So media
  never goes to an address that has not proved it is the caller;
* `query_consent` does nothing: consent is the caller's job towards a lite agent (RFC 7675);
  the transceiver watches the caller's checks instead.

The process runs an asyncio host loop with Trio as a guest (`trio.lowlevel.start_guest_run`),
so Trio code calls into this module synchronously on the same thread; `call_asyncio` awaits an
asyncio coroutine from Trio, and callbacks out of this module go through the Trio token.
"""

from __future__ import annotations

import array
import asyncio
import fractions
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aioice
import aioice.ice
import pylibsrtp
import trio
from aioice.candidate import candidate_foundation, candidate_priority
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCPeerConnection,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame, CodecContext, Packet
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)

from services.transceiver.jitter import LowLatencyJitterBuffer
from services.transceiver.pacing import FRAME_SAMPLES, SAMPLE_RATE, OutputQueue

log = logging.getLogger("firsthop.transceiver.rtc")

Address = tuple[str, int]
T = TypeVar("T")

MAX_RECEIVE_QUEUE = 256  # datagrams waiting for DTLS/SRTP in one session


TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
OPUS_BITRATE = 48000  # mono voice
LATE_GRACE = 0.008  # seconds a mid-speech frame may be late before silence fills its slot
OPUS_SILENCE = b"\xf8\xff\xfe"  # one 20 ms CELT frame of silence (RFC 6716 §3.1 TOC 0xf8)

# -- calling between Trio and asyncio on one thread ---------------------------------------


async def call_asyncio(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the asyncio host loop and await it from Trio (guest mode)."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    future = asyncio.ensure_future(coro)
    future.add_done_callback(lambda _: token.run_sync_soon(done.set))
    try:
        await done.wait()
    except trio.Cancelled:
        future.cancel()
        raise
    return future.result()


def run_trio_guest(
    trio_main: Callable[[], Awaitable[Any]],
) -> Any:
    """Run `trio_main` in Trio guest mode on a fresh asyncio host loop; return its result."""

    async def host() -> Any:
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[Any] = loop.create_future()

        def done(outcome: Any) -> None:
            if not finished.done():
                finished.set_result(outcome)

        trio.lowlevel.start_guest_run(
            trio_main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=done,
            host_uses_signal_set_wakeup_fd=True,
        )
        outcome = await finished
        return outcome.unwrap()

    return asyncio.run(host())


def watch_readable(sock: socket.socket, callback: Callable[[], None]) -> Callable[[], None]:
    """Call `callback` on the asyncio host loop whenever `sock` is readable; returns the
    function that stops it. (Called from Trio in guest mode: same thread, same loop.)"""
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    loop.add_reader(fd, callback)

    def stop() -> None:
        loop.remove_reader(fd)

    return stop


# -- the agent link ------------------------------------------------------------------------


class AgentLinkError(Exception):
    pass


class AgentLink:
    """One session's WebSocket to its agent (§8), driven on the asyncio host loop.

    Frames flow every 20 ms each way for the whole call, so the link runs where the media
    does: wsproto on a non-blocking socket with a loop reader, no task switch per frame
    (measured: trio-websocket in Trio's guest run cost ~200 µs a message, about a fifth of
    the transceiver's main thread). Trio still owns the link's lifecycle in `session.py`:
    it connects it, waits for `closed`, reconnects with backoff and closes it.
    """

    MAX_MESSAGE = 1 << 20
    MAX_BACKLOG = 1 << 20  # bytes waiting for a slow agent before the link is dropped

    def __init__(
        self,
        url: str,
        *,
        on_binary: Callable[[bytes], None],
        on_text: Callable[[str], None],
        on_closed: Callable[[str], None],
    ) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        if parts.scheme != "ws" or not parts.hostname:
            raise AgentLinkError(f"agent URL must be ws://host:port[/path], got {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.on_binary, self.on_text, self.on_closed = on_binary, on_text, on_closed
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock: socket.socket | None = None
        self.open = False
        self._out = bytearray()
        self._partial: list[bytes | str] = []
        self._partial_size = 0

    async def connect(self) -> None:
        """Open the socket and do the WebSocket handshake (wrap in a timeout)."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await loop.sock_connect(sock, addr)
            host = f"{self.host}:{self.port}"
            await loop.sock_sendall(sock, self.ws.send(Request(host=host, target=self.target)))
            while not self.open:
                data = await loop.sock_recv(sock, 65536)
                if not data:
                    raise AgentLinkError("agent closed during the handshake")
                self.ws.receive_data(data)
                for event in self.ws.events():
                    if isinstance(event, AcceptConnection):
                        self.open = True
                    elif isinstance(event, RejectConnection):
                        raise AgentLinkError(f"agent refused the WebSocket ({event.status_code})")
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        loop.add_reader(sock.fileno(), self._readable)

    def send_bytes(self, data: bytes) -> bool:
        return self._send(self.ws.send(BytesMessage(data=data))) if self.open else False

    def send_text(self, text: str) -> bool:
        return self._send(self.ws.send(TextMessage(data=text))) if self.open else False

    def _send(self, data: bytes) -> bool:
        sock = self.sock
        assert sock is not None
        if self._out:
            self._out += data
        else:
            try:
                sent = sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                self._fail(f"send failed: {exc}")
                return False
            if sent < len(data):
                self._out += data[sent:]
                asyncio.get_running_loop().add_writer(sock.fileno(), self._writable)
        if len(self._out) > self.MAX_BACKLOG:
            self._fail("agent too slow: send backlog over 1 MiB")
            return False
        return True

    def _writable(self) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            sent = sock.send(self._out)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(f"send failed: {exc}")
            return
        del self._out[:sent]
        if not self._out:
            asyncio.get_running_loop().remove_writer(sock.fileno())

    def _readable(self) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(f"receive failed: {exc}")
            return
        if not data:
            self._fail("agent closed the connection")
            return
        try:
            self.ws.receive_data(data)
            events = list(self.ws.events())
        except Exception as exc:  # wsproto raises on protocol violations
            self._fail(f"bad WebSocket data: {exc}")
            return
        for event in events:
            if isinstance(event, (BytesMessage, TextMessage)):
                chunk = bytes(event.data) if isinstance(event.data, bytearray) else event.data
                self._partial.append(chunk)
                self._partial_size += len(event.data)
                if self._partial_size > self.MAX_MESSAGE:
                    self._fail("agent message over 1 MiB")
                    return
                if event.message_finished:
                    parts, self._partial, self._partial_size = self._partial, [], 0
                    if isinstance(event, BytesMessage):
                        self.on_binary(b"".join(p for p in parts if isinstance(p, bytes)))
                    else:
                        self.on_text("".join(p for p in parts if isinstance(p, str)))
            elif isinstance(event, Ping):
                self._send(self.ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                if self.ws.state is ConnectionState.REMOTE_CLOSING:
                    self._send(self.ws.send(event.response()))
                self._fail(f"agent closed the WebSocket ({event.code})")
                return

    def _fail(self, reason: str) -> None:
        if self.sock is not None:
            self._teardown()
            self.on_closed(reason)

    def _teardown(self) -> None:
        sock, self.sock, self.open = self.sock, None, False
        if sock is None:
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(sock.fileno())
        loop.remove_writer(sock.fileno())
        sock.close()

    def close(self) -> None:
        """Say goodbye (a close frame, best effort) and drop the connection; no callback."""
        if self.sock is not None and self.open:
            try:
                self.sock.send(self.ws.send(CloseConnection(code=1000)))
            except (OSError, Exception):
                pass
        self._teardown()


# -- the shared socket, seen from aioice ----------------------------------------------------


class VirtualTransport(asyncio.DatagramTransport):
    """A datagram transport with no socket of its own: `sendto` goes through `send`."""

    def __init__(self, send: Callable[[bytes, Address], None], sockname: Address) -> None:
        super().__init__()
        self._send = send
        self._sockname = sockname
        self._protocol: asyncio.DatagramProtocol | None = None
        self._closing = False

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        assert isinstance(protocol, asyncio.DatagramProtocol)
        self._protocol = protocol

    def get_protocol(self) -> asyncio.BaseProtocol:
        assert self._protocol is not None
        return self._protocol

    def sendto(self, data: bytes | bytearray | memoryview, addr: Any = None) -> None:
        if not self._closing and addr is not None:
            self._send(bytes(data), (addr[0], addr[1]))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._sockname if name == "sockname" else default

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        # aioice's StunProtocol.close() waits for connection_lost: without it, close hangs.
        if not self._closing:
            self._closing = True
            if self._protocol is not None:
                self._protocol.connection_lost(None)

    def abort(self) -> None:
        self.close()


# -- audio tracks -------------------------------------------------------------------------


def stereo_to_mono(frame: AudioFrame) -> bytes:
    """PCM16 mono from a decoded frame (aiortc's Opus decoder gives packed s16 stereo)."""
    data = bytes(frame.planes[0])[: frame.samples * 2 * len(frame.layout.channels)]
    if len(frame.layout.channels) == 1:
        return data
    samples = array.array("h")
    samples.frombytes(data)
    return samples[::2].tobytes()


class AgentAudioTrack(MediaStreamTrack):
    """The agent's voice: 20 ms PCM16 mono frames paced at real time (see `pacing.py`),
    silence when the queue is empty."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.out = OutputQueue()
        self.frames_out = 0
        self.first_audio_at: float | None = None
        self.on_first_audio: Callable[[], None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._codec = CodecContext.create("libopus", "w")
        self._codec.bit_rate = OPUS_BITRATE
        self._codec.format = "s16"
        self._codec.layout = "mono"
        self._codec.sample_rate = SAMPLE_RATE
        self._codec.time_base = TIME_BASE
        self._codec.options = {"application": "voip", "frame_duration": "20"}

    @property
    def dropped(self) -> int:
        return self.out.dropped_full

    def push(self, pcm: bytes) -> None:
        self.out.push(pcm)
        waiter = self._waiter
        if waiter is not None and not waiter.done() and self.out.frames:
            waiter.set_result(None)

    def clear(self) -> None:
        self.out.clear()

    async def recv(self) -> Packet:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        out = self.out
        deadline = out.next_deadline(loop.time())
        wait = deadline - loop.time()
        if wait > 0:
            if out.may_start_early():
                # Idle: sleep to the tick, but agent audio arriving first goes out at once.
                await self._wait_for_frame(loop, deadline)
                if out.frames and loop.time() < deadline:
                    out.rephase(loop.time())
            else:
                await asyncio.sleep(wait)
        if not out.frames and not out.idle:
            # Mid-speech and the next frame is not here yet: give it a moment before playing
            # silence (a gap), keeping the clock, so the next tick catches up.
            await self._wait_for_frame(loop, loop.time() + LATE_GRACE)
        pcm = out.pop()
        payload = OPUS_SILENCE
        if pcm is not None:
            self.frames_out += 1
            if self.first_audio_at is None:
                self.first_audio_at = time.monotonic()
                if self.on_first_audio is not None:
                    self.on_first_audio()
            payload = self._encode(pcm, out.pts)
        # Hand aiortc an encoded packet: it then only packs it (no resampling, no executor
        # hop, no pure-Python audio-level pass over the frame).
        packet = Packet(payload)
        packet.pts = out.pts
        packet.time_base = TIME_BASE
        return packet

    async def _wait_for_frame(self, loop: asyncio.AbstractEventLoop, until: float) -> None:
        """Sleep until `until`, or until the agent's next frame arrives if sooner."""
        waiter = self._waiter = loop.create_future()
        timer = loop.call_at(until, _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _encode(self, pcm: bytes, pts: int) -> bytes:
        """Opus-encode one mono 20 ms frame (a mono Opus stream is valid in the negotiated
        opus/48000/2, RFC 7587 §3.4)."""
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(pcm)
        frame.pts = pts
        frame.sample_rate = SAMPLE_RATE
        frame.time_base = TIME_BASE
        packets = self._codec.encode(frame)
        return bytes(packets[0]) if packets else OPUS_SILENCE


def _nominate(conn: aioice.Connection, pair: aioice.ice.CandidatePair) -> None:
    conn.check_state(pair, aioice.ice.CandidatePair.State.SUCCEEDED)
    pair.nominated = True
    conn.check_complete(pair)  # moves `_nominated`, which is where aioice sends


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _decoder_sink(receiver: Any) -> Callable[[Any], None]:
    """Feed released frames straight to the receiver's decoder thread, as aiortc's own
    receive path does with the one frame its jitter buffer returns."""

    def sink(frame: Any) -> None:
        if receiver._RTCRtpReceiver__decoder_thread is None:
            return
        codec = receiver._RTCRtpReceiver__codecs.get(frame.payload_type)
        if codec is None:
            return
        frame.timestamp = receiver._RTCRtpReceiver__timestamp_mapper.map(frame.timestamp)
        receiver._RTCRtpReceiver__decoder_queue.put((codec, frame))

    return sink


# -- one session --------------------------------------------------------------------------


@dataclass
class SessionCallbacks:
    """What a session reports back (called on the loop thread, from asyncio context)."""

    audio: Callable[[bytes], None]
    state: Callable[[str], None]
    event: Callable[[str], None]
    selected: Callable[[], Address | None]  # the media path `LiteIce` chose, if any
    milestone: Callable[[str], None]
    count: Callable[[str], None]


class CountingSrtp:
    """Wraps a receive-side pylibsrtp session to count auth and replay failures, which
    aiortc only logs at debug level and drops."""

    def __init__(self, inner: Any, count: Callable[[str], None]) -> None:
        self._inner = inner
        self._count = count

    def _failed(self, exc: Exception) -> None:
        text = str(exc).lower()
        self._count("srtp_replay_fail" if "replay" in text else "srtp_auth_fail")

    def unprotect(self, data: bytes) -> bytes:
        try:
            return bytes(self._inner.unprotect(data))
        except pylibsrtp.Error as exc:
            self._failed(exc)
            raise

    def unprotect_rtcp(self, data: bytes) -> bytes:
        try:
            return bytes(self._inner.unprotect_rtcp(data))
        except pylibsrtp.Error as exc:
            self._failed(exc)
            raise


@dataclass
class RtcSession:
    ufrag: str
    pwd: str
    candidates: list[Address]  # the relay ingress address(es) advertised in the answer
    send: Callable[[bytes, Address], None]  # frames and sends one datagram to a client
    callbacks: SessionCallbacks
    pc: RTCPeerConnection = field(init=False)
    output: AgentAudioTrack = field(init=False)
    protocol: aioice.ice.StunProtocol | None = field(init=False, default=None)
    channel: Any = field(init=False, default=None)
    _tasks: set[asyncio.Task[None]] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.output = AgentAudioTrack()
        self.output.on_first_audio = lambda: self.callbacks.milestone("first_audio_out")
        self.pc.on("connectionstatechange", self._on_state)
        self.pc.on("iceconnectionstatechange", self._on_ice_state)
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)

    # -- setup -----------------------------------------------------------------------------

    async def answer(self, offer_sdp: str) -> str:
        """Apply the offer (candidates already stripped) and return the answer SDP."""
        await self.pc.setRemoteDescription(RTCSessionDescription(offer_sdp, "offer"))
        self.pc.addTrack(self.output)
        for ice in self.ice_transports():
            self._hook(ice._connection)
        for transceiver in self.pc.getTransceivers():
            if transceiver.kind == "audio":
                receiver: Any = transceiver.receiver
                receiver._RTCRtpReceiver__jitter_buffer = LowLatencyJitterBuffer(
                    sink=_decoder_sink(receiver)
                )
        answer = await self.pc.createAnswer()
        await self.pc.setLocalDescription(answer)
        dtls = [t.receiver.transport for t in self.pc.getTransceivers()]
        for transport in dtls:
            transport.on("statechange", self._make_dtls_watch(transport))
        return str(self.pc.localDescription.sdp)

    def ice_transports(self) -> list[Any]:
        pc: Any = self.pc
        transports: set[Any] = pc._RTCPeerConnection__iceTransports
        return list(transports)

    def _hook(self, conn: aioice.Connection) -> None:
        conn._local_username = self.ufrag
        conn._local_password = self.pwd
        session = self

        async def get_component_candidates(
            component: int,
            addresses: list[str],
            timeout: int = 5,  # noqa: ASYNC109
        ) -> list[aioice.Candidate]:
            transport = VirtualTransport(session.send, session.candidates[0])
            protocol = aioice.ice.StunProtocol(conn)
            transport.set_protocol(protocol)
            protocol.connection_made(transport)
            candidates = []
            for host, port in session.candidates:
                candidates.append(
                    aioice.Candidate(
                        foundation=candidate_foundation("host", "udp", host),
                        component=component,
                        transport="udp",
                        priority=candidate_priority(component, "host"),
                        host=host,
                        port=port,
                        type="host",
                    )
                )
            protocol.local_candidate = candidates[0]
            conn._protocols.append(protocol)
            session.protocol = protocol
            return candidates

        async def lite_check_start(pair: aioice.ice.CandidatePair) -> None:
            # RFC 8445 §2.5 / §7.3.1.4: a lite agent sends no check; the caller's
            # authenticated check on this pair (it just arrived) makes it valid if it is on
            # the selected path. It is also taken as nominated at once: waiting for the
            # caller's USE-CANDIDATE costs a whole ping interval (~50 ms with Chromium)
            # before DTLS may start. A pair to another address stays in progress (so
            # USE-CANDIDATE on it moves nothing) until `select_path` after validation.
            if pair.remote_addr == session.callbacks.selected():
                _nominate(conn, pair)
            else:
                conn.check_state(pair, aioice.ice.CandidatePair.State.IN_PROGRESS)

        async def lite_connect() -> None:
            # A lite agent paces no checks (aioice's connect() polls every 20 ms for that):
            # replay the checks that came before connect(), then wait for the check list.
            if not conn._local_candidates_end:
                raise ConnectionError("Local candidates gathering was not performed")
            conn._early_checks_done = True
            for early_check in conn._early_checks:
                conn.check_incoming(*early_check)
            conn._early_checks.clear()
            if await conn._check_list_state.get() != aioice.ice.ICE_COMPLETED:
                raise ConnectionError("ICE negotiation failed")

        async def no_consent_checks() -> None:
            await asyncio.Event().wait()

        conn.get_component_candidates = get_component_candidates  # type: ignore[method-assign]
        conn.check_start = lite_check_start  # type: ignore[method-assign]
        conn.connect = lite_connect  # type: ignore[method-assign]
        conn.query_consent = no_consent_checks  # type: ignore[method-assign]

    def select_path(self, addr: Address) -> bool:
        """Send the media to `addr`, a path `LiteIce` has validated; False if ICE has no
        pair to it (yet: a check held back until `connect()` nominates it then)."""
        found = False
        for ice in self.ice_transports():
            conn = ice._connection
            for pair in conn._check_list:
                if pair.remote_addr == addr:
                    _nominate(conn, pair)
                    found = True
                    break
        return found

    def forget_path(self, addr: Address) -> None:
        """Drop ICE's pairs to a path `LiteIce` let go of, and their peer-reflexive
        candidates, so a session's ICE state stays bounded however often the caller moves."""
        for ice in self.ice_transports():
            conn = ice._connection
            nominated = list(conn._nominated.values())
            gone = [p for p in conn._check_list if p.remote_addr == addr and p not in nominated]
            if not gone:
                continue
            conn._check_list = [p for p in conn._check_list if p not in gone]
            kept = {id(p.remote_candidate) for p in conn._check_list}
            dropped = {
                id(p.remote_candidate)
                for p in gone
                if p.remote_candidate.type == "prflx" and id(p.remote_candidate) not in kept
            }
            conn._remote_candidates = [c for c in conn._remote_candidates if id(c) not in dropped]

    def restart_ice(self, ufrag: str, pwd: str, remote_ufrag: str, remote_pwd: str) -> None:
        """ICE restart (RFC 8445 §9): new credentials both ways; DTLS and SRTP carry on."""
        self.ufrag, self.pwd = ufrag, pwd
        for ice in self.ice_transports():
            conn = ice._connection
            conn._local_username = ufrag
            conn._local_password = pwd
            conn.remote_username = remote_ufrag
            conn.remote_password = remote_pwd

    # -- datagrams from the shared socket --------------------------------------------------

    def datagram_received(self, data: bytes, addr: Address) -> bool:
        """Hand one datagram to ICE; False if it was dropped because the session's receive
        queue is full (aioice's own queue is unbounded)."""
        protocol = self.protocol
        if protocol is None:
            return False
        if data[0] > 3 and protocol.receiver._queue.qsize() >= MAX_RECEIVE_QUEUE:
            return False
        protocol.datagram_received(data, addr)
        return True

    # -- events ------------------------------------------------------------------------------

    def _on_state(self) -> None:
        self.callbacks.state(self.pc.connectionState)

    def _on_ice_state(self) -> None:
        if self.pc.iceConnectionState == "completed":
            self.callbacks.milestone("ice_connected")

    def _make_dtls_watch(self, transport: Any) -> Callable[[], None]:
        def watch() -> None:
            if transport.state == "connected":
                self.callbacks.milestone("dtls_connected")
                if transport._rx_srtp is not None:
                    transport._rx_srtp = CountingSrtp(transport._rx_srtp, self.callbacks.count)
            elif transport.state == "failed":
                self.callbacks.milestone("dtls_failed")

        return watch

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._spawn(self._read_audio(track))

    async def _read_audio(self, track: MediaStreamTrack) -> None:
        first = True
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            if first:
                first = False
                self.callbacks.milestone("first_rtp_in")
            assert isinstance(frame, AudioFrame)
            self.callbacks.audio(stereo_to_mono(frame))

    def _on_datachannel(self, channel: Any) -> None:
        self.channel = channel

        @channel.on("message")
        def on_message(message: Any) -> None:
            if isinstance(message, str):
                self.callbacks.event(message)
            else:
                self.callbacks.event("\x00binary")

        # A channel the caller opened is announced once open (DCEP, RFC 8832).
        self.callbacks.milestone("datachannel_open")

    def send_event(self, text: str) -> bool:
        channel = self.channel
        if channel is None or channel.readyState != "open":
            return False
        channel.send(text)
        return True

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self.output.stop()
        await self.pc.close()


def hook_points() -> dict[str, bool]:
    """Whether every aiortc/aioice internal this module relies on is where we expect it."""
    from aiortc.rtcdtlstransport import RTCDtlsTransport

    conn = aioice.Connection(ice_controlling=False)
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio")
    receiver = pc.getTransceivers()[0].receiver
    return {
        "Connection._local_username": hasattr(conn, "_local_username"),
        "Connection._local_password": hasattr(conn, "_local_password"),
        "Connection._protocols": hasattr(conn, "_protocols"),
        "Connection.get_component_candidates": hasattr(conn, "get_component_candidates"),
        "Connection.check_start": hasattr(conn, "check_start"),
        "Connection.check_state": hasattr(conn, "check_state"),
        "Connection.check_complete": hasattr(conn, "check_complete"),
        "Connection._check_list": hasattr(conn, "_check_list"),
        "Connection._remote_candidates": hasattr(conn, "_remote_candidates"),
        "Connection._nominated": hasattr(conn, "_nominated"),
        "Connection.query_consent": hasattr(conn, "query_consent"),
        "Connection.connect": hasattr(conn, "connect"),
        "Connection._check_list_state": hasattr(conn, "_check_list_state"),
        "Connection._early_checks": hasattr(conn, "_early_checks"),
        "Connection._early_checks_done": hasattr(conn, "_early_checks_done"),
        "Connection._local_candidates_end": hasattr(conn, "_local_candidates_end"),
        "ice.ICE_COMPLETED": hasattr(aioice.ice, "ICE_COMPLETED"),
        "StunProtocol.datagram_received": hasattr(aioice.ice.StunProtocol, "datagram_received"),
        "Connection._queue": hasattr(conn, "_queue"),
        "RTCDtlsTransport._rx_srtp": "_rx_srtp" in RTCDtlsTransport.__init__.__code__.co_names,
        "RTCPeerConnection.__iceTransports": hasattr(pc, "_RTCPeerConnection__iceTransports"),
        **{
            f"RTCRtpReceiver.{name}": hasattr(receiver, f"_RTCRtpReceiver{name}")
            for name in (
                "__jitter_buffer",
                "__decoder_thread",
                "__decoder_queue",
                "__codecs",
                "__timestamp_mapper",
            )
        },
    }
