"""The bench callers' one reach into aiortc's private parts, with its version check.

`bench sessions --knee` callers keep aiortc for everything a caller negotiates (ICE, DTLS,
SRTP, RTCP), but not for hearing: decoding every frame (a decoder thread per call, aiortc's
jitter buffer, an AudioFrame per 20 ms) is what made the callers' core the limit before the
transceiver's. `tap_receiver` puts a recorder where the receiver's jitter buffer was: each RTP
packet the receiver accepted (SRTP checked, payload type known, RTCP statistics kept, so the
caller's receiver reports stay true) is handed to `sink` and goes no further. The receiver's
decoder thread is still started by aiortc; it idles on its empty queue.

Like `services/transceiver/rtc/hooks.py`, this holds for the pinned aiortc minor only:
`tap_receiver` refuses others (`check_pinned_versions`), and `hook_points` (asserted by a
test) says whether the attribute it replaces is where expected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.rtp import RtpPacket

from firsthop.services.transceiver.rtc.hooks import check_pinned_versions

JITTER_BUFFER = "_RTCRtpReceiver__jitter_buffer"  # aiortc 1.16 RTCRtpReceiver.__init__


class _Tap:
    """Stands in for aiortc's JitterBuffer: `add` returns (no PLI, no frame to decode)."""

    def __init__(self, sink: Callable[[RtpPacket], None]) -> None:
        self._sink = sink

    def add(self, packet: RtpPacket) -> tuple[bool, None]:
        self._sink(packet)
        return False, None


def tap_receiver(receiver: Any, sink: Callable[[RtpPacket], None]) -> None:
    """Every RTP packet `receiver` accepts goes to `sink` (its payload is `packet.payload`)
    instead of to the decoder. Call before the call starts."""
    check_pinned_versions()
    if not hasattr(receiver, JITTER_BUFFER):
        raise RuntimeError(f"aiortc's RTCRtpReceiver has no {JITTER_BUFFER} (see caller_hooks)")
    setattr(receiver, JITTER_BUFFER, _Tap(sink))


def hook_points() -> dict[str, bool]:
    """Whether the aiortc internal `tap_receiver` replaces is where we expect it."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio")
    receiver = pc.getTransceivers()[0].receiver
    buffer = getattr(receiver, JITTER_BUFFER, None)
    return {"RTCRtpReceiver.__jitter_buffer.add": callable(getattr(buffer, "add", None))}
