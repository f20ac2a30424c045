"""The call's SRTP contexts (services/transceiver/media/srtp.py): keys split as RFC 5764 §4.2
says, every profile aiortc negotiates, and failures counted by kind."""

from __future__ import annotations

import os

import pytest

from firsthop.services.transceiver.media.srtp import PROFILES, SrtpContext
from firsthop.shared.wire import rtcp, rtp


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_client_and_server_halves_talk_both_ways(profile: str) -> None:
    _, key, salt = PROFILES[profile]
    material = os.urandom(2 * (key + salt))
    client = SrtpContext.from_keying_material(material, profile, client=True)
    server = SrtpContext.from_keying_material(material, profile, client=False)
    packet = rtp.RtpPacket(111, 1, 2, 3, b"opus").encode()
    assert server.unprotect_rtp(client.protect_rtp(packet)) == packet
    assert client.unprotect_rtp(server.protect_rtp(packet)) == packet
    report = rtcp.encode_rtcp([rtcp.ReceiverReport(3)])
    assert server.unprotect_rtcp(client.protect_rtcp(report)) == report
    # a side does not accept its own packets back (each direction has its own key)
    assert client.unprotect_rtp(client.protect_rtp(rtp.RtpPacket(0, 9, 2, 3).encode())) is None


def test_failures_are_counted_by_kind() -> None:
    material = os.urandom(60)
    client = SrtpContext.from_keying_material(material, "SRTP_AES128_CM_SHA1_80", client=True)
    server = SrtpContext.from_keying_material(material, "SRTP_AES128_CM_SHA1_80", client=False)
    sent = client.protect_rtp(rtp.RtpPacket(111, 1, 2, 3, b"x" * 40).encode())
    assert server.unprotect_rtp(sent) is not None
    assert server.unprotect_rtp(sent) is None  # the same again: replayed
    tampered = bytearray(client.protect_rtp(rtp.RtpPacket(111, 2, 2, 3, b"x" * 40).encode()))
    tampered[20] ^= 0x01
    assert server.unprotect_rtp(bytes(tampered)) is None
    assert server.unprotect_rtcp(b"\x80\xc9\x00\x01") is None  # too short to carry an index
    counts = server.counts
    assert (counts.replayed, counts.auth_failed, counts.malformed) == (1, 1, 1)


def test_keying_of_the_wrong_length_is_refused() -> None:
    with pytest.raises(ValueError):
        SrtpContext.from_keying_material(bytes(59), "SRTP_AES128_CM_SHA1_80", client=True)
