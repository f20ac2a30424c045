"""One phone call's media: RTP as a SIP trunk's SDP offers it (`PlainRtpSession`): plain
(RTP/AVP), or SRTP keyed in the SDP (RTP/SAVP with SDES, RFC 4568).

No ICE, no DTLS, no data channel, no aiortc: the offer (`shared/rtp_offer.py`) names where
the trunk receives RTP and which codecs it has; the answer names the region's relay ingress
(the one public UDP port) and the codec chosen (PCMU, PCMA, or Opus when a trunk offers it),
with telephone-event when offered. The media core (`media/core.py`) starts at once with no
keys (RTP/AVP) and its I/O is `MediaIo`'s, like a WebRTC call's. Where the trunk's media may
come from is pinned by the session table (`SessionTable.open_pinned`) and, on the relay, by
the flow the transceiver publishes for that address (docs/security.md, SIP media).

It has the surface `Session` uses of an `RtcSession`: `answer`, `datagram_received`,
`path_selected`, `restart_ice`, `send_event` (there is no channel: False), `close`.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

from firsthop.services.transceiver.media.core import MediaParams
from firsthop.services.transceiver.media.srtp import SrtpContext
from firsthop.services.transceiver.rtc.media_clock import clock_of
from firsthop.services.transceiver.rtc.media_io import MediaIo
from firsthop.shared.address import Address, ip_family
from firsthop.shared.rtp_offer import (
    ANSWERING,
    SDES_KEY_BYTES,
    SDES_SUITES,
    Crypto,
    build_rtp_answer,
    choose_codec,
    choose_crypto,
    parse_rtp_offer,
)
from firsthop.shared.sdp import SdpError

PREFER = ("pcmu", "pcma", "opus")  # G.711 first: what a phone network carries end to end


@dataclass
class PlainRtpSession(MediaIo):
    candidates: list[Address] = field(default_factory=list)  # the relay ingress to advertise
    remote: Address | None = field(init=False, default=None)  # the trunk's RTP, from its offer
    channel: None = field(init=False, default=None)

    async def answer(self, offer_sdp: str, local: tuple[str, str]) -> str:
        """The answer to a trunk's offer (`SdpError` says why there is none). `local` (ICE
        credentials) is unused: a phone call has no ICE."""
        offer = parse_rtp_offer(offer_sdp)
        payload_type = choose_codec(offer, PREFER)
        if payload_type is None:
            raise SdpError("no codec in common (PCMU, PCMA or Opus)")
        crypto = choose_crypto(offer) if offer.secure else None
        if offer.secure and crypto is None:
            raise SdpError("RTP/SAVP with no a=crypto we take (AES_CM_128_HMAC_SHA1_80/32)")
        if offer.port == 0:
            raise SdpError("the audio stream is refused (port 0)")
        family = ip_family(offer.address)
        ingress = [a for a in self.candidates if ip_family(a[0]) == family]
        if not ingress:
            raise SdpError(f"no ingress of the trunk's address family (IPv{family})")
        direction = ANSWERING.get(offer.direction, "inactive")
        ssrc = int.from_bytes(os.urandom(4), "big") or 1
        codec, _ = offer.codecs[payload_type]
        self.remote = (offer.address, offer.port)
        self.media = self.new_media(
            MediaParams(
                ssrc=ssrc,
                cname=os.urandom(8).hex(),
                payload_type=payload_type,
                sending=direction in ("sendrecv", "sendonly"),
                codec=codec,
                telephone_event=offer.telephone_event,
                rtcp=offer.rtcp_mux,  # (else its RTCP port is one the relay does not have)
            )
        )
        self._clock = clock_of(asyncio.get_running_loop())
        srtp = None
        ours: Crypto | None = None
        if crypto is not None:  # SDES (RFC 4568): its key for what it sends, ours for ours
            ours = Crypto(crypto.tag, crypto.suite, os.urandom(SDES_KEY_BYTES))
            srtp = SrtpContext.from_sdes(crypto.key, ours.key, SDES_SUITES[crypto.suite])
        self.media.start(srtp, time.monotonic(), time.time())  # no DTLS to wait for
        self._pump(self.media)
        host, port = ingress[0]
        return build_rtp_answer(
            offer,
            payload_type=payload_type,
            address=host,
            port=port,
            session_id=int.from_bytes(os.urandom(4), "big"),
            direction=direction,
            crypto=ours,
        )

    def datagram_received(self, data: bytes, addr: Address) -> bool:
        """One datagram from the trunk's pinned address: RTP/RTCP to the media core; nothing
        else belongs on a phone call's media path (counted, dropped)."""
        if 127 < data[0] < 192:
            self.media_datagram(data)
        else:
            self.callbacks.count("rtp_session_not_rtp")
        return True

    def path_selected(self) -> None:
        """(The path is pinned from the start.)"""

    def restart_ice(self, ufrag: str, pwd: str, remote_ufrag: str, remote_pwd: str) -> None:
        """(No ICE on a phone call.)"""

    def send_event(self, text: str) -> bool:
        return False  # no data channel: events for the caller go to the sidebands only

    async def close(self) -> None:
        self.close_media()
