"""WAVE files of G.711 (RIFF; WAVE_FORMAT_ALAW 6, WAVE_FORMAT_MULAW 7). Pure.

A phone call's recording is the two sides' G.711 as they were carried, interleaved byte by
byte into one two-channel file (caller left, agent right): nothing is decoded or coded
again. The file is written while the call lasts, so its header is written first with the
sizes unknown (0xFFFFFFFF: readers such as ffmpeg read such a `data` chunk to the end of the
file) and given the real ones when the file is finished (`sized_header`).

Layout (58 bytes before the samples): `RIFF` size `WAVE`, `fmt ` of 18 bytes (WAVEFORMATEX
with cbSize 0), `fact` (sample frames, as non-PCM formats carry), `data` size.
"""

from __future__ import annotations

import struct

ALAW, MULAW = 6, 7  # WAVE format tags
HEADER = 58
_UNKNOWN = 0xFFFFFFFF
_RIFF_SIZE, _FACT_SAMPLES, _DATA_SIZE = 4, 46, 54  # offsets of the sizes


class WavError(ValueError):
    pass


def g711_header(tag: int, channels: int, rate: int, data_bytes: int | None = None) -> bytes:
    """The header of a G.711 file (8-bit samples); `data_bytes` None: not known yet."""
    if tag not in (ALAW, MULAW):
        raise WavError("a G.711 file is A-law (6) or mu-law (7)")
    fmt = struct.pack("<HHIIHHH", tag, channels, rate, rate * channels, channels, 8, 0)
    head = (
        b"RIFF" + struct.pack("<I", _UNKNOWN) + b"WAVE"
        + b"fmt " + struct.pack("<I", len(fmt)) + fmt
        + b"fact" + struct.pack("<II", 4, _UNKNOWN)
        + b"data" + struct.pack("<I", _UNKNOWN)
    )  # fmt: skip
    assert len(head) == HEADER
    return head if data_bytes is None else sized_header(head, data_bytes)


def sized_header(header: bytes, data_bytes: int) -> bytes:
    """`header` (one `g711_header` made) with the sizes of `data_bytes` of samples (whole
    sample frames: a torn last one is not counted)."""
    if len(header) < HEADER or header[:4] != b"RIFF" or header[8:12] != b"WAVE":
        raise WavError("not a header this module writes")
    (channels,) = struct.unpack_from("<H", header, 22)
    (block,) = struct.unpack_from("<H", header, 32)
    if not channels or not block or header[38:42] != b"fact" or header[50:54] != b"data":
        raise WavError("not a header this module writes")
    data_bytes = min(data_bytes, _UNKNOWN - HEADER)
    data_bytes -= data_bytes % block
    out = bytearray(header[:HEADER])
    struct.pack_into("<I", out, _RIFF_SIZE, HEADER - 8 + data_bytes)
    struct.pack_into("<I", out, _FACT_SAMPLES, data_bytes // block)
    struct.pack_into("<I", out, _DATA_SIZE, data_bytes)
    return bytes(out)


def data_size(header: bytes) -> int:
    """The `data` chunk's size a header gives (0xFFFFFFFF: not known)."""
    if len(header) < HEADER or header[50:54] != b"data":
        raise WavError("not a header this module writes")
    return int(struct.unpack_from("<I", header, _DATA_SIZE)[0])


def interleave(left: bytes | bytearray, right: bytes | bytearray) -> bytes:
    """Two channels of 8-bit samples, as many of each, into one frame after another."""
    if len(left) != len(right):
        raise WavError("both channels need as many samples")
    out = bytearray(2 * len(left))
    out[0::2] = left
    out[1::2] = right
    return bytes(out)
