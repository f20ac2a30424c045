"""One call's peer connection: a stock aiortc `RTCPeerConnection`, made an ICE-lite agent on
the shared socket (`hooks.py`), for offer/answer, the DTLS handshake and the data channel
(SCTP); the call's media is the project's own core (`media/core.py`), not aiortc's.

aiortc answers with its audio transceivers inactive, so it starts no RTP sender or
receiver of its own: the answer the caller gets says what the core does (`sendrecv`, with
aiortc's SSRC and CNAME lines). Once DTLS is connected, the core keys its SRTP sessions
from the material the handshake exports (`hooks.srtp_keying`). From then on every
SRTP/SRTCP datagram of the call goes to the core, on the loop thread, as it arrives. What
the core sends goes to the path the session table selected. Its timer is the process's one
media clock (`media_clock.py`).

It reports what happens through `SessionCallbacks`, on the loop thread: decoded audio,
connection states (aiortc's own words: "connected", "failed", "closed", ...), the caller's
data-channel messages, and `Milestone`s for the setup timeline (span events and metrics).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from firsthop.services.transceiver.media.core import MediaParams
from firsthop.services.transceiver.media.srtp import SrtpContext
from firsthop.services.transceiver.rtc import dtls_hooks, hooks, sctp_hooks
from firsthop.services.transceiver.rtc.lite_connection import LiteConnection
from firsthop.services.transceiver.rtc.media_clock import clock_of
from firsthop.services.transceiver.rtc.media_io import MediaIo, Milestone
from firsthop.shared.address import Address
from firsthop.shared.sdp import answering_direction, audio_stream, set_audio_direction
from firsthop.shared.wire.demux import STUN_LAST

MAX_CHANNEL_BACKLOG = 1 << 20  # bytes of events queued on a caller's data channel
# Data channels a caller may have open (not yet closed both ways) at once. One that opens a
# channel and resets it, again and again, but never answers our reset of it, left each in
# aiortc's table for the call's life (1,113 over 2,000 cycles, a helper measured, stop 50):
# past this the call ends (`datachannels_over_limit`). The Realtime API opens one.
MAX_CHANNELS = 16


class TooManyChannels(Exception):
    pass


@dataclass
class RtcSession(MediaIo):
    candidates: list[Address] = field(default_factory=list)  # the relay ingress advertised
    tcp_candidates: list[Address] = field(default_factory=list)  # ICE-TCP ingress, passive
    pc: RTCPeerConnection = field(init=False)
    channel: Any = field(init=False, default=None)
    ice: LiteConnection | None = field(init=False, default=None)  # from the answer on
    _dtls_client: bool = field(init=False, default=True)  # our answer's a=setup:active
    _channels: int = field(init=False, default=0)  # the caller's, open or closing

    def __post_init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        dtls_hooks.dtls_for_any_peer(self.pc)  # RSA peers too; our certificate stays ECDSA
        self.pc.on("connectionstatechange", self._on_state)
        self.pc.on("iceconnectionstatechange", self._on_ice_state)
        self.pc.on("datachannel", self._on_datachannel)

    # -- setup -----------------------------------------------------------------------------

    async def answer(self, offer_sdp: str, local: tuple[str, str]) -> str:
        """Apply the offer (candidates already stripped) and return the answer SDP, with our
        ICE credentials `local` = (ufrag, password): the session table's, set in aioice."""
        await self.pc.setRemoteDescription(RTCSessionDescription(offer_sdp, "offer"))
        for transceiver in self.pc.getTransceivers():
            transceiver.direction = "inactive"  # aiortc moves no RTP: the media core does
        self.ice = LiteConnection(
            local,
            candidates=self.candidates,
            tcp_candidates=self.tcp_candidates,
            send=self.send,
            selected=self.callbacks.selected,
        )
        for ice_transport in hooks.ice_transports(self.pc):
            hooks.use_lite_connection(ice_transport, self.ice)
        answer = await self.pc.createAnswer()
        await self.pc.setLocalDescription(answer)
        direction = answering_direction(offer_sdp)
        sdp = set_audio_direction(str(self.pc.localDescription.sdp), direction)
        stream = audio_stream(sdp)
        # RFC 5763 §5: a=setup:active is the DTLS client, which keys SRTP with the client's
        # half of the exported material (RFC 5764 §4.2); we answer active unless the offer was.
        self._dtls_client = "a=setup:active" in sdp
        self.media = self.new_media(
            MediaParams(
                ssrc=stream.ssrc,
                cname=stream.cname,
                payload_type=stream.payload_type,
                sending=direction in ("sendrecv", "sendonly"),
                mid=stream.mid,
                mid_extension=stream.mid_extension,
            )
        )
        self._clock = clock_of(asyncio.get_running_loop())
        audio = next(t for t in self.pc.getTransceivers() if t.kind == "audio")
        media = {t.receiver.transport for t in self.pc.getTransceivers()}
        for dtls in media:
            dtls.on("statechange", self._make_dtls_watch(dtls, dtls is audio.receiver.transport))
        for dtls in media | ({self.pc.sctp.transport} if self.pc.sctp else set()):
            dtls_hooks.close_with_renegotiation(dtls)  # a browser's connection fails at once
        if self.pc.sctp is not None:  # what the caller's data channels make aiortc keep
            sctp_hooks.bound_sctp(self.pc.sctp, self.callbacks.count)
        return sdp

    def path_selected(self) -> None:
        """The session table selected a path (or moved it): everything the call sends goes
        there (`callbacks.selected`); the first one lets DTLS start."""
        if self.ice is not None:
            self.ice.path_selected()

    def restart_ice(self, ufrag: str, pwd: str, remote_ufrag: str, remote_pwd: str) -> None:
        """ICE restart (RFC 8445 §9): new credentials both ways; DTLS and SRTP carry on."""
        if self.ice is not None:
            self.ice.restart((ufrag, pwd), (remote_ufrag, remote_pwd))

    # -- datagrams from the shared socket --------------------------------------------------

    def datagram_received(self, data: bytes, addr: Address) -> bool:
        """One datagram of the call's validated caller (never STUN: the session table
        answers checks): SRTP/SRTCP to the media core, a DTLS record to aiortc's DTLS task
        through the call's `LiteConnection`; False if that queue was full (dropped)."""
        first = data[0]
        if 127 < first < 192:  # RTP/RTCP (RFC 7983)
            self.media_datagram(data)
            return True
        ice = self.ice
        if ice is None or first <= STUN_LAST:
            return False
        return ice.deliver(data)

    # -- events ------------------------------------------------------------------------------

    def _on_state(self) -> None:
        self.callbacks.state(self.pc.connectionState)

    def _on_ice_state(self) -> None:
        if self.pc.iceConnectionState == "completed":
            self.callbacks.milestone(Milestone.ICE_CONNECTED)

    def _make_dtls_watch(self, transport: Any, audio: bool) -> Callable[[], None]:
        def watch() -> None:
            if transport.state == "connected":
                self.callbacks.milestone(Milestone.DTLS_CONNECTED)
                media = self.media
                if audio and media is not None:  # the keys are here: media flows
                    try:  # (in aiortc's DTLS task: a raise there would leave the call mute)
                        material, profile = hooks.srtp_keying(transport)
                        srtp = SrtpContext.from_keying_material(
                            material, profile, client=self._dtls_client
                        )
                        media.start(srtp, time.monotonic(), time.time())
                        self._pump(media)
                    except Exception as exc:
                        self.callbacks.failed("media", exc)
            elif transport.state == "failed":
                self.callbacks.milestone(Milestone.DTLS_FAILED)

        return watch

    def _on_datachannel(self, channel: Any) -> None:
        self._channels += 1
        if self._channels > MAX_CHANNELS:
            self.callbacks.count("datachannels_over_limit")
            self.callbacks.failed("events", TooManyChannels(f"over {MAX_CHANNELS} data channels"))
            return
        channel.on("close", self._on_channel_closed)
        self.channel = channel
        channel.on("message", self.callbacks.message)
        # A channel the caller opened is announced once open (DCEP, RFC 8832).
        self.callbacks.milestone(Milestone.DATACHANNEL_OPEN)

    def _on_channel_closed(self) -> None:
        self._channels -= 1

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

    async def close(self) -> None:
        self.close_media()
        await self.pc.close()
