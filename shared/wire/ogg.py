"""Ogg/Opus writing (RFC 3533, RFC 7845) and what it needs of Opus packets (RFC 6716). Pure.

A call recording is two mono Opus streams (the caller's, the agent's) as they were carried, in
one Ogg/Opus file of two channels: channel mapping family 1 with two streams, none coupled
(RFC 7845 §5.1.1.2), so nothing is decoded or encoded again. Each Ogg packet is then an Opus
*multistream* packet: every stream's packet but the last in self-delimiting framing (RFC 6716
Appendix B), the last as it is.

* `packet_samples(packet)`: how many 48 kHz samples an Opus packet holds (its TOC, §3.1);
* `self_delimited(packet)`: a code 0 packet (one frame: what a 20 ms voice packet is) with its
  frame's length written after the TOC;
* `opus_head(...)`, `opus_tags(...)`: the two header packets;
* `OggWriter`: packets in, pages out (a page per `PAGE_PACKETS` packets, CRC per §6).

Errors: `OpusPacketError` for a packet these cannot frame.
"""

from __future__ import annotations

import struct
import zlib

PAGE_PACKETS = 50  # 1 s of 20 ms packets a page: an interrupted file loses at most that
MAX_SEGMENTS = 255  # lacing values a page can carry (RFC 3533 §6)
_CONTINUED, _FIRST, _LAST = 0x01, 0x02, 0x04

# Frame sizes (48 kHz samples) by TOC config (RFC 6716 §3.1, Table 2): SILK 10/20/40/60 ms,
# Hybrid 10/20 ms, CELT 2.5/5/10/20 ms.
_FRAME = [480, 960, 1920, 2880] * 3 + [480, 960] * 2 + [120, 240, 480, 960] * 4


class OpusPacketError(ValueError):
    pass


_REVERSED = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def ogg_crc(data: bytes) -> int:
    """CRC-32 of RFC 3533 §6 (polynomial 0x04C11DB7, not reflected, no initial or final
    value), computed with zlib's reflected CRC-32 on the bit-reversed bytes, in C: a page is
    up to 64 KiB, and a byte loop in Python cost more than the rest of recording."""
    reflected = zlib.crc32(data.translate(_REVERSED), 0xFFFFFFFF) ^ 0xFFFFFFFF
    return int(f"{reflected:032b}"[::-1], 2)


def packet_samples(packet: bytes) -> int:
    """48 kHz samples in an Opus packet, from its TOC (and frame count byte for code 3)."""
    if not packet:
        raise OpusPacketError("an empty packet has no TOC")
    frame = _FRAME[packet[0] >> 3]
    code = packet[0] & 0x03
    if code == 0:
        return frame
    if code in (1, 2):
        return 2 * frame
    if len(packet) < 2:
        raise OpusPacketError("a code 3 packet without its frame count")
    return (packet[1] & 0x3F) * frame


def self_delimited(packet: bytes) -> bytes:
    """A code 0 packet in self-delimiting framing (RFC 6716 B.1: the frame's length, one or
    two bytes as in §3.2.1, right after the TOC)."""
    if not packet or packet[0] & 0x03:
        raise OpusPacketError("only a one-frame (code 0) packet is framed here")
    size = len(packet) - 1
    if size > 1275:
        raise OpusPacketError("an Opus frame is at most 1275 bytes")
    if size < 252:
        length = bytes([size])
    else:
        length = bytes([252 + (size & 3), (size - 252) >> 2])
    return packet[:1] + length + packet[1:]


def opus_head(channels: int, streams: int, coupled: int, mapping: bytes, pre_skip: int) -> bytes:
    """The ID header (RFC 7845 §5.1), 48 kHz, no gain; family 1 when there is a mapping."""
    head = b"OpusHead" + struct.pack("<BBHIhB", 1, channels, pre_skip, 48000, 0, 1)
    return head + bytes([streams, coupled]) + mapping


def opus_tags(vendor: str, comments: list[str]) -> bytes:
    """The comment header (RFC 7845 §5.2)."""
    out = b"OpusTags" + struct.pack("<I", len(vendor.encode())) + vendor.encode()
    out += struct.pack("<I", len(comments))
    for comment in comments:
        data = comment.encode()
        out += struct.pack("<I", len(data)) + data
    return out


class OggWriter:
    """One logical Ogg stream: `header(packet)` for each header packet (a page each), then
    `audio(packet, samples)`; `take()` gives the bytes made so far; `close()` ends it."""

    def __init__(self, serial: int) -> None:
        self.serial = serial & 0xFFFFFFFF
        self.sequence = 0
        self.granule = 0  # samples of every packet given so far
        self._pending: list[bytes] = []
        self._segments = 0  # lacing values the pending packets take
        self._out = bytearray()
        self._started = False

    def header(self, packet: bytes) -> None:
        self._page([packet], granule=0, flags=0 if self._started else _FIRST)
        self._started = True

    def audio(self, packet: bytes, samples: int) -> None:
        need = len(packet) // 255 + 1
        if need > MAX_SEGMENTS:
            raise OpusPacketError("a packet past a page's 255 lacing values")
        if self._segments + need > MAX_SEGMENTS:  # this one goes on the next page
            self.flush()
        self.granule += samples
        self._pending.append(packet)
        self._segments += need
        if len(self._pending) >= PAGE_PACKETS:
            self.flush()

    def flush(self, last: bool = False) -> None:
        if self._pending or last:
            self._page(self._pending, self.granule, _LAST if last else 0)
            self._pending, self._segments = [], 0

    def close(self) -> None:
        self.flush(last=True)

    def take(self) -> bytes:
        out, self._out = bytes(self._out), bytearray()
        return out

    def _page(self, packets: list[bytes], granule: int, flags: int) -> None:
        lacing = bytearray()
        for packet in packets:
            lacing += b"\xff" * (len(packet) // 255) + bytes([len(packet) % 255])
        if len(lacing) > MAX_SEGMENTS:
            raise OpusPacketError("a page's packets need more than 255 lacing values")
        header = struct.pack(
            "<4sBBqIIIB", b"OggS", 0, flags, granule, self.serial, self.sequence, 0, len(lacing)
        )
        page = bytearray(header + lacing + b"".join(packets))
        struct.pack_into("<I", page, 22, ogg_crc(bytes(page)))
        self._out += page
        self.sequence += 1
