from __future__ import annotations

from collections.abc import Callable

import pytest

from firsthop.shared.sdp import (
    SdpError,
    answering_direction,
    ask_for_opus_fec,
    audio_direction,
    audio_stream,
    check_offer,
    classify_candidate,
    mark_ice_lite,
    only_opus,
    sdpfrag_credentials,
    set_audio_direction,
    strip_candidates,
)

FP = "a=fingerprint:sha-256 " + ":".join(["AB"] * 32)
OFFER = (
    "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0 1\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\na=mid:0\r\n"
    "a=ice-ufrag:abcd\r\n"
    "a=ice-pwd:abcdefghijklmnopqrstuvwx\r\n" + FP + "\r\na=setup:actpass\r\n"
    "a=candidate:1 1 udp 2130706431 192.168.1.5 5000 typ host\r\na=end-of-candidates\r\n"
    "m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\na=mid:1\r\na=ice-ufrag:abcd\r\n"
    "a=ice-pwd:abcdefghijklmnopqrstuvwx\r\n" + FP + "\r\n"
)


def test_valid_offer_with_data_channel() -> None:
    offer = check_offer(OFFER)
    assert offer.has_data_channel
    assert len(offer.candidates) == 1


def test_strip_and_mark() -> None:
    stripped = strip_candidates(OFFER)
    assert "a=candidate" not in stripped and "end-of-candidates" not in stripped
    lite = mark_ice_lite(stripped)
    assert lite.index("a=ice-lite") < lite.index("m=audio")
    assert mark_ice_lite(lite) == lite


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda s: s.replace("a=group:BUNDLE 0 1\r\n", ""), "BUNDLE"),
        (lambda s: s.replace("a=ice-ufrag:abcd", "a=ice-ufrag:ab"), "ice-ufrag"),
        (lambda s: s.replace("a=setup:actpass", "a=setup:weird"), "setup"),
        (
            lambda s: s.replace("webrtc-datachannel", "x").replace("UDP/DTLS/SCTP", "RTP/AVP"),
            "SCTP",
        ),
        (lambda s: s.replace("v=0", "a=ice-lite\r\nv=0", 1), "v=0"),
        (lambda s: s.replace("t=0 0\r\n", "t=0 0\r\na=ice-lite\r\n"), "ICE-lite"),
        (lambda s: s + "garbage\r\n", "malformed"),
        (lambda s: s.replace("m=audio 9 UDP", "m=audio x UDP"), "m-line"),
        (lambda s: s.replace("m=audio 9 UDP", "m=audio \u00b2 UDP"), "m-line"),  # (was a 500)
        (lambda s: s.replace("m=audio 9 UDP", "m=audio " + "9" * 5000 + " UDP"), "m-line"),
        (lambda s: s.replace("m=audio 9 UDP", "m=audio 65536 UDP"), "m-line"),
        (lambda s: s + "x" * 70000, "larger"),
    ],
)
def test_rejections_say_why(mutate: Callable[[str], str], reason: str) -> None:
    with pytest.raises(SdpError, match=reason):
        check_offer(mutate(OFFER))


@pytest.mark.parametrize(
    ("candidate", "verdict"),
    [
        ("candidate:1 1 udp 1 203.0.113.1 5000 typ host", None),
        ("candidate:1 1 udp 1 127.0.0.1 5000 typ host", "denied_range"),
        ("candidate:1 1 udp 1 169.254.1.1 5000 typ host", "denied_range"),
        ("candidate:1 1 udp 1 224.0.0.1 5000 typ host", "denied_range"),
        ("candidate:1 1 udp 1 0.0.0.0 5000 typ host", "denied_range"),
        ("candidate:1 1 udp 1 fe80::1 5000 typ host", "denied_range"),
        ("candidate:1 1 udp 1 ::1 5000 typ host", "denied_range"),
        ("candidate:1 1 udp 1 ::ffff:127.0.0.1 5000 typ host", "denied_range"),  # v4-mapped
        ("candidate:1 1 udp 1 2001:db8::1 5000 typ host", None),
        ("candidate:1 1 udp 1 10.0.0.1 5000 typ host", None),
        ("candidate:1 1 udp 1 x.local 5000 typ host", "mdns"),
        ("candidate:1 1 tcp 1 203.0.113.1 9 typ host tcptype active", "not_udp"),
        ("candidate:1 1 udp 1", "malformed"),
    ],
)
def test_candidate_classification(candidate: str, verdict: str | None) -> None:
    assert classify_candidate(candidate) == verdict


def test_private_ranges_configurable() -> None:
    assert classify_candidate("candidate:1 1 udp 1 10.0.0.1 5 typ host", ["10.0.0.0/8"]) == (
        "denied_range"
    )
    # a v4-mapped IPv6 address does not slip past an IPv4 range
    mapped = "candidate:1 1 udp 1 ::ffff:10.0.0.1 5 typ host"
    assert classify_candidate(mapped, ["10.0.0.0/8"]) == "denied_range"
    assert classify_candidate("candidate:1 1 udp 1 fd00::1 5 typ host", ["fc00::/7"]) == (
        "denied_range"
    )


def test_sdpfrag() -> None:
    frag = (
        "a=ice-ufrag:EsAw\r\na=ice-pwd:P2uYro0UCOQ4zxjKXaWCBui1\r\n"
        "a=candidate:1 1 udp 1 1.2.3.4 5 typ host\r\n"
    )
    assert sdpfrag_credentials(frag) == (
        "EsAw",
        "P2uYro0UCOQ4zxjKXaWCBui1",
        ["candidate:1 1 udp 1 1.2.3.4 5 typ host"],
    )


def test_an_answer_asks_for_opus_in_band_fec() -> None:
    answer = (
        "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111 0\r\na=rtpmap:111 opus/48000/2\r\n"
        "a=rtpmap:0 PCMU/8000\r\n"
    )
    fec = ask_for_opus_fec(answer)
    assert "a=rtpmap:111 opus/48000/2\r\na=fmtp:111 useinbandfec=1\r\n" in fec
    assert "a=fmtp:0" not in fec
    assert ask_for_opus_fec(fec) == fec
    merged = ask_for_opus_fec(answer + "a=fmtp:111 minptime=10\r\n")
    assert "a=fmtp:111 minptime=10;useinbandfec=1\r\n" in merged
    assert merged.count("a=fmtp:111") == 1


def test_only_opus_is_answered_and_an_offer_without_it_is_refused() -> None:
    offer = OFFER.replace(
        "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\na=rtpmap:111 opus/48000/2\r\n",
        "m=audio 9 UDP/TLS/RTP/SAVPF 0 111 8\r\na=rtpmap:0 PCMU/8000\r\n"
        "a=rtpmap:111 opus/48000/2\r\na=fmtp:111 minptime=10;useinbandfec=1\r\n"
        "a=rtcp-fb:111 transport-cc\r\na=rtpmap:8 PCMA/8000\r\na=rtcp-fb:8 nack\r\n",
    )
    check_offer(offer)
    opus = only_opus(offer)
    assert "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\n" in opus
    assert "PCMU" not in opus and "PCMA" not in opus and "a=rtcp-fb:8" not in opus
    assert "a=fmtp:111 minptime=10;useinbandfec=1" in opus and "a=rtcp-fb:111" in opus
    assert "m=application" in opus and only_opus(opus) == opus
    g711 = offer.replace("0 111 8", "0 8").replace("a=rtpmap:111 opus/48000/2\r\n", "")
    with pytest.raises(SdpError, match="no Opus"):
        check_offer(g711)


ANSWER = (
    "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0 1\r\n"
    "m=audio 9 UDP/TLS/RTP/SAVPF 96\r\na=extmap:1 urn:ietf:params:rtp-hdrext:sdes:mid\r\n"
    "a=extmap:2 urn:ietf:params:rtp-hdrext:ssrc-audio-level\r\na=mid:0\r\n"
    "a=msid:s t\r\na=rtcp-mux\r\na=ssrc:3093377801 cname:d377d782\r\n"
    "a=rtpmap:96 opus/48000/2\r\na=inactive\r\n"
    "m=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\na=mid:1\r\na=sendrecv\r\n"
)


def test_the_answers_audio_stream_for_the_media_core() -> None:
    stream = audio_stream(ANSWER)
    assert (stream.ssrc, stream.cname, stream.payload_type) == (3093377801, "d377d782", 96)
    assert (stream.mid, stream.mid_extension, stream.direction) == ("0", 1, "inactive")
    with pytest.raises(SdpError):
        audio_stream(ANSWER.replace("a=ssrc:3093377801 cname:d377d782\r\n", ""))
    with pytest.raises(SdpError):
        audio_stream("v=0\r\nm=application 9 UDP/DTLS/SCTP webrtc-datachannel\r\n")


@pytest.mark.parametrize(
    ("offered", "answered"),
    [("sendrecv", "sendrecv"), ("sendonly", "recvonly"), ("recvonly", "sendonly"),
     ("inactive", "inactive"), (None, "sendrecv")],
)  # fmt: skip
def test_the_answer_says_what_the_core_does_and_only_in_the_audio_section(
    offered: str | None, answered: str
) -> None:
    offer = OFFER if offered is None else OFFER.replace("a=mid:0", f"a=mid:0\r\na={offered}")
    assert answering_direction(offer) == answered
    sdp = set_audio_direction(ANSWER, answered)
    assert audio_direction(sdp) == answered and "a=inactive" not in sdp.replace(f"a={answered}", "")
    assert sdp.split("m=application")[1].count("a=sendrecv") == 1  # the data channel's
