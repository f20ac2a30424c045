"""RTCP packets (RFC 3550 §6): SR, RR, SDES and BYE, compound or reduced-size (RFC 5506).

`parse_rtcp(data)` reads every packet of a compound datagram, in order; a type this module
does not model (APP, the feedback messages of RFC 4585, XR) comes back as `RtcpOther` with
its body, so a receiver can skip it and a relay could pass it on. `encode_rtcp(packets)`
writes them. RFC 5506 lets a datagram start with any type and hold a single packet; nothing
here insists on an SR or RR first, which is what RFC 3550's compound rule would need.

Invariants: every packet's length field (32-bit words minus one, §6.4.1) is honoured and
must fit the datagram; padding (P bit) is allowed on the last packet only, as §6.4.1 says;
a report count larger than the packet holds is malformed. `cumulative_lost` is the signed
24-bit value of RFC 3550 §6.4.1 (duplicates can make it negative).

Errors::

    RtcpError
     └── MalformedRtcp    lengths, counts or the version do not add up

Parsers raise only these; never IndexError or struct.error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

SR, RR, SDES, BYE = 200, 201, 202, 203  # RFC 3550 §12.1
SDES_CNAME = 1  # RFC 3550 §6.5.1
NTP_EPOCH_OFFSET = 2208988800  # seconds from 1900 (NTP) to 1970 (Unix)
MAX_REPORTS = 31  # the 5-bit count
_HEADER = struct.Struct("!BBH")
_BLOCK = struct.Struct("!IB3sIIII")
_SENDER_INFO = struct.Struct("!IIIII")  # NTP msw, lsw, RTP timestamp, packets, octets


class RtcpError(Exception):
    reason = "rtcp_invalid"


class MalformedRtcp(RtcpError):
    reason = "rtcp_malformed"


@dataclass(frozen=True, slots=True)
class ReportBlock:
    """One reception report (RFC 3550 §6.4.1)."""

    ssrc: int
    fraction_lost: int  # of 256, since the last report
    cumulative_lost: int  # signed 24 bits
    highest_sequence: int  # extended: cycles << 16 | highest sequence number
    jitter: int  # interarrival jitter, timestamp units
    lsr: int  # middle 32 bits of the last SR's NTP timestamp (0: none yet)
    dlsr: int  # since that SR, in units of 1/65536 s


@dataclass(frozen=True, slots=True)
class SenderReport:
    ssrc: int
    ntp_timestamp: int  # 64-bit NTP: seconds since 1900 << 32 | fraction
    rtp_timestamp: int
    packet_count: int
    octet_count: int
    reports: tuple[ReportBlock, ...] = ()


@dataclass(frozen=True, slots=True)
class ReceiverReport:
    ssrc: int
    reports: tuple[ReportBlock, ...] = ()


@dataclass(frozen=True, slots=True)
class SourceDescription:
    """SDES (§6.5): per source, its items as (type, value)."""

    chunks: tuple[tuple[int, tuple[tuple[int, bytes], ...]], ...]


@dataclass(frozen=True, slots=True)
class Goodbye:
    """BYE (§6.6): these sources leave, perhaps saying why."""

    sources: tuple[int, ...]
    reason: bytes = b""


@dataclass(frozen=True, slots=True)
class RtcpOther:
    """A packet of a type not modelled here: its header fields and body, kept whole."""

    packet_type: int
    count: int
    body: bytes


RtcpPacket = SenderReport | ReceiverReport | SourceDescription | Goodbye | RtcpOther


def ntp_timestamp(unix_time: float) -> int:
    """64-bit NTP time of a Unix time (RFC 3550 §4)."""
    seconds = int(unix_time)
    fraction = int((unix_time - seconds) * (1 << 32)) & 0xFFFFFFFF
    return ((seconds + NTP_EPOCH_OFFSET) & 0xFFFFFFFF) << 32 | fraction


def middle_32(ntp: int) -> int:
    """The LSR form of an NTP timestamp (§6.4.1): its middle 32 bits."""
    return (ntp >> 16) & 0xFFFFFFFF


# -- parsing ----------------------------------------------------------------------------------


def parse_rtcp(data: bytes | bytearray | memoryview, limit: int | None = None) -> list[RtcpPacket]:
    """Every packet of one RTCP datagram, in order (at least one); with `limit`, the first
    that many and nothing past them is read (a compound packet of hundreds of empty ones
    costs no more than a real one)."""
    data = bytes(data)
    packets: list[RtcpPacket] = []
    offset, n = 0, len(data)
    if n < 4:
        raise MalformedRtcp(f"{n} bytes: shorter than a header")
    while offset < n and (limit is None or len(packets) < limit):
        if offset + 4 > n:
            raise MalformedRtcp("trailing bytes shorter than a header")
        first, packet_type, words = _HEADER.unpack_from(data, offset)
        if first >> 6 != 2:
            raise MalformedRtcp(f"version {first >> 6}")
        end = offset + 4 * (words + 1)
        if end > n:
            raise MalformedRtcp(f"type {packet_type}: {4 * (words + 1)} bytes past the end")
        body_end = end
        if first & 0x20:
            if end != n:
                raise MalformedRtcp("padding on a packet that is not the last")
            pad = data[end - 1]
            if pad == 0 or pad > end - offset - 4:
                raise MalformedRtcp(f"padding of {pad} bytes")
            body_end = end - pad
        count = first & 0x1F
        packets.append(_parse_one(packet_type, count, data[offset + 4 : body_end]))
        offset = end
    return packets


def _parse_one(packet_type: int, count: int, body: bytes) -> RtcpPacket:
    if packet_type == SR:
        if len(body) < 24 + 24 * count:
            raise MalformedRtcp(f"SR of {len(body)} bytes with {count} reports")
        ssrc = int.from_bytes(body[:4], "big")
        msw, lsw, rtp_ts, packets, octets = _SENDER_INFO.unpack_from(body, 4)
        return SenderReport(
            ssrc, msw << 32 | lsw, rtp_ts, packets, octets, _blocks(body, 24, count)
        )
    if packet_type == RR:
        if len(body) < 4 + 24 * count:
            raise MalformedRtcp(f"RR of {len(body)} bytes with {count} reports")
        return ReceiverReport(int.from_bytes(body[:4], "big"), _blocks(body, 4, count))
    if packet_type == SDES:
        return SourceDescription(_chunks(body, count))
    if packet_type == BYE:
        if len(body) < 4 * count:
            raise MalformedRtcp(f"BYE of {len(body)} bytes for {count} sources")
        sources = tuple(int.from_bytes(body[4 * i : 4 * i + 4], "big") for i in range(count))
        reason = b""
        if len(body) > 4 * count:
            length = body[4 * count]
            if 4 * count + 1 + length > len(body):
                raise MalformedRtcp("BYE reason past the packet")
            reason = body[4 * count + 1 : 4 * count + 1 + length]
        return Goodbye(sources, reason)
    return RtcpOther(packet_type, count, body)


def _blocks(body: bytes, offset: int, count: int) -> tuple[ReportBlock, ...]:
    blocks = []
    for i in range(count):
        ssrc, fraction, lost, highest, jitter, lsr, dlsr = _BLOCK.unpack_from(body, offset + 24 * i)
        cumulative = int.from_bytes(lost, "big", signed=True)
        blocks.append(ReportBlock(ssrc, fraction, cumulative, highest, jitter, lsr, dlsr))
    return tuple(blocks)


def _chunks(body: bytes, count: int) -> tuple[tuple[int, tuple[tuple[int, bytes], ...]], ...]:
    """SDES chunks (§6.5): SSRC, items, a null item, then padding to 32 bits."""
    chunks = []
    offset, n = 0, len(body)
    for _ in range(count):
        if offset + 4 > n:
            raise MalformedRtcp("SDES chunk past the packet")
        ssrc = int.from_bytes(body[offset : offset + 4], "big")
        offset += 4
        items = []
        while True:
            if offset >= n:
                raise MalformedRtcp("SDES chunk without its null item")
            kind = body[offset]
            if kind == 0:
                offset += 1
                offset += -offset % 4  # the chunk ends on a 32-bit boundary
                break
            if offset + 2 > n or offset + 2 + body[offset + 1] > n:
                raise MalformedRtcp("SDES item past the packet")
            length = body[offset + 1]
            items.append((kind, body[offset + 2 : offset + 2 + length]))
            offset += 2 + length
        chunks.append((ssrc, tuple(items)))
    return tuple(chunks)


# -- encoding ---------------------------------------------------------------------------------


def encode_rtcp(packets: list[RtcpPacket] | tuple[RtcpPacket, ...]) -> bytes:
    """One RTCP datagram of `packets`, in order (no padding)."""
    return b"".join(_encode_one(p) for p in packets)


def _encode_one(packet: RtcpPacket) -> bytes:
    match packet:
        case SenderReport(ssrc, ntp, rtp_ts, count, octets, reports):
            info = _SENDER_INFO.pack(
                ntp >> 32, ntp & 0xFFFFFFFF, rtp_ts & 0xFFFFFFFF, count, octets & 0xFFFFFFFF
            )
            body = ssrc.to_bytes(4, "big") + info + _encode_blocks(reports)
            return _wrap(SR, len(reports), body)
        case ReceiverReport(ssrc, reports):
            return _wrap(RR, len(reports), ssrc.to_bytes(4, "big") + _encode_blocks(reports))
        case SourceDescription(chunks):
            sdes = bytearray()
            for ssrc, items in chunks:
                sdes += ssrc.to_bytes(4, "big")
                for kind, value in items:
                    if not 1 <= kind <= 255 or len(value) > 255:
                        raise MalformedRtcp(f"SDES item {kind} of {len(value)} bytes")
                    sdes += bytes((kind, len(value))) + value
                sdes += b"\x00"
                sdes += bytes(-len(sdes) % 4)
            return _wrap(SDES, len(chunks), bytes(sdes))
        case Goodbye(sources, reason):
            body = b"".join(s.to_bytes(4, "big") for s in sources)
            if reason:
                if len(reason) > 255:
                    raise MalformedRtcp("a BYE reason is at most 255 bytes")
                text = bytes((len(reason),)) + reason
                body += text + bytes(-len(text) % 4)
            return _wrap(BYE, len(sources), body)
        case RtcpOther(packet_type, count, body):
            return _wrap(packet_type, count, body + bytes(-len(body) % 4))
    raise MalformedRtcp(f"not an RTCP packet: {type(packet).__name__}")


def _encode_blocks(reports: tuple[ReportBlock, ...]) -> bytes:
    return b"".join(
        _BLOCK.pack(
            r.ssrc,
            r.fraction_lost,
            max(-(1 << 23), min((1 << 23) - 1, r.cumulative_lost)).to_bytes(3, "big", signed=True),
            r.highest_sequence & 0xFFFFFFFF,
            r.jitter & 0xFFFFFFFF,
            r.lsr & 0xFFFFFFFF,
            r.dlsr & 0xFFFFFFFF,
        )
        for r in reports
    )


def _wrap(packet_type: int, count: int, body: bytes) -> bytes:
    if count > MAX_REPORTS:
        raise MalformedRtcp(f"a count of {count}: at most {MAX_REPORTS}")
    if len(body) % 4:
        raise MalformedRtcp("an RTCP packet is whole 32-bit words")
    return _HEADER.pack(0x80 | count, packet_type, len(body) // 4) + body
