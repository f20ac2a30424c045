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


def _exchange(profile: str, material: bytes) -> tuple[list[object], tuple[int, int, int]]:
    """One side's packets to the other, good and bad, both ways round; what came out and
    what was counted."""
    client = SrtpContext.from_keying_material(material, profile, client=True)
    server = SrtpContext.from_keying_material(material, profile, client=False)
    out: list[object] = []
    packets = [
        rtp.RtpPacket(111, seq, 960 * seq, 7, bytes([seq]) * 80).encode() for seq in range(6)
    ]
    sent = [client.protect_rtp(p) for p in packets]
    out += sent
    out += [server.unprotect_rtp(p) for p in sent]
    out.append(server.unprotect_rtp(sent[2]))  # replayed
    tampered = bytearray(client.protect_rtp(rtp.RtpPacket(111, 6, 0, 7, bytes(80)).encode()))
    tampered[-1] ^= 0x80
    out.append(server.unprotect_rtp(bytes(tampered)))  # forged (fresh, so not a replay)
    out.append(server.unprotect_rtp(b"\x80\x6f\x00\x01" + bytes(1497)))  # 1,501 bytes: too long
    out.append(server.unprotect_rtp(b"\x80\x6f\x00"))  # shorter than a header
    report = rtcp.encode_rtcp([rtcp.ReceiverReport(7)])
    srtcp = client.protect_rtcp(report)
    out += [srtcp, server.unprotect_rtcp(srtcp), server.unprotect_rtcp(srtcp)]
    out.append(server.unprotect_rtcp(b"\x80\xc9\x00\x01"))  # too short to carry an index
    out.append(server.unprotect_rtcp(b"\x80\xc9" + bytes(1600)))
    counts = server.counts
    return out, (counts.replayed, counts.auth_failed, counts.malformed)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_c_calls_give_what_pylibsrtp_gives_and_count_refusals_alike(
    profile: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each packet goes to libsrtp from `_speedups.c` where it is built (`make test` builds
    it); pylibsrtp's own wrapper where it is not. The same keys give the same bytes and the
    same counts either way, and neither raises on what a caller sends: a packet too long
    to process is counted, not an exception (it had raised ValueError through pylibsrtp)."""
    from firsthop.services.transceiver.media import srtp
    from firsthop.shared import speedups

    assert speedups.BUILT and srtp.native is speedups.native is not None  # (bound: libsrtp 2)
    _, key, salt = PROFILES[profile]
    material = os.urandom(2 * (key + salt))
    from_c = _exchange(profile, material)
    monkeypatch.setattr(srtp, "native", None)
    from_pylibsrtp = _exchange(profile, material)
    assert from_c == from_pylibsrtp
    out, counts = from_c
    assert out[6:12] == [
        rtp.RtpPacket(111, s, 960 * s, 7, bytes([s]) * 80).encode() for s in range(6)
    ]
    assert out[12:16] == [None] * 4
    assert out[17] == rtcp.encode_rtcp([rtcp.ReceiverReport(7)]) and out[18:] == [None] * 3
    assert counts == (2, 1, 4)  # replays: RTP's and SRTCP's; malformed: two short, two long


def test_what_we_send_too_long_to_protect_raises_as_pylibsrtp_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Our own packet that libsrtp refuses is a bug of ours, not a caller's: it raises."""
    import pylibsrtp

    from firsthop.services.transceiver.media import srtp

    ours = SrtpContext.from_keying_material(os.urandom(60), "SRTP_AES128_CM_SHA1_80", client=True)
    too_long = rtp.RtpPacket(111, 1, 2, 3, bytes(1400)).encode()
    with pytest.raises(pylibsrtp.Error):
        ours.protect_rtp(too_long)
    monkeypatch.setattr(srtp, "native", None)
    with pytest.raises(pylibsrtp.Error):
        ours.protect_rtp(too_long)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_our_sessions_and_pylibsrtps_own_understand_each_other(profile: str) -> None:
    """The sessions are made straight in libsrtp (pylibsrtp's `Session` keeps its own to
    itself): each side's packets, SRTP and SRTCP, are what pylibsrtp's `Session` with the
    same key makes and takes."""
    from pylibsrtp import Policy, Session

    libsrtp_profile, key, salt = PROFILES[profile]
    theirs, ours = os.urandom(key + salt), os.urandom(key + salt)
    context = SrtpContext.from_sdes(theirs, ours, profile)

    def session(master: bytes, kind: int) -> Session:
        policy = Policy(key=master, ssrc_type=kind, srtp_profile=libsrtp_profile)
        return Session(policy)

    peer_out = session(theirs, Policy.SSRC_ANY_OUTBOUND)
    peer_in = session(ours, Policy.SSRC_ANY_INBOUND)
    packet = rtp.RtpPacket(111, 5, 960, 9, b"opus" * 20).encode()
    report = rtcp.encode_rtcp([rtcp.ReceiverReport(9)])
    assert context.unprotect_rtp(peer_out.protect(packet)) == packet
    assert context.unprotect_rtcp(peer_out.protect_rtcp(report)) == report
    assert peer_in.unprotect(context.protect_rtp(packet)) == packet
    assert peer_in.unprotect_rtcp(context.protect_rtcp(report)) == report
