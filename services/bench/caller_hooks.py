"""The bench callers' reaches into aiortc's private parts, with their version check.

`bench sessions --knee` callers keep aiortc for everything a caller negotiates (ICE, DTLS,
SRTP, RTCP), but not for hearing: decoding every frame (a decoder thread per call, aiortc's
jitter buffer, an AudioFrame per 20 ms) is what made the callers' core the limit before the
transceiver's. `tap_receiver` puts a recorder where the receiver's jitter buffer was: each RTP
packet the receiver accepted (SRTP checked, payload type known, RTCP statistics kept, so the
caller's receiver reports stay true) is handed to `sink` and goes no further. The receiver's
decoder thread is still started by aiortc; it idles on its empty queue.

`low_latency_receiver` (the loss and voice benches' callers) puts firsthop's zero-delay
jitter buffer (`media/jitter.py`) where the receiver's was, so what a caller hears is timed
without aiortc's 80 ms of buffering, and with `opus` hands it each frame (lost ones too)
without starting the receiver's decoder thread. None of this is the transceiver's: it bends
the benches' stock aiortc callers only.

Like `services/transceiver/rtc/hooks.py`, this holds for the pinned aiortc minor only:
`tap_receiver` refuses others (`check_pinned_versions`), and `hook_points` (asserted by a
test) says whether the attribute it replaces is where expected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from functools import partial
from typing import Any

from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpReceiver
from aiortc.rtp import RtpPacket

from firsthop.services.transceiver.media.jitter import Frame, LowLatencyJitterBuffer
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


def hook_points() -> dict[str, bool]:
    """Whether the aiortc internal `tap_receiver` replaces is where we expect it."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("audio")
    receiver = pc.getTransceivers()[0].receiver
    buffer = getattr(receiver, JITTER_BUFFER, None)
    return {
        "RTCRtpReceiver.__jitter_buffer.add": callable(getattr(buffer, "add", None)),
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
