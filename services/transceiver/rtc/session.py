"""One call's peer connection: a stock aiortc `RTCPeerConnection` made an ICE-lite agent on
the shared socket (`hooks.py`), with the agent's voice as its outgoing track.

It reports what happens through `SessionCallbacks`, on the loop thread: decoded audio,
connection states (aiortc's own words: "connected", "failed", "closed", ...), the caller's
data-channel messages, and `Milestone`s for the setup timeline (span events and metrics).
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aioice
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from firsthop.services.transceiver.media.jitter import Frame, LowLatencyJitterBuffer
from firsthop.services.transceiver.media.opus import OpusDecoder, OpusError
from firsthop.services.transceiver.rtc import dtls_hooks, hooks, sctp_hooks
from firsthop.services.transceiver.rtc.audio import AgentAudioTrack
from firsthop.shared.address import Address
from firsthop.shared.wire.demux import STUN_LAST

MAX_RECEIVE_QUEUE = 256  # datagrams waiting for DTLS/SRTP in one session
MAX_CHANNEL_BACKLOG = 1 << 20  # bytes of events queued on a caller's data channel


class Milestone(enum.StrEnum):
    """Facts of a call's setup, in the order they usually happen (span event names)."""

    ICE_CONNECTED = "ice_connected"
    DTLS_CONNECTED = "dtls_connected"
    DTLS_FAILED = "dtls_failed"
    DATACHANNEL_OPEN = "datachannel_open"
    FIRST_RTP_IN = "first_rtp_in"
    FIRST_AUDIO_OUT = "first_audio_out"


@dataclass
class SessionCallbacks:
    """What a session reports back (called on the loop thread, from asyncio context)."""

    audio: Callable[[bytes], None]  # a decoded 20 ms frame, PCM16 mono 48 kHz
    state: Callable[[str], None]  # the peer connection's state
    message: Callable[[str | bytes], None]  # from the caller's data channel
    selected: Callable[[], Address | None]  # the media path the session table chose
    milestone: Callable[[Milestone], None]
    count: Callable[[str], None]


@dataclass
class RtcSession:
    candidates: list[Address]  # the relay ingress address(es) advertised in the answer
    send: Callable[[bytes, Address], None]  # frames and sends one datagram to a client
    callbacks: SessionCallbacks
    tcp_candidates: list[Address] = field(default_factory=list)  # ICE-TCP ingress, passive
    pc: RTCPeerConnection = field(init=False)
    output: AgentAudioTrack = field(init=False)
    channel: Any = field(init=False, default=None)
    _protocols: list[Callable[[], aioice.ice.StunProtocol | None]] = field(
        init=False, default_factory=list
    )
    _tasks: set[asyncio.Task[None]] = field(init=False, default_factory=set)
    _jitter: list[LowLatencyJitterBuffer] = field(init=False, default_factory=list)
    _decoder: OpusDecoder | None = field(init=False, default=None)
    _media: Callable[[bytes], None] | None = field(init=False, default=None)
    _audio_started: bool = field(init=False, default=False)
    _decoded: int = field(init=False, default=0)
    _repaired: int = field(init=False, default=0)
    _from_fec: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        dtls_hooks.dtls_for_any_peer(self.pc)  # RSA peers too; our certificate stays ECDSA
        self.output = AgentAudioTrack()
        self.output.on_first_audio = lambda: self.callbacks.milestone(Milestone.FIRST_AUDIO_OUT)
        self.pc.on("connectionstatechange", self._on_state)
        self.pc.on("iceconnectionstatechange", self._on_ice_state)
        self.pc.on("datachannel", self._on_datachannel)

    # -- setup -----------------------------------------------------------------------------

    async def answer(self, offer_sdp: str, local: tuple[str, str]) -> str:
        """Apply the offer (candidates already stripped) and return the answer SDP, with our
        ICE credentials `local` = (ufrag, password): the session table's, set in aioice."""
        await self.pc.setRemoteDescription(RTCSessionDescription(offer_sdp, "offer"))
        self.pc.addTrack(self.output)
        for conn in hooks.ice_connections(self.pc):
            hooks.set_credentials(conn, local)
            self._protocols.append(
                hooks.make_lite(
                    conn,
                    candidates=self.candidates,
                    tcp_candidates=self.tcp_candidates,
                    send=self.send,
                    selected=self.callbacks.selected,
                )
            )
        for transceiver in self.pc.getTransceivers():
            if transceiver.kind == "audio":
                receiver = transceiver.receiver
                self._jitter.append(hooks.low_latency_receiver(receiver, self._on_opus))
        answer = await self.pc.createAnswer()
        await self.pc.setLocalDescription(answer)
        media = {t.receiver.transport for t in self.pc.getTransceivers()}
        for dtls in media:
            dtls.on("statechange", self._make_dtls_watch(dtls))
        for dtls in media | ({self.pc.sctp.transport} if self.pc.sctp else set()):
            dtls_hooks.close_with_renegotiation(dtls)  # a browser's connection fails at once
        if self.pc.sctp is not None:  # what the caller's data channels make aiortc keep
            sctp_hooks.bound_sctp(self.pc.sctp, self.callbacks.count)
        return str(self.pc.localDescription.sdp)

    def select_path(self, addr: Address) -> bool:
        """Send the media to `addr` (validated by the session table)."""
        return any([hooks.select_path(conn, addr) for conn in hooks.ice_connections(self.pc)])

    def forget_path(self, addr: Address) -> None:
        for conn in hooks.ice_connections(self.pc):
            hooks.forget_path(conn, addr)

    def restart_ice(self, ufrag: str, pwd: str, remote_ufrag: str, remote_pwd: str) -> None:
        """ICE restart (RFC 8445 §9): new credentials both ways; DTLS and SRTP carry on."""
        for conn in hooks.ice_connections(self.pc):
            hooks.set_credentials(conn, (ufrag, pwd), (remote_ufrag, remote_pwd))

    # -- datagrams from the shared socket --------------------------------------------------

    def datagram_received(self, data: bytes, addr: Address) -> bool:
        """Hand one datagram to ICE; False if it was dropped because the session's receive
        queue is full (aioice's own queue is unbounded)."""
        protocol = self._protocols[0]() if self._protocols else None
        if protocol is None:
            return False
        if data[0] <= STUN_LAST:
            protocol.datagram_received(data, addr)
            return True
        if hooks.receive_backlog(protocol) >= MAX_RECEIVE_QUEUE:
            return False
        media = self._media
        if media is None:
            media = self._media = hooks.media_path(self.pc, protocol, self.callbacks.count)
        media(data)  # DTLS queued for aiortc's task; SRTP handled here (`hooks.media_path`)
        return True

    # -- events ------------------------------------------------------------------------------

    def _on_state(self) -> None:
        self.callbacks.state(self.pc.connectionState)

    def _on_ice_state(self) -> None:
        if self.pc.iceConnectionState == "completed":
            self.callbacks.milestone(Milestone.ICE_CONNECTED)

    def _make_dtls_watch(self, transport: Any) -> Callable[[], None]:
        def watch() -> None:
            if transport.state == "connected":
                self.callbacks.milestone(Milestone.DTLS_CONNECTED)
                hooks.count_srtp_failures(transport, self.callbacks.count)
            elif transport.state == "failed":
                self.callbacks.milestone(Milestone.DTLS_FAILED)

        return watch

    def _on_opus(self, frame: Frame) -> None:
        """One Opus frame from the jitter buffer, decoded here on the loop (about 20 us; no
        decoder thread, no queue hop): a lost one is repaired from the next packet's FEC or
        concealed, so the agent hears every 20 ms."""
        decoder = self._decoder
        if decoder is None:
            decoder = self._decoder = OpusDecoder()
        try:
            if frame.lost:
                if not self._audio_started:
                    return
                pcm, from_fec = decoder.recover(frame.data)
                self._repaired += 1
                self._from_fec += from_fec
            else:
                pcm = decoder.decode(frame.data)
                self._decoded += 1
        except OpusError:
            self.callbacks.count("opus_decode_error")
            return
        if not self._audio_started:
            self._audio_started = True
            self.callbacks.milestone(Milestone.FIRST_RTP_IN)
        self.callbacks.audio(pcm)

    def _on_datachannel(self, channel: Any) -> None:
        self.channel = channel
        channel.on("message", self.callbacks.message)
        # A channel the caller opened is announced once open (DCEP, RFC 8832).
        self.callbacks.milestone(Milestone.DATACHANNEL_OPEN)

    def send_event(self, text: str) -> bool:
        """Send `text` on the caller's data channel; False if it is not open. An event the
        caller cannot take (over its max-message-size), or one with too much already waiting
        on a stalled channel, is dropped and counted (True: it was dealt with)."""
        channel = self.channel
        if channel is None or channel.readyState != "open":
            return False
        if channel.bufferedAmount > MAX_CHANNEL_BACKLOG:
            self.callbacks.count("event_dropped_channel_backlog")
            return True
        try:
            channel.send(text)
        except ValueError:  # aiortc: over the caller's a=max-message-size
            self.callbacks.count("event_dropped_too_big_for_caller")
        return True

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def totals(self) -> dict[str, int]:
        """What this call counted that the transceiver's metrics add up at its end."""
        return {
            "jitter_late": sum(j.late for j in self._jitter),
            "jitter_skipped": sum(j.skipped for j in self._jitter),
            "frames_decoded": self._decoded,
            "frames_repaired": self._repaired,
            "frames_repaired_fec": self._from_fec,
            "agent_frames_played": self.output.frames_out,
        }

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self.output.stop()
        self.output.clear()  # (up to 30 s of a backend's audio: gone with the call)
        await self.pc.close()
        if self._decoder is not None:
            self._decoder.close()
