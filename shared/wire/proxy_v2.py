"""PROXY protocol v2 framing, DGRAM transport, one header per datagram (ARCHITECTURE §3).

Every datagram between a relay and a transceiver (and between two relays on a Global Relay
hop) starts with a PROXY v2 header (HAProxy's proxy-protocol.txt §2.2) carrying the original
client address, followed by the untouched client payload.

Strategy: a header is a pure function of (src, dst), which are constant for the life of a
flow, so the I/O layers build it once per flow and send it with the payload by scatter-gather.
Parsing returns the addresses and the payload offset; it never copies the payload. TLVs after
the address block are skipped (their length is covered by the address-block length).

Errors::

    ProxyError
     └── MalformedProxy    bad signature, version, command, family or length
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"  # §2.2: 12 bytes
VERSION_COMMAND_PROXY = 0x21  # version 2, command PROXY
VERSION_COMMAND_LOCAL = 0x20  # version 2, command LOCAL (health checks; carries no addresses)
FAMILY_INET_DGRAM = 0x12  # AF_INET, SOCK_DGRAM
FAMILY_INET6_DGRAM = 0x22  # AF_INET6, SOCK_DGRAM
HEADER_PREFIX = 16
V4_BLOCK = 12  # src ip, dst ip, src port, dst port
V6_BLOCK = 36
V4_HEADER = HEADER_PREFIX + V4_BLOCK  # 28
V6_HEADER = HEADER_PREFIX + V6_BLOCK  # 52

_V4 = struct.Struct("!12sBBH4s4sHH")
_V6 = struct.Struct("!12sBBH16s16sHH")
_PREFIX = struct.Struct("!BBH")

Address = tuple[str, int]


class ProxyError(Exception):
    reason = "proxy_invalid"


class MalformedProxy(ProxyError):
    reason = "proxy_malformed"


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    src: Address
    dst: Address
    payload_offset: int


def build_proxy_v2(src: Address, dst: Address) -> bytes:
    """The header for a datagram from `src` to `dst`; both must be of one family."""
    try:
        s4 = socket.inet_pton(socket.AF_INET, src[0])
        d4 = socket.inet_pton(socket.AF_INET, dst[0])
    except OSError:
        pass
    else:
        return _V4.pack(
            SIGNATURE, VERSION_COMMAND_PROXY, FAMILY_INET_DGRAM, V4_BLOCK, s4, d4, src[1], dst[1]
        )
    s6 = socket.inet_pton(socket.AF_INET6, _as_v6(src[0]))
    d6 = socket.inet_pton(socket.AF_INET6, _as_v6(dst[0]))
    return _V6.pack(
        SIGNATURE, VERSION_COMMAND_PROXY, FAMILY_INET6_DGRAM, V6_BLOCK, s6, d6, src[1], dst[1]
    )


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
    if fam == FAMILY_INET_DGRAM:
        if block < V4_BLOCK:
            raise MalformedProxy("IPv4 address block too short")
        _, _, _, _, s, d, sp, dp = _V4.unpack_from(data)
        af = socket.AF_INET
    elif fam == FAMILY_INET6_DGRAM:
        if block < V6_BLOCK:
            raise MalformedProxy("IPv6 address block too short")
        _, _, _, _, s, d, sp, dp = _V6.unpack_from(data)
        af = socket.AF_INET6
    else:
        raise MalformedProxy(f"unsupported family/transport 0x{fam:02x}")
    return ProxyHeader((socket.inet_ntop(af, s), sp), (socket.inet_ntop(af, d), dp), end)
