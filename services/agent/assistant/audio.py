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


# G.711 (ITU-T G.711 §2-3): 8 kHz, one byte a sample. `audio/pcmu` is µ-law, `audio/pcma`
# A-law. The codecs work on whole numpy arrays; decoding goes through a 256-entry table.

ULAW_BIAS = 0x84
ULAW_CLIP = 32635
G711_RATE = 8000


def _ulaw_decode_table() -> np.ndarray:
    u = ~np.arange(256, dtype=np.int32) & 0xFF
    exponent = (u >> 4) & 7
    sample = (((u & 0x0F) << 3) + ULAW_BIAS) << exponent
    sample -= ULAW_BIAS
    table: np.ndarray = np.where(u & 0x80, -sample, sample).astype(np.int16)
    return table


def _alaw_decode_table() -> np.ndarray:
    a = np.arange(256, dtype=np.int32) ^ 0x55
    exponent = (a >> 4) & 7
    mantissa = a & 0x0F
    sample = np.where(
        exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0)
    )
    table: np.ndarray = np.where(a & 0x80, sample, -sample).astype(np.int16)
    return table


ULAW_TABLE = _ulaw_decode_table()
ALAW_TABLE = _alaw_decode_table()


def _exponent(magnitude: np.ndarray) -> np.ndarray:
    """The segment of a 15-bit magnitude: floor(log2) - 7, clamped to 0..7."""
    bits = np.floor(np.log2(np.maximum(magnitude, 1))).astype(np.int32)
    segment: np.ndarray = np.clip(bits - 7, 0, 7)
    return segment


def ulaw_encode(pcm: bytes) -> bytes:
    s = np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2").astype(np.int32)
    sign = np.where(s < 0, 0x80, 0)
    magnitude = np.minimum(np.abs(s), ULAW_CLIP) + ULAW_BIAS
    exponent = _exponent(magnitude)
    mantissa = (magnitude >> (exponent + 3)) & 0x0F
    return bytes((~(sign | (exponent << 4) | mantissa) & 0xFF).astype(np.uint8).tobytes())


def alaw_encode(pcm: bytes) -> bytes:
    s = np.frombuffer(pcm[: len(pcm) // 2 * 2], dtype="<i2").astype(np.int32)
    sign = np.where(s >= 0, 0x80, 0)
    magnitude = np.minimum(np.where(s >= 0, s, -s - 1), 32767)
    exponent = np.where(magnitude >= 256, _exponent(magnitude), 0)
    shift = np.where(exponent == 0, 4, exponent + 3)
    mantissa = (magnitude >> shift) & 0x0F
    return bytes(((sign | (exponent << 4) | mantissa) ^ 0x55).astype(np.uint8).tobytes())


def g711_decode(data: bytes, law: str) -> bytes:
    table = ULAW_TABLE if law == "pcmu" else ALAW_TABLE
    return bytes(table[np.frombuffer(data, dtype=np.uint8)].astype("<i2").tobytes())


def to_wire(pcm24k: bytes, fmt: str) -> bytes:
    """24 kHz PCM16 as the session's output format: `pcm`, `pcmu` or `pcma`."""
    if fmt == "pcm":
        return pcm24k
    narrow = resample(pcm24k, RATE, G711_RATE)
    return ulaw_encode(narrow) if fmt == "pcmu" else alaw_encode(narrow)


def from_wire(data: bytes, fmt: str) -> bytes:
    """The session's input format as 24 kHz PCM16 (AudioError for odd-length PCM16)."""
    if fmt == "pcm":
        if len(data) % 2:
            raise AudioError("audio/pcm is 16-bit: an odd number of bytes")
        return data
    return resample(g711_decode(data, fmt), G711_RATE, RATE)
