"""Every reach into aiortc's and aioice's private parts, in one place, with its version check.

firsthop uses stock `RTCPeerConnection`s, bent in a few documented places to be an ICE-lite
agent on one shared socket (RFC 8445 §2.5). Each bend is a function here; nothing else in the
project touches a private attribute of aiortc or aioice. They hold for the pinned minors
(`PINNED`, also pinned in pyproject.toml): `check_pinned_versions` refuses to run on others,
and `hook_points` (asserted by a test) says whether every attribute used is where expected.

The bends, per ICE connection (`make_lite`):

* local credentials: `_local_username`/`_local_password` are set to the session's route token
  and password after the offer is applied and before the answer is made (and on ICE restart);
* `get_component_candidates` creates no socket: it gives aioice a `StunProtocol` on a
  `VirtualTransport` whose `sendto` frames the datagram onto the process's ONE shared UDP
  socket, and returns the relay ingress address(es) as host candidates (and its ICE-TCP
  ingress, if any, as `tcptype passive` host candidates of lower priority, RFC 6544 §4.2:
  the caller connects to the relay, whose frames reach this same socket as datagrams, so
  aioice never pairs them; they are only written into the answer);
* `check_start` and `connect` become ICE-lite: aioice sends no connectivity check. Every check
  it sees has been authenticated by the session table, which also says which path is
  selected: a pair to the selected address succeeds and is nominated when its check arrives
  (setup waits neither on a server check racing the answer nor on the caller's nomination
  round); a pair to another address waits, in progress, until the table has validated that
  address (`select_path`). So media never goes to an address that did not prove it is the
  caller;
* `query_consent` does nothing: consent is the caller's job towards a lite agent (RFC 7675);
  the session table watches the caller's checks instead.

And per receiver and DTLS transport: a zero-delay jitter buffer feeding the decoder thread
straight (`low_latency_receiver`), and SRTP failures counted (`count_srtp_failures`).

And per session, its media in-line (`media_path`): a non-STUN datagram skips aioice's STUN
parse, and SRTP/SRTCP is unprotected and handled on the spot, as the DTLS transport's task
would, instead of through aioice's queue and a task wake-up per packet.

And per peer connection and DTLS transport, in `dtls_hooks.py` (under the same version check,
its reaches in `hook_points` too): DTLS with peers that have RSA certificates
(`dtls_for_any_peer`), and a close that makes a browser's connection fail at once
(`close_with_renegotiation`). And per SCTP association, in `sctp_hooks.py`: bounds on what a
caller's data channels make aiortc keep (`bound_sctp`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import aioice
import aioice.ice
import aiortc
import aiortc.clock
import aiortc.rtcdtlstransport
import aiortc.rtp
import pylibsrtp
from aioice.candidate import candidate_foundation, candidate_priority
from aiortc import (
    RTCConfiguration,
    RTCPeerConnection,
    RTCRtpReceiver,
)

from firsthop.services.transceiver.media.jitter import Frame, LowLatencyJitterBuffer
from firsthop.services.transceiver.rtc import dtls_hooks, sctp_hooks
from firsthop.shared.address import Address

PINNED = {"aiortc": "1.16.", "aioice": "0.13."}


def check_pinned_versions() -> None:
    """Refuse to run on aiortc/aioice versions the hooks were not checked against."""
    found = {"aiortc": aiortc.__version__, "aioice": aioice.__version__}
    for name, prefix in PINNED.items():
        if not found[name].startswith(prefix):
            raise RuntimeError(
                f"{name} {found[name]} is installed; firsthop's hooks are checked against "
                f"{prefix}x only (see services/transceiver/rtc/hooks.py)"
            )


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


# -- ICE ----------------------------------------------------------------------------------


def ice_connections(pc: RTCPeerConnection) -> list[aioice.Connection]:
    transports: set[Any] = pc._RTCPeerConnection__iceTransports  # type: ignore[attr-defined]
    return [t._connection for t in transports]


def set_credentials(
    conn: aioice.Connection,
    local: tuple[str, str],
    remote: tuple[str, str] | None = None,
) -> None:
    """Our (ufrag, password), and the caller's once known (RFC 8445 §5.3)."""
    conn._local_username, conn._local_password = local
    if remote is not None:
        conn.remote_username, conn.remote_password = remote


# RFC 6544 §4.2: local preference = 2^13 * direction-pref + other-pref, with passive's
# direction-pref of 4 (below active's 6; we are never active), which ranks them under the
# UDP host candidate's 65535: a caller that can use UDP does.
TCP_PASSIVE_LOCAL_PREF = (1 << 13) * 4 + 8191


def make_lite(
    conn: aioice.Connection,
    *,
    candidates: list[Address],
    tcp_candidates: list[Address] | None = None,
    send: Callable[[bytes, Address], None],
    selected: Callable[[], Address | None],
) -> Callable[[], aioice.ice.StunProtocol | None]:
    """Bend `conn` into an ICE-lite agent on the shared socket (see the module docstring).
    Returns a function giving its `StunProtocol` once candidates are gathered."""
    state: dict[str, aioice.ice.StunProtocol] = {}

    async def get_component_candidates(
        component: int,
        addresses: list[str],
        timeout: int = 5,  # noqa: ASYNC109
    ) -> list[aioice.Candidate]:
        transport = VirtualTransport(send, candidates[0])
        protocol = aioice.ice.StunProtocol(conn)
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        local = [
            aioice.Candidate(
                foundation=candidate_foundation("host", "udp", host),
                component=component,
                transport="udp",
                priority=candidate_priority(component, "host"),
                host=host,
                port=port,
                type="host",
            )
            for host, port in candidates
        ]
        passive = [
            aioice.Candidate(
                foundation=candidate_foundation("host", "tcp", host),
                component=component,
                transport="tcp",
                priority=candidate_priority(component, "host", TCP_PASSIVE_LOCAL_PREF),
                host=host,
                port=port,
                type="host",
                tcptype="passive",
            )
            for host, port in tcp_candidates or ()
        ]
        protocol.local_candidate = local[0]
        conn._protocols.append(protocol)
        state["protocol"] = protocol
        return local + passive

    async def lite_check_start(pair: aioice.ice.CandidatePair) -> None:
        # RFC 8445 §2.5 / §7.3.1.4: a lite agent sends no check; the caller's authenticated
        # check on this pair (it just arrived) makes it valid if it is on the selected path.
        # It is also taken as nominated at once: waiting for the caller's USE-CANDIDATE costs
        # a whole ping interval (~50 ms with Chromium) before DTLS may start. A pair to
        # another address stays in progress (so USE-CANDIDATE on it moves nothing) until
        # `select_path` after validation.
        if pair.remote_addr == selected():
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
    return lambda: state.get("protocol")


def _nominate(conn: aioice.Connection, pair: aioice.ice.CandidatePair) -> None:
    conn.check_state(pair, aioice.ice.CandidatePair.State.SUCCEEDED)
    pair.nominated = True
    conn.check_complete(pair)  # moves `_nominated`, which is where aioice sends


def select_path(conn: aioice.Connection, addr: Address) -> bool:
    """Send the media to `addr`, a path the session table validated; False if ICE has no
    pair to it (yet: a check held back until `connect()` is nominated then)."""
    for pair in conn._check_list:
        if pair.remote_addr == addr:
            _nominate(conn, pair)
            return True
    return False


def forget_path(conn: aioice.Connection, addr: Address) -> None:
    """Drop ICE's pairs to a path the session table let go of, and their peer-reflexive
    candidates, so a session's ICE state stays bounded however often the caller moves."""
    nominated = list(conn._nominated.values())
    gone = [p for p in conn._check_list if p.remote_addr == addr and p not in nominated]
    if not gone:
        return
    conn._check_list = [p for p in conn._check_list if p not in gone]
    kept = {id(p.remote_candidate) for p in conn._check_list}
    dropped = {
        id(p.remote_candidate)
        for p in gone
        if p.remote_candidate.type == "prflx" and id(p.remote_candidate) not in kept
    }
    conn._remote_candidates = [c for c in conn._remote_candidates if id(c) not in dropped]


def receive_backlog(protocol: aioice.ice.StunProtocol) -> int:
    """Datagrams waiting in the connection's (unbounded) receive queue."""
    return protocol.receiver._queue.qsize()


# -- RTP and SRTP -------------------------------------------------------------------------------


def low_latency_receiver(
    receiver: Any, opus: Callable[[Frame], None] | None = None, min_depth: int = 0
) -> LowLatencyJitterBuffer:
    """Replace the receiver's jitter buffer with ours. With `opus`, Opus frames (lost ones
    too) go to it, decoded in-line by the session (`opus.py`: it repairs losses, which
    aiortc's decoder cannot), and the receiver starts no decoder thread of its own (one per
    call, reclaimed late); the transceiver answers Opus alone (`sdp.only_opus`), so no other
    codec comes. Without, frames go to the receiver's decoder thread, as aiortc's own receive
    path sends the one frame its buffer returns (a lost frame is skipped there)."""

    codecs = receiver._RTCRtpReceiver__codecs  # payload type -> codec, once negotiated

    def sink(frame: Frame) -> None:
        if opus is not None:  # (the answer has Opus alone: `sdp.only_opus`)
            if frame.payload_type in codecs:
                opus(frame)
            return
        codec = codecs.get(frame.payload_type)
        if codec is None:
            return
        if receiver._RTCRtpReceiver__decoder_thread is None or frame.lost:
            return
        frame.timestamp = receiver._RTCRtpReceiver__timestamp_mapper.map(frame.timestamp)
        receiver._RTCRtpReceiver__decoder_queue.put((codec, frame))

    buffer = LowLatencyJitterBuffer(sink=sink, min_depth=min_depth)
    receiver._RTCRtpReceiver__jitter_buffer = buffer
    if opus is not None:
        receiver.receive = partial(_receive_without_decoder, receiver)
    return buffer


async def _receive_without_decoder(receiver: Any, parameters: Any) -> None:
    """`RTCRtpReceiver.receive` (aiortc 1.16) without starting its decoder thread."""
    if receiver._RTCRtpReceiver__started:
        return
    for codec in parameters.codecs:
        receiver._RTCRtpReceiver__codecs[codec.payloadType] = codec
    for encoding in parameters.encodings:
        if encoding.rtx:
            receiver._RTCRtpReceiver__rtx_ssrc[encoding.rtx.ssrc] = encoding.ssrc
    receiver._RTCRtpReceiver__transport._register_rtp_receiver(receiver, parameters)
    receiver._RTCRtpReceiver__rtcp_task = asyncio.ensure_future(receiver._run_rtcp())
    receiver._RTCRtpReceiver__started = True


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


def count_srtp_failures(dtls_transport: Any, count: Callable[[str], None]) -> None:
    """Once DTLS is up: count SRTP auth and replay failures (aiortc only logs them)."""
    if dtls_transport._rx_srtp is not None:
        dtls_transport._rx_srtp = CountingSrtp(dtls_transport._rx_srtp, count)


# -- the media path in-line ------------------------------------------------------------------


MAX_SSRCS = 2  # RTP streams a caller may send (one audio track; one more for a switch)


def media_path(
    pc: RTCPeerConnection,
    protocol: aioice.ice.StunProtocol,
    count: Callable[[str], None] = lambda name: None,
) -> Callable[[bytes], None]:
    """What takes `protocol`'s non-STUN datagrams (RFC 7983: a first byte over 3; the caller
    checks), in place of `StunProtocol.datagram_received`: it parses every datagram as STUN
    first (a raised ValueError per media packet) before queueing it for the DTLS transport's
    task. Here DTLS records go to that queue straight, and SRTP/SRTCP (first byte 128-191),
    once the keys are there and nothing waits in the queue before it, is unprotected and
    handled right away, as that task would (`RTCDtlsTransport._recv_next`, aiortc 1.16): no
    queue, no task wake-up per packet. Order holds: with anything queued, SRTP queues too.
    Only while the transport is connected, when that task runs (it starts there and sets
    "closed" when it ends: `stop()`, the peer's `close_notify`): SRTP after that is left in
    the queue, unread, as aiortc leaves it, not handed to receivers that were stopped.
    At most `MAX_SSRCS` RTP streams per call: libsrtp keeps a stream and aiortc's receiver an
    entry for every SSRC that authenticates, forever, and its RTCP walks them all; an RTP
    packet of one more SSRC is dropped unread (`ssrc_refused`). A stream counts once a packet
    of it has authenticated, so packets spoofed from the caller's address take no place."""
    conn = protocol.receiver
    queue: asyncio.Queue[Any] = conn._queue
    component = protocol.local_candidate.component
    transports = pc._RTCPeerConnection__dtlsTransports  # type: ignore[attr-defined]
    dtls = next((t for t in transports if t.transport._connection is conn), None)
    connected = aiortc.rtcdtlstransport.State.CONNECTED
    ssrcs: set[bytes] = set()

    def deliver(data: bytes) -> None:
        rtp = 127 < data[0] < 192 and len(data) >= 12 and not aiortc.rtp.is_rtcp(data)
        ssrc = data[8:12] if rtp else b""
        if rtp and ssrc not in ssrcs and len(ssrcs) >= MAX_SSRCS:
            count("ssrc_refused")
            return
        if (
            dtls is None
            or not 127 < data[0] < 192
            or dtls._rx_srtp is None
            or dtls._state is not connected
            or queue.qsize()
        ):
            queue.put_nowait((data, component))
            return
        dtls._RTCDtlsTransport__rx_bytes += len(data)
        dtls._RTCDtlsTransport__rx_packets += 1
        arrival_time_ms = aiortc.clock.current_ms()
        try:
            if aiortc.rtp.is_rtcp(data):
                _run_in_line(dtls._handle_rtcp_data(dtls._rx_srtp.unprotect_rtcp(data)))
            else:
                plain = dtls._rx_srtp.unprotect(data)
                ssrcs.add(ssrc)  # (it authenticated)
                _run_in_line(dtls._handle_rtp_data(plain, arrival_time_ms=arrival_time_ms))
        except pylibsrtp.Error:
            pass  # (aiortc logs it at debug level; `count_srtp_failures` counts it)

    return deliver


def _run_in_line(coro: Coroutine[Any, Any, None]) -> None:
    """Run `coro` now, to its end. aiortc's RTP and RTCP handlers never wait on anything for
    audio (their awaits end in synchronous sends); if one ever does, a task finishes it."""
    try:
        awaited = coro.send(None)
    except StopIteration:
        return
    asyncio.ensure_future(_finish(coro, awaited))


async def _finish(coro: Coroutine[Any, Any, None], awaited: Any) -> None:
    """Carry on `coro` where it waited (as its own task would have)."""
    try:
        while True:
            try:
                await awaited
            except Exception:
                pass  # (the coroutine sees the outcome itself when resumed)
            try:
                awaited = coro.send(None)
            except StopIteration:
                return
    finally:
        coro.close()


def hook_points() -> dict[str, bool]:
    """Whether every aiortc/aioice internal this module relies on is where we expect it."""
    from aiortc.rtcdtlstransport import RTCDtlsTransport
    from aiortc.rtcsctptransport import RTCSctpTransport

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
        "RTCPeerConnection.__dtlsTransports": hasattr(pc, "_RTCPeerConnection__dtlsTransports"),
        **dtls_hooks.hook_points(pc, receiver.transport),
        **sctp_hooks.hook_points(RTCSctpTransport(receiver.transport)),
        **{
            f"RTCRtpReceiver.{name}": hasattr(receiver, f"_RTCRtpReceiver{name}")
            for name in (
                "__jitter_buffer",
                "__decoder_thread",
                "__decoder_queue",
                "__codecs",
                "__timestamp_mapper",
                "__started",
                "__rtx_ssrc",
                "__transport",
                "__rtcp_task",
            )
        },
        "RTCRtpReceiver._run_rtcp": hasattr(receiver, "_run_rtcp"),
        **_media_path_points(conn, receiver.transport),
        "RTCRtpReceiver.receive: decoder thread": (
            "decoder_worker" in RTCRtpReceiver.receive.__code__.co_names
            and "_register_rtp_receiver" in RTCRtpReceiver.receive.__code__.co_names
        ),
    }


def _media_path_points(conn: aioice.Connection, dtls: Any) -> dict[str, bool]:
    """`media_path`'s reach: the queue it feeds and the SRTP branch it runs in-line."""
    from aiortc.rtcdtlstransport import RTCDtlsTransport

    recv_next = RTCDtlsTransport._recv_next.__code__
    return {
        "Connection.data_received: _queue": (
            "_queue" in aioice.Connection.data_received.__code__.co_names
        ),
        "StunProtocol.receiver": "receiver" in aioice.ice.StunProtocol.__init__.__code__.co_names,
        "RTCDtlsTransport._state": (
            "_state" in RTCDtlsTransport.__init__.__code__.co_names
            and hasattr(aiortc.rtcdtlstransport.State, "CONNECTED")
            and "_set_state" in RTCDtlsTransport._RTCDtlsTransport__run.__code__.co_names  # type: ignore[attr-defined]
        ),
        "RTCDtlsTransport.__rx_bytes": hasattr(dtls, "_RTCDtlsTransport__rx_bytes"),
        "RTCDtlsTransport.__rx_packets": hasattr(dtls, "_RTCDtlsTransport__rx_packets"),
        "RTCDtlsTransport._recv_next: SRTP branch": all(
            name in recv_next.co_names
            for name in ("_rx_srtp", "unprotect", "unprotect_rtcp", "current_ms")
        )
        and {"_handle_rtp_data", "_handle_rtcp_data"} <= set(recv_next.co_names),
        "RTCDtlsTransport._handle_rtp_data": hasattr(dtls, "_handle_rtp_data"),
        "RTCDtlsTransport._handle_rtcp_data": hasattr(dtls, "_handle_rtcp_data"),
        "RTCDtlsTransport.transport": hasattr(dtls, "transport"),
        "clock.current_ms": hasattr(aiortc.clock, "current_ms"),
        "rtp.is_rtcp": hasattr(aiortc.rtp, "is_rtcp"),
    }
