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

And per DTLS transport, once connected: the two SRTP sessions its handshake keyed
(`srtp_sessions`), which the call's media core (`media/core.py`) then uses alone. aiortc
itself moves no RTP: the session makes its transceivers inactive.

And for the bench's aiortc callers (not the transceiver): a zero-delay jitter buffer in a
stock receiver (`low_latency_receiver`).

And per peer connection and DTLS transport, in `dtls_hooks.py` (under the same version check,
its reaches in `hook_points` too): DTLS with peers that have RSA certificates
(`dtls_for_any_peer`), and a close that makes a browser's connection fail at once
(`close_with_renegotiation`). And per SCTP association, in `sctp_hooks.py`: bounds on what a
caller's data channels make aiortc keep (`bound_sctp`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
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


def srtp_sessions(dtls_transport: Any) -> tuple[pylibsrtp.Session, pylibsrtp.Session]:
    """The (inbound, outbound) libsrtp sessions a connected DTLS transport keyed from its
    handshake (RFC 5764 §4.2; `RTCDtlsTransport._setup_srtp`)."""
    inbound, outbound = dtls_transport._rx_srtp, dtls_transport._tx_srtp
    if inbound is None or outbound is None:
        raise RuntimeError("the DTLS transport has no SRTP keys yet")
    return inbound, outbound


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
        "RTCDtlsTransport._tx_srtp": "_tx_srtp" in RTCDtlsTransport.__init__.__code__.co_names,
        "RTCDtlsTransport._setup_srtp: both sessions": {"_rx_srtp", "_tx_srtp"}
        <= set(RTCDtlsTransport._setup_srtp.__code__.co_names),
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
        "RTCRtpReceiver.receive: decoder thread": (
            "decoder_worker" in RTCRtpReceiver.receive.__code__.co_names
            and "_register_rtp_receiver" in RTCRtpReceiver.receive.__code__.co_names
        ),
    }
