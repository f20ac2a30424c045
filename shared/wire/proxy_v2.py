"""PROXY protocol v2 framing, one header per datagram (docs/architecture.md §3).

Every datagram between a relay and a transceiver (and between two relays on a Global Relay
hop) starts with a PROXY v2 header (HAProxy's proxy-protocol.txt §2.2) carrying the original
client address, followed by the untouched client payload. The transport half of the family
byte (§2.2, 14th byte) says how the *client* reached the relay: DGRAM (0x12, 0x22) for UDP,
STREAM (0x11, 0x21) for an ICE-TCP connection (RFC 6544; the relay unframes its RFC 4571
frames, so every frame still travels as one datagram). A reply names the client with the
same transport, which is how the relay finds the connection it goes back on.

Strategy: a header is a pure function of (src, dst), which are constant for the life of a
flow, so the I/O layers build it once per flow and send it with the payload by scatter-gather.
Parsing returns the addresses and the payload offset; it never copies the payload. TLVs after
the address block are skipped by `parse_proxy_v2` (their length is covered by the
address-block length) and read by `parse_tlvs`.

One TLV of our own, in the custom range (§2.2.7, PP2_TYPE_MIN_CUSTOM), goes from a
transceiver back to a relay: `TOKEN_REVOKED` (type 0xE0, value = 0x01 + the route token)
says "no session of mine answers to this token any more" — the relay stops routing it (see
`services/relay/flow_table.py`). Such a datagram carries no payload for the client.

Errors::

    ProxyError
     └── MalformedProxy    bad signature, version, command, family or length
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from firsthop.shared.address import Address

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"  # §2.2: 12 bytes
VERSION_COMMAND_PROXY = 0x21  # version 2, command PROXY
VERSION_COMMAND_LOCAL = 0x20  # version 2, command LOCAL (health checks; carries no addresses)
FAMILY_INET_DGRAM = 0x12  # AF_INET, SOCK_DGRAM
FAMILY_INET6_DGRAM = 0x22  # AF_INET6, SOCK_DGRAM
FAMILY_INET_STREAM = 0x11  # AF_INET, SOCK_STREAM: the client came over TCP (ICE-TCP)
FAMILY_INET6_STREAM = 0x21  # AF_INET6, SOCK_STREAM
PP2_TYPE_FIRSTHOP = 0xE0  # §2.2.7: 0xE0..0xEF are for application-specific data
FIRSTHOP_TOKEN_REVOKED = 0x01  # first value byte of our TLV: a route token follows
MAX_TOKEN_TLV = 64  # a route token is 40 (IPv4) or 56 (IPv6) characters
HEADER_PREFIX = 16
V4_BLOCK = 12  # src ip, dst ip, src port, dst port
V6_BLOCK = 36
V4_HEADER = HEADER_PREFIX + V4_BLOCK  # 28
V6_HEADER = HEADER_PREFIX + V6_BLOCK  # 52

_V4 = struct.Struct("!12sBBH4s4sHH")
_V6 = struct.Struct("!12sBBH16s16sHH")
_PREFIX = struct.Struct("!BBH")


class ProxyError(Exception):
    reason = "proxy_invalid"


class MalformedProxy(ProxyError):
    reason = "proxy_malformed"


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    src: Address
    dst: Address
    payload_offset: int
    tlv_offset: int = 0  # where the TLVs start (== payload_offset when there are none)
    stream: bool = False  # the client's transport is TCP (family byte 0x11 or 0x21)


def build_proxy_v2(src: Address, dst: Address, tlvs: bytes = b"", *, stream: bool = False) -> bytes:
    """The header for a datagram from `src` to `dst` (both of one family), with `tlvs`
    (already encoded, see `encode_tlv`) after the address block; `stream` marks the client's
    transport as TCP."""
    try:
        s4 = socket.inet_pton(socket.AF_INET, src[0])
        d4 = socket.inet_pton(socket.AF_INET, dst[0])
    except OSError:
        pass
    else:
        return (
            _V4.pack(
                SIGNATURE,
                VERSION_COMMAND_PROXY,
                FAMILY_INET_STREAM if stream else FAMILY_INET_DGRAM,
                V4_BLOCK + len(tlvs),
                s4,
                d4,
                src[1],
                dst[1],
            )
            + tlvs
        )
    s6 = socket.inet_pton(socket.AF_INET6, _as_v6(src[0]))
    d6 = socket.inet_pton(socket.AF_INET6, _as_v6(dst[0]))
    return (
        _V6.pack(
            SIGNATURE,
            VERSION_COMMAND_PROXY,
            FAMILY_INET6_STREAM if stream else FAMILY_INET6_DGRAM,
            V6_BLOCK + len(tlvs),
            s6,
            d6,
            src[1],
            dst[1],
        )
        + tlvs
    )


def plain_header_length(data: bytes | bytearray | memoryview) -> int:
    """The length of the PROXY v2 header `data` starts with, if it has no TLVs (28 for
    IPv4, 52 for IPv6), judged by the family byte alone; 0 if `data` is too short. A
    caller that looks the header's exact bytes up uses this; nothing here validates it."""
    if len(data) < V4_HEADER:
        return 0
    if data[13] in (FAMILY_INET6_DGRAM, FAMILY_INET6_STREAM):
        return V6_HEADER if len(data) >= V6_HEADER else 0
    return V4_HEADER


def encode_tlv(tlv_type: int, value: bytes) -> bytes:
    """One TLV (§2.2.7): type (1 byte), length (2 bytes, big-endian), value."""
    if not 0 <= tlv_type <= 0xFF or len(value) > 0xFFFF:
        raise ValueError(f"TLV type {tlv_type:#x} with {len(value)} bytes")
    return bytes((tlv_type,)) + len(value).to_bytes(2, "big") + value


def revocation_tlv(token: bytes) -> bytes:
    """Our TOKEN_REVOKED TLV for a route token (the session behind it is gone)."""
    return encode_tlv(PP2_TYPE_FIRSTHOP, bytes((FIRSTHOP_TOKEN_REVOKED,)) + token)


def parse_tlvs(data: bytes | bytearray | memoryview, hdr: ProxyHeader) -> list[tuple[int, bytes]]:
    """The TLVs of a header parsed from `data`; raises `MalformedProxy` if they do not
    tile the space between the address block and the payload exactly."""
    out: list[tuple[int, bytes]] = []
    offset, end = hdr.tlv_offset, hdr.payload_offset
    while offset < end:
        if end - offset < 3:
            raise MalformedProxy("truncated TLV header")
        length = int.from_bytes(data[offset + 1 : offset + 3], "big")
        if offset + 3 + length > end:
            raise MalformedProxy("TLV overruns the address block")
        out.append((data[offset], bytes(data[offset + 3 : offset + 3 + length])))
        offset += 3 + length
    return out


def revoked_token(data: bytes | bytearray | memoryview, hdr: ProxyHeader) -> bytes | None:
    """The route token of a TOKEN_REVOKED TLV in this header, or None (never raises)."""
    if hdr.tlv_offset == hdr.payload_offset:
        return None
    try:
        tlvs = parse_tlvs(data, hdr)
    except MalformedProxy:
        return None
    for tlv_type, value in tlvs:
        if (
            tlv_type == PP2_TYPE_FIRSTHOP
            and 1 < len(value) <= MAX_TOKEN_TLV + 1
            and value[0] == FIRSTHOP_TOKEN_REVOKED
        ):
            return value[1:]
    return None


def _as_v6(host: str) -> str:
    # A mixed pair (v4 client on a v6 socket) is written as v4-mapped v6 addresses.
    return host if ":" in host else "::ffff:" + host


def parse_proxy_v2(data: bytes | bytearray | memoryview) -> ProxyHeader:
    """Parse the header at the start of `data`; the payload starts at `payload_offset`."""
    if len(data) < HEADER_PREFIX or data[:12] != SIGNATURE:
        raise MalformedProxy("missing PROXY v2 signature")
    ver_cmd, fam, block = _PREFIX.unpack_from(data, 12)
    if ver_cmd != VERSION_COMMAND_PROXY:
        raise MalformedProxy(f"unsupported version/command 0x{ver_cmd:02x}")
    end = HEADER_PREFIX + block
    if end > len(data):
        raise MalformedProxy("address block overruns the datagram")
    if fam in (FAMILY_INET_DGRAM, FAMILY_INET_STREAM):
        if block < V4_BLOCK:
            raise MalformedProxy("IPv4 address block too short")
        _, _, _, _, s, d, sp, dp = _V4.unpack_from(data)
        af = socket.AF_INET
        tlv_offset = V4_HEADER
    elif fam in (FAMILY_INET6_DGRAM, FAMILY_INET6_STREAM):
        if block < V6_BLOCK:
            raise MalformedProxy("IPv6 address block too short")
        _, _, _, _, s, d, sp, dp = _V6.unpack_from(data)
        af = socket.AF_INET6
        tlv_offset = V6_HEADER
    else:
        raise MalformedProxy(f"unsupported family/transport 0x{fam:02x}")
    src = (socket.inet_ntop(af, s), sp)
    stream = fam in (FAMILY_INET_STREAM, FAMILY_INET6_STREAM)
    return ProxyHeader(src, (socket.inet_ntop(af, d), dp), end, tlv_offset, stream)
