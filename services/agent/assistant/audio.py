"""PCM16 helpers for the assistant: base64 in and out, resampling, loudness. Pure (numpy).

The Realtime protocol carries `audio/pcm`: 16-bit little-endian mono at 24 kHz, base64 in JSON
strings, or G.711 at 8 kHz (`audio/pcmu`, `audio/pcma`) when the session asks; inside, the
assistant always works on 24 kHz PCM16. Recognition wants 16 kHz, the voices speak at
22.05 kHz: `resample` converts with linear interpolation after a short windowed-sinc low-pass
at 0.45 of the lower rate (aliased highs cost the recogniser words).
"""

from __future__ import annotations

import base64
import binascii
import math

import numpy as np

from firsthop.shared.wire.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

RATE = 24000  # the protocol's audio/pcm rate
BYTES_PER_MS = RATE * 2 // 1000  # 48


class AudioError(ValueError):
    """Client audio that is not base64 PCM16."""


def decode_audio(text: object, fmt: str = "pcm") -> bytes:
    """An append's base64 `audio` in the session's input format, as 24 kHz PCM16."""
    if not isinstance(text, str):
        raise AudioError("audio must be a base64 string")
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AudioError("audio is not valid base64") from exc
    return from_wire(data, fmt)


def encode_audio(pcm24k: bytes, fmt: str = "pcm") -> str:
    """24 kHz PCM16 as a delta's base64 `delta` in the session's output format."""
    return base64.b64encode(to_wire(pcm24k, fmt)).decode("ascii")


LOWPASS_TAPS = 31


def _lowpass(src_rate: int, dst_rate: int) -> np.ndarray:
    n = np.arange(LOWPASS_TAPS) - (LOWPASS_TAPS - 1) / 2
    taps = np.sinc(2 * 0.45 * min(src_rate, dst_rate) / src_rate * n) * np.hamming(LOWPASS_TAPS)
    return taps / taps.sum()  # type: ignore[no-any-return]


def resample(pcm: bytes, src_rate: int, dst_rate: int) -> bytes:
    if src_rate == dst_rate or not pcm:
        return pcm
    samples = np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2").astype(np.float64)
    if len(samples) > LOWPASS_TAPS:
        samples = np.convolve(samples, _lowpass(src_rate, dst_rate), mode="same")
    count = max(1, round(len(samples) * dst_rate / src_rate))
    positions = np.arange(count, dtype=np.float64) * (src_rate / dst_rate)
    out = np.interp(positions, np.arange(len(samples)), samples)
    return bytes(np.clip(np.rint(out), -32768, 32767).astype("<i2").tobytes())


def dbfs(pcm: bytes) -> float:
    samples = np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2").astype(np.float64)
    if samples.size == 0:
        return -120.0
    mean_square = float(np.mean(samples * samples))
    if mean_square <= 0:
        return -120.0
    return 10 * math.log10(mean_square / (32768.0 * 32768.0))


def duration_ms(pcm: bytes, rate: int = RATE) -> int:
    return len(pcm) // 2 * 1000 // rate


# G.711 (`audio/pcmu` µ-law, `audio/pcma` A-law) at 8 kHz: the shared codec.
G711_RATE = 8000
G711 = {"pcmu": (ulaw_encode, ulaw_decode), "pcma": (alaw_encode, alaw_decode)}


def to_wire(pcm24k: bytes, fmt: str) -> bytes:
    """24 kHz PCM16 as the session's output format: `pcm`, `pcmu` or `pcma`."""
    if fmt == "pcm":
        return pcm24k
    return G711[fmt][0](resample(pcm24k, RATE, G711_RATE))


def from_wire(data: bytes, fmt: str) -> bytes:
    """The session's input format as 24 kHz PCM16 (AudioError for odd-length PCM16)."""
    if fmt == "pcm":
        if len(data) % 2:
            raise AudioError("audio/pcm is 16-bit: an odd number of bytes")
        return data
    return resample(G711[fmt][1](data), G711_RATE, RATE)
