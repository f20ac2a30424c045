"""RFC 7983 demultiplexing: which protocol a datagram on a WebRTC 5-tuple carries.

The first byte decides (RFC 7983 §7): 0-3 STUN, 16-19 ZRTP, 20-63 DTLS, 64-79 TURN channel,
128-191 RTP or RTCP. RTP and RTCP share the range; RTCP packet types 192-223 in the second
byte tell them apart (RFC 5761 §4). Classification never raises.

This is the project's one statement of that rule. Packet paths that cannot afford a call per
datagram compare the first byte with `STUN_LAST` themselves (`first <= STUN_LAST`: STUN).
"""

from __future__ import annotations

from enum import IntEnum

STUN_LAST = 3  # RFC 7983 §7: a first byte of 0-3 is STUN


class PacketClass(IntEnum):
    OTHER = 0
    STUN = 1
    ZRTP = 2
    DTLS = 3
    TURN_CHANNEL = 4
    RTP = 5
    RTCP = 6


def _first_byte_table() -> tuple[PacketClass, ...]:
    table = [PacketClass.OTHER] * 256
    for b in range(0, STUN_LAST + 1):
        table[b] = PacketClass.STUN
    for b in range(16, 20):
        table[b] = PacketClass.ZRTP
    for b in range(20, 64):
        table[b] = PacketClass.DTLS
    for b in range(64, 80):
        table[b] = PacketClass.TURN_CHANNEL
    for b in range(128, 192):
        table[b] = PacketClass.RTP
    return tuple(table)


_FIRST_BYTE = _first_byte_table()


def classify(data: bytes | bytearray | memoryview) -> PacketClass:
    if not data:
        return PacketClass.OTHER
    cls = _FIRST_BYTE[data[0]]
    if cls is PacketClass.RTP:
        if len(data) < 2:
            return PacketClass.OTHER
        if 192 <= data[1] <= 223:  # RFC 5761 §4: RTCP packet types
            return PacketClass.RTCP
    return cls


def is_stun(data: bytes | bytearray | memoryview) -> bool:
    """Could this datagram be STUN (its first byte says so)?"""
    return bool(data) and data[0] <= STUN_LAST
