"""A call's codec, one interface for Opus (WebRTC) and G.711 (phone calls): `CallCodec`.

The media core (`core.py`) hears and speaks PCM16 mono at 48 kHz in 20 ms frames whatever
the call's codec is. A codec turns one RTP payload into such frames and one such frame into
one RTP payload, knows its RTP clock rate, how long a payload lasts (without decoding it),
what a lost frame becomes, and what to send in a silent slot:

* `Opus`: the call's frames are Opus's own (RFC 7587: 48 kHz clock); a lost frame is
  repaired from the next packet's in-band FEC, or concealed (`opus.py`);
* `G711`: µ-law (PCMU, payload type 0) or A-law (PCMA, 8), 8 kHz (RFC 3551 §4.5.14). What
  a trunk sends is decoded, resampled to 48 kHz and cut into 20 ms frames (a packet of 10 or
  30 ms is fine); what we send is resampled to 8 kHz and encoded, 160 samples a frame
  exactly. A lost frame is silence (G.711 has no concealment of its own).

Pure: no I/O, no clock (the resampler is libswresample's, `resample.py`).
"""

from __future__ import annotations

from typing import Protocol

from firsthop.services.transceiver.media.frames import (
    CALL_RATE,
    FRAME_BYTES,
    FRAME_SAMPLES,
    FrameCutter,
)
from firsthop.services.transceiver.media.opus import OpusDecoder, OpusEncoder, OpusError
from firsthop.services.transceiver.resample import Resampler
from firsthop.shared.wire import g711
from firsthop.shared.wire.ogg import OpusPacketError, packet_samples

OPUS_BITRATE = 48000  # mono voice
OPUS_SILENCE = b"\xf8\xff\xfe"  # one 20 ms CELT frame of silence (RFC 6716 §3.1 TOC 0xf8)
# Silent slots encoded by the call's own encoder before the cached frame takes over. The
# decoder predicts each frame's energy from the last one: a silence frame the encoder never
# saw leaves the two apart, and the next ~3 frames of speech decode far too quiet (measured:
# a 440 Hz tone back to its level only at the 6th frame; encoded through, at the 2nd).
ENCODED_SILENCE = 3
SILENT_PCM = bytes(FRAME_BYTES)
G711_RATE = 8000
G711_FRAME = G711_RATE // 50  # samples (and bytes) in 20 ms
CODECS = ("opus", "pcmu", "pcma")  # what `make_codec` takes (the SDP encoding names)


class CodecError(Exception):
    """A payload the codec cannot decode (counted by the core, the call goes on)."""


class CallCodec(Protocol):
    name: str
    clock_rate: int  # Hz: RTP timestamps count this

    def decode(self, payload: bytes) -> list[bytes]:
        """The 20 ms frames (PCM16 mono, 48 kHz) in one RTP payload."""
        ...

    def recover(self, next_payload: bytes) -> tuple[bytes, bool]:
        """A lost frame: repaired from `next_payload` (True) or concealed (False)."""
        ...

    def duration(self, payload: bytes) -> float:
        """Seconds of audio `payload` holds, read without decoding it (what it would cost
        to decode; a payload that will not decode may say anything up to 120 ms)."""
        ...

    def repair_duration(self) -> float:
        """Seconds of audio `recover` makes of a lost frame now (Opus: as long as the last
        packet decoded, up to 120 ms)."""
        ...

    def encode(self, pcm: bytes) -> bytes:
        """One 20 ms frame (PCM16 mono, 48 kHz) as one RTP payload."""
        ...

    def silence(self, run: int) -> bytes:
        """The payload of the `run`-th silent slot in a row."""
        ...

    def close(self) -> None: ...


OPUS_MAX_DURATION = 0.12  # seconds: what one packet may hold (RFC 6716 §3.2.5)


def opus_duration(packet: bytes) -> float:
    """Seconds of audio in an Opus packet, from its TOC byte and frame count (RFC 6716
    §3.1, §3.2.5; `ogg.packet_samples`), at most 120 ms (libopus refuses longer); an empty
    packet holds none, and a code 3 packet without its count (it will not decode) a frame."""
    if not packet:
        return 0.0
    try:
        samples = packet_samples(packet)
    except OpusPacketError:
        samples = FRAME_SAMPLES
    return min(OPUS_MAX_DURATION, samples / CALL_RATE)


def make_codec(name: str) -> CallCodec:
    if name == "opus":
        return Opus()
    if name in ("pcmu", "pcma"):
        return G711(name)
    raise ValueError(f"no codec {name!r} (one of {', '.join(CODECS)})")


class Opus:
    name = "opus"
    clock_rate = CALL_RATE

    def __init__(self) -> None:
        self._decoder: OpusDecoder | None = None
        self._encoder: OpusEncoder | None = None

    def decode(self, payload: bytes) -> list[bytes]:
        try:
            return [self._decoding().decode(payload)]
        except OpusError as exc:
            raise CodecError(str(exc)) from exc

    def recover(self, next_payload: bytes) -> tuple[bytes, bool]:
        try:
            return self._decoding().recover(next_payload)
        except OpusError as exc:
            raise CodecError(str(exc)) from exc

    def duration(self, payload: bytes) -> float:
        return opus_duration(payload)

    def repair_duration(self) -> float:
        decoder = self._decoder
        return (decoder.last_samples if decoder is not None else FRAME_SAMPLES) / CALL_RATE

    def _decoding(self) -> OpusDecoder:
        if self._decoder is None:
            self._decoder = OpusDecoder()
        return self._decoder

    def encode(self, pcm: bytes) -> bytes:
        """A mono Opus stream is valid in the negotiated opus/48000/2 (RFC 7587 §3.4)."""
        if self._encoder is None:
            self._encoder = OpusEncoder(OPUS_BITRATE)
        try:
            return self._encoder.encode(pcm)
        except OpusError:
            return OPUS_SILENCE

    def silence(self, run: int) -> bytes:
        return self.encode(SILENT_PCM) if run <= ENCODED_SILENCE else OPUS_SILENCE

    def close(self) -> None:
        for codec in (self._decoder, self._encoder):
            if codec is not None:
                codec.close()
        self._decoder = self._encoder = None


class G711:
    clock_rate = G711_RATE

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "pcmu":
            self._decode, self._encode = g711.ulaw_decode, g711.ulaw_encode
        else:
            self._decode, self._encode = g711.alaw_decode, g711.alaw_encode
        self._up = Resampler(G711_RATE, CALL_RATE)
        self._down = Resampler(CALL_RATE, G711_RATE)
        self._cutter = FrameCutter()
        self._out = bytearray()  # 8 kHz PCM resampled, not yet sent
        self._silence = self._encode(bytes(2 * G711_FRAME))

    def decode(self, payload: bytes) -> list[bytes]:
        if not payload:
            raise CodecError("empty packet")
        return self._cutter.cut(self._up.push(self._decode(payload)))

    def recover(self, next_payload: bytes) -> tuple[bytes, bool]:
        return SILENT_PCM, False

    def duration(self, payload: bytes) -> float:
        return len(payload) / G711_RATE  # (a byte a sample)

    def repair_duration(self) -> float:
        return FRAME_SAMPLES / CALL_RATE  # (`recover`: 20 ms of silence)

    def encode(self, pcm: bytes) -> bytes:
        out = self._out
        out += self._down.push(pcm)
        want = 2 * G711_FRAME
        if len(out) < want:  # the filter's first output falls short: lead it with silence
            out[:0] = bytes(want - len(out))
        frame = bytes(out[:want])
        del out[: max(want, len(out) - 2 * want)]  # (never more than a frame behind)
        return self._encode(frame)

    def silence(self, run: int) -> bytes:
        return self._silence

    def close(self) -> None:
        self._up.reset()
        self._down.reset()
        self._out.clear()
        self._cutter.clear()
