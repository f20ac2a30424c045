"""ITU-T G.711 (µ-law and A-law) for PCM16 mono: pure, table-driven, no I/O.

The telephony codecs an agent protocol may ask for at 8 kHz (`audio/pcmu`, `audio/pcma` in the
Realtime protocol; Twilio Media Streams' `audio/x-mulaw`). Encoding is one lookup per sample in
a 64 Ki-entry table (built once, from the segment arithmetic of G.711's reference
implementation), decoding one lookup per byte.

* `ulaw_encode`/`ulaw_decode`, `alaw_encode`/`alaw_decode`: PCM16 little-endian <-> codes;
  an odd trailing byte of PCM is dropped.
* `prepare()`: build the tables now (some 20 ms each, in Python), so that no call's audio
  waits for it (a service calls it as it starts).
"""

from __future__ import annotations

import array
import sys
from functools import cache


def _samples(pcm: bytes, typecode: str) -> array.array[int]:
    out = array.array(typecode)
    out.frombytes(pcm[: len(pcm) // 2 * 2])
    if sys.byteorder == "big":
        out.byteswap()
    return out


def _pcm(samples: array.array[int]) -> bytes:
    if sys.byteorder == "big":
        samples.byteswap()
    return samples.tobytes()


# -- G.711 (ITU-T G.711; the segment arithmetic of its reference implementation) -----------

ULAW_BIAS = 0x84
ULAW_CLIP = 32635


def _linear_to_ulaw(s: int) -> int:
    sign = 0x80 if s < 0 else 0
    s = min(-s if s < 0 else s, ULAW_CLIP) + ULAW_BIAS
    exponent = max(0, s.bit_length() - 8)
    mantissa = (s >> (exponent + 3)) & 0x0F
    return ~(sign | (exponent << 4) | mantissa) & 0xFF


def _ulaw_to_linear(u: int) -> int:
    u = ~u & 0xFF
    exponent, mantissa = (u >> 4) & 0x07, u & 0x0F
    s = (((mantissa << 3) + ULAW_BIAS) << exponent) - ULAW_BIAS
    return -s if u & 0x80 else s


def _linear_to_alaw(s: int) -> int:
    sign = 0x80 if s >= 0 else 0
    s = min(-s - 1 if s < 0 else s, 32767)
    if s >= 256:
        exponent = s.bit_length() - 8
        mantissa = (s >> (exponent + 3)) & 0x0F
    else:
        exponent, mantissa = 0, s >> 4
    return (sign | (exponent << 4) | mantissa) ^ 0x55


def _alaw_to_linear(a: int) -> int:
    a ^= 0x55
    exponent, mantissa = (a >> 4) & 0x07, a & 0x0F
    s = (mantissa << 4) + 8
    if exponent:
        s = (s + 0x100) << (exponent - 1)
    return s if a & 0x80 else -s


@cache
def _encode_table(law: str) -> bytes:
    """One code per 16-bit sample, indexed by the sample as unsigned (s & 0xFFFF)."""
    f = _linear_to_ulaw if law == "ulaw" else _linear_to_alaw
    return bytes(f(i - 65536 if i >= 32768 else i) for i in range(65536))


@cache
def _decode_table(law: str) -> array.array[int]:
    f = _ulaw_to_linear if law == "ulaw" else _alaw_to_linear
    return array.array("h", (f(b) for b in range(256)))


def _encode(pcm: bytes, law: str) -> bytes:
    table = _encode_table(law)
    return bytes(map(table.__getitem__, _samples(pcm, "H")))


def _decode(data: bytes, law: str) -> bytes:
    table = _decode_table(law)
    return _pcm(array.array("h", map(table.__getitem__, data)))


def prepare() -> None:
    for law in ("ulaw", "alaw"):
        _encode_table(law)
        _decode_table(law)


def ulaw_encode(pcm: bytes) -> bytes:
    return _encode(pcm, "ulaw")


def ulaw_decode(data: bytes) -> bytes:
    return _decode(data, "ulaw")


def alaw_encode(pcm: bytes) -> bytes:
    return _encode(pcm, "alaw")


def alaw_decode(data: bytes) -> bytes:
    return _decode(data, "alaw")
