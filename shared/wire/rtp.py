"""RTP packets (RFC 3550 §5.1), with CSRCs and RFC 8285 header extensions.

Two ways in, one out:

* `parse_rtp(data) -> RtpPacket`: every field, the CSRC list, the header extension (its
  RFC 8285 elements, one- or two-byte form, or the raw block of another profile) and the
  payload with any padding removed. For tests, the media core's slow paths and tools.
* `rtp_header(data) -> RtpHeader`: what the media core needs of every inbound packet
  (payload type, sequence number, timestamp, SSRC, where the payload starts and ends) in
  one `unpack_from` and a few checks: no objects per element, no payload copy.
* `RtpPacket.encode()` and `encode_extensions(...)`; a sender builds its fixed extension
  block once per stream and packs each header with `pack_header`.

`is_rtcp(data)` tells RTCP from RTP on a multiplexed port (RFC 5761 §4: RTCP packet types
192-223 fall where RTP's marker bit and payload type would be 64-95, which RTP never uses).

Errors::

    RtpError
     └── MalformedRtp    not an RTP packet, or its lengths do not add up

Parsers raise only these; never IndexError or struct.error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

VERSION = 2  # RFC 3550 §5.1
HEADER = 12  # fixed header, bytes
ONE_BYTE_PROFILE = 0xBEDE  # RFC 8285 §4.2
TWO_BYTE_PROFILE = 0x1000  # RFC 8285 §4.3: 0x100 then 4 bits of appbits
MAX_CSRCS = 15  # the CC field's 4 bits
_FIXED = struct.Struct("!BBHII")


class RtpError(Exception):
    reason = "rtp_invalid"


class MalformedRtp(RtpError):
    reason = "rtp_malformed"


@dataclass(frozen=True, slots=True)
class RtpHeader:
    """The fields of one inbound packet the media path reads (`rtp_header`)."""

    payload_type: int
    sequence_number: int
    timestamp: int
    ssrc: int
    marker: bool
    payload_start: int
    payload_end: int


@dataclass(slots=True)
class RtpPacket:
    payload_type: int
    sequence_number: int
    timestamp: int
    ssrc: int
    payload: bytes = b""
    marker: bool = False
    csrcs: tuple[int, ...] = ()
    # RFC 8285 elements (id, data), in order; `extension_profile` says which form.
    extensions: tuple[tuple[int, bytes], ...] = ()
    extension_profile: int | None = None  # None: no extension block
    extension_raw: bytes = b""  # the block's data for a profile other than RFC 8285's
    padding: int = field(default=0)  # padding bytes that followed the payload (parsed)

    def encode(self) -> bytes:
        """The packet on the wire (no padding: SRTP and WebRTC send none)."""
        if len(self.csrcs) > MAX_CSRCS:
            raise MalformedRtp(f"{len(self.csrcs)} CSRCs: at most {MAX_CSRCS}")
        ext = b""
        if self.extension_profile is not None:
            if self.extensions:
                ext = encode_extensions(self.extensions, self.extension_profile)
            else:
                raw = self.extension_raw
                if len(raw) % 4:
                    raise MalformedRtp("an extension block is whole 32-bit words")
                ext = struct.pack("!HH", self.extension_profile, len(raw) // 4) + raw
        head = pack_header(
            self.payload_type,
            self.sequence_number,
            self.timestamp,
            self.ssrc,
            marker=self.marker,
            csrc_count=len(self.csrcs),
            extension=bool(ext),
        )
        csrcs = b"".join(c.to_bytes(4, "big") for c in self.csrcs)
        return head + csrcs + ext + self.payload


def pack_header(
    payload_type: int,
    sequence_number: int,
    timestamp: int,
    ssrc: int,
    *,
    marker: bool = False,
    csrc_count: int = 0,
    extension: bool = False,
) -> bytes:
    """The 12-byte fixed header (RFC 3550 §5.1); CSRCs and an extension block follow it."""
    first = (VERSION << 6) | (0x10 if extension else 0) | csrc_count
    second = (0x80 if marker else 0) | (payload_type & 0x7F)
    return _FIXED.pack(first, second, sequence_number & 0xFFFF, timestamp & 0xFFFFFFFF, ssrc)


def encode_extensions(elements: tuple[tuple[int, bytes], ...], profile: int) -> bytes:
    """An RFC 8285 extension block (its 4-byte header included), padded to 32 bits."""
    body = bytearray()
    if profile == ONE_BYTE_PROFILE:
        for ident, data in elements:
            if not 1 <= ident <= 14 or not 1 <= len(data) <= 16:  # §4.2: 15 is reserved
                raise MalformedRtp(f"one-byte element id {ident}, {len(data)} bytes")
            body.append((ident << 4) | (len(data) - 1))
            body += data
    elif profile & 0xFFF0 == TWO_BYTE_PROFILE:
        for ident, data in elements:
            if not 1 <= ident <= 255 or len(data) > 255:
                raise MalformedRtp(f"two-byte element id {ident}, {len(data)} bytes")
            body += bytes((ident, len(data))) + data
    else:
        raise MalformedRtp(f"profile {profile:#06x} has no RFC 8285 elements")
    body += bytes(-len(body) % 4)
    return struct.pack("!HH", profile, len(body) // 4) + body


def is_rtcp(data: bytes | bytearray | memoryview) -> bool:
    """RFC 5761 §4: on a port carrying both, RTCP's packet types are 192-223."""
    return len(data) >= 2 and 192 <= data[1] <= 223


def rtp_header(data: bytes | bytearray | memoryview) -> RtpHeader:
    """The fields the media path needs, checked: version 2, CSRCs and extension within the
    packet, padding no longer than what is left."""
    n = len(data)
    if n < HEADER:
        raise MalformedRtp(f"{n} bytes: shorter than the fixed header")
    try:
        first, second, seq, ts, ssrc = _FIXED.unpack_from(data)
    except struct.error as exc:  # (the length was checked; for an exotic buffer)
        raise MalformedRtp(str(exc)) from None
    if first >> 6 != VERSION:
        raise MalformedRtp(f"version {first >> 6}")
    start = HEADER + 4 * (first & 0x0F)
    if first & 0x10:
        if start + 4 > n:
            raise MalformedRtp("extension header past the end")
        start += 4 + 4 * ((data[start + 2] << 8) | data[start + 3])
    end = n
    if first & 0x20:
        pad = data[n - 1]
        if pad == 0:
            raise MalformedRtp("padding of zero bytes")
        end -= pad
    if start > end:
        raise MalformedRtp("header, extension and padding overrun the packet")
    return RtpHeader(second & 0x7F, seq, ts, ssrc, bool(second & 0x80), start, end)


def parse_rtp(data: bytes | bytearray | memoryview) -> RtpPacket:
    """Every field of one RTP packet (RFC 3550 §5.1, RFC 8285)."""
    data = bytes(data)
    header = rtp_header(data)
    first = data[0]
    offset = HEADER
    csrcs = tuple(
        int.from_bytes(data[offset + 4 * i : offset + 4 * i + 4], "big")
        for i in range(first & 0x0F)
    )
    offset += 4 * len(csrcs)
    profile: int | None = None
    elements: tuple[tuple[int, bytes], ...] = ()
    raw = b""
    if first & 0x10:
        profile = (data[offset] << 8) | data[offset + 1]
        words = (data[offset + 2] << 8) | data[offset + 3]
        block = data[offset + 4 : offset + 4 + 4 * words]
        if profile == ONE_BYTE_PROFILE or profile & 0xFFF0 == TWO_BYTE_PROFILE:
            elements = _parse_elements(block, profile)
        else:
            raw = block
    return RtpPacket(
        payload_type=header.payload_type,
        sequence_number=header.sequence_number,
        timestamp=header.timestamp,
        ssrc=header.ssrc,
        payload=data[header.payload_start : header.payload_end],
        marker=header.marker,
        csrcs=csrcs,
        extensions=elements,
        extension_profile=profile,
        extension_raw=raw,
        padding=len(data) - header.payload_end,
    )


def _parse_elements(block: bytes, profile: int) -> tuple[tuple[int, bytes], ...]:
    """RFC 8285 §4.2/§4.3 elements; padding bytes (0) between them are skipped."""
    out: list[tuple[int, bytes]] = []
    i, n = 0, len(block)
    one_byte = profile == ONE_BYTE_PROFILE
    while i < n:
        byte = block[i]
        if byte == 0:  # padding
            i += 1
            continue
        if one_byte:
            ident, length = byte >> 4, (byte & 0x0F) + 1
            if ident == 15:  # §4.2: stop parsing the block here
                break
            i += 1
        else:
            if i + 1 >= n:
                raise MalformedRtp("two-byte element header past the block")
            ident, length = byte, block[i + 1]
            i += 2
        if i + length > n:
            raise MalformedRtp(f"element {ident} of {length} bytes past the block")
        out.append((ident, block[i : i + length]))
        i += length
    return tuple(out)


def extension(packet: RtpPacket, ident: int) -> bytes | None:
    """The data of element `ident`, if the packet has it."""
    for element_id, data in packet.extensions:
        if element_id == ident:
            return data
    return None
