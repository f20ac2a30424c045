from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firsthop.shared.wire.demux import PacketClass, classify, is_stun


@pytest.mark.parametrize(
    ("first", "second", "expected"),
    [
        (0, 1, PacketClass.STUN),
        (1, 1, PacketClass.STUN),
        (3, 0, PacketClass.STUN),
        (4, 0, PacketClass.OTHER),
        (16, 0, PacketClass.ZRTP),
        (20, 0, PacketClass.DTLS),  # change_cipher_spec
        (22, 0xFE, PacketClass.DTLS),  # handshake
        (23, 0xFE, PacketClass.DTLS),  # application data (SCTP)
        (63, 0, PacketClass.DTLS),
        (64, 0, PacketClass.TURN_CHANNEL),
        (79, 0, PacketClass.TURN_CHANNEL),
        (80, 0, PacketClass.OTHER),
        (0x80, 111, PacketClass.RTP),  # Opus PT 111
        (0x80, 0x80 | 111, PacketClass.RTP),  # marker bit
        (0x80, 200, PacketClass.RTCP),  # SR
        (0x81, 201, PacketClass.RTCP),  # RR
        (0x8F, 206, PacketClass.RTCP),  # PSFB
        (191, 0, PacketClass.RTP),
        (192, 200, PacketClass.OTHER),
        (255, 0, PacketClass.OTHER),
    ],
)
def test_rfc7983_ranges(first: int, second: int, expected: PacketClass) -> None:
    assert classify(bytes([first, second]) + bytes(10)) is expected


def test_short() -> None:
    assert classify(b"") is PacketClass.OTHER
    assert classify(b"\x80") is PacketClass.OTHER
    assert not is_stun(b"")
    assert is_stun(b"\x00")


@given(st.binary(max_size=40))
def test_never_raises(data: bytes) -> None:
    assert isinstance(classify(data), PacketClass)
    assert is_stun(data) == (classify(data) is PacketClass.STUN)
