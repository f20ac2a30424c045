"""Offer/answer for a phone call's plain RTP audio (`shared/rtp_offer.py`)."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firsthop.shared.rtp_offer import (
    Crypto,
    build_rtp_answer,
    choose_codec,
    choose_crypto,
    parse_rtp_offer,
)
from firsthop.shared.sdp import SdpError

# What a trunk (here: as baresip and Twilio Elastic SIP offer) sends.
TRUNK_OFFER = (
    "v=0\r\n"
    "o=root 1234 1234 IN IP4 192.0.2.7\r\n"
    "s=call\r\n"
    "c=IN IP4 192.0.2.7\r\n"
    "t=0 0\r\n"
    "m=audio 40000 RTP/AVP 0 8 101\r\n"
    "a=rtpmap:0 PCMU/8000\r\n"
    "a=rtpmap:8 PCMA/8000\r\n"
    "a=rtpmap:101 telephone-event/8000\r\n"
    "a=fmtp:101 0-16\r\n"
    "a=ptime:20\r\n"
    "a=sendrecv\r\n"
)


def test_a_trunk_offer() -> None:
    offer = parse_rtp_offer(TRUNK_OFFER)
    assert (offer.address, offer.port) == ("192.0.2.7", 40000)
    assert offer.formats == (0, 8, 101)
    assert offer.codecs[0] == ("pcmu", 8000) and offer.codecs[8] == ("pcma", 8000)
    assert offer.telephone_event == 101 and offer.ptime == 20 and not offer.secure
    assert choose_codec(offer) == 0
    assert choose_codec(offer, ("pcma", "pcmu")) == 8
    assert choose_codec(offer, ("opus",)) is None


def test_static_payload_types_need_no_rtpmap_and_media_level_c_wins() -> None:
    offer = parse_rtp_offer(
        "v=0\r\nc=IN IP4 192.0.2.1\r\nt=0 0\r\na=sendonly\r\n"
        "m=audio 5000 RTP/AVP 8\r\nc=IN IP4 192.0.2.9\r\n"
    )
    assert offer.address == "192.0.2.9" and offer.codecs == {8: ("pcma", 8000)}
    assert offer.direction == "sendonly"  # from the session level


def test_the_answer() -> None:
    offer = parse_rtp_offer(TRUNK_OFFER)
    answer = build_rtp_answer(
        offer, payload_type=0, address="198.51.100.1", port=3478, session_id=7
    )
    assert "c=IN IP4 198.51.100.1\r\n" in answer
    assert "m=audio 3478 RTP/AVP 0 101\r\n" in answer
    assert "a=rtpmap:0 PCMU/8000\r\n" in answer and "a=rtpmap:101 telephone-event/8000" in answer
    assert answer.endswith("a=sendrecv\r\n")
    again = parse_rtp_offer(answer)  # our answer is itself a well-formed description
    assert again.formats == (0, 101) and again.port == 3478
    held = parse_rtp_offer(TRUNK_OFFER.replace("a=sendrecv", "a=sendonly"))
    assert build_rtp_answer(held, payload_type=8, address="::1", port=1, session_id=1).endswith(
        "a=recvonly\r\n"
    )
    with pytest.raises(ValueError):
        build_rtp_answer(offer, payload_type=9, address="198.51.100.1", port=1, session_id=1)


@pytest.mark.parametrize(
    ("sdp", "why"),
    [
        ("v=0\r\nc=IN IP4 192.0.2.1\r\nm=video 5000 RTP/AVP 31\r\n", "no audio"),
        ("v=0\r\nm=audio 5000 RTP/AVP 0\r\n", "no c="),
        ("v=0\r\nc=IN IP4 example.com\r\nm=audio 5000 RTP/AVP 0\r\n", "IP address"),
        ("v=0\r\nc=IN IP4 224.0.0.1\r\nm=audio 5000 RTP/AVP 0\r\n", "multicast"),
        ("v=0\r\nc=IN IP4 192.0.2.1\r\nm=audio 99999 RTP/AVP 0\r\n", "port"),
        ("v=0\r\nc=IN IP4 192.0.2.1\r\nm=audio 5000 UDP/TLS/RTP/SAVPF 111\r\n", "transport"),
        ("v=0\r\nc=IN IP4 192.0.2.1\r\nm=audio 5000 RTP/AVP 0 ²\r\n", "payload types"),
        ("v=0\r\nc=IN IP4 192.0.2.1\r\nm=audio 5000 RTP/AVP " + "0 " * 40 + "\r\n", "payload"),
        ("garbage", "bad SDP line"),
        ("v=0\r\n" + "a=x\r\n" * 3000, "over"),
    ],
)
def test_unusable_offers_say_why(sdp: str, why: str) -> None:
    with pytest.raises(SdpError, match=why):
        parse_rtp_offer(sdp)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=40), max_size=12))
def test_garbage_raises_only_sdp_errors(lines: list[str]) -> None:
    try:
        offer = parse_rtp_offer("\r\n".join(["v=0", "c=IN IP4 192.0.2.1", *lines]))
    except SdpError:
        return
    assert 0 <= offer.port <= 65535 and all(0 <= pt < 128 for pt in offer.formats)


KEY = bytes(range(30))


def savp(*cryptos: str) -> str:
    lines = "".join(f"a=crypto:{c}\r\n" for c in cryptos)
    return TRUNK_OFFER.replace("RTP/AVP", "RTP/SAVP").replace(
        "a=sendrecv\r\n", lines + "a=sendrecv\r\n"
    )


def test_sdes_keys_are_taken_from_the_first_crypto_we_can_use() -> None:
    inline = base64.b64encode(KEY).decode()
    offer = parse_rtp_offer(
        savp(
            f"1 AES_256_CM_HMAC_SHA1_80 inline:{base64.b64encode(bytes(46)).decode()}",
            f"2 AES_CM_128_HMAC_SHA1_80 inline:{inline}|2^20|1:32",  # an MKI: not taken
            f"3 AES_CM_128_HMAC_SHA1_32 inline:{inline}|2^31",
        )
    )
    assert offer.secure
    crypto = choose_crypto(offer)
    assert crypto == Crypto(3, "AES_CM_128_HMAC_SHA1_32", KEY)
    ours = Crypto(3, crypto.suite, bytes(30))
    answer = build_rtp_answer(
        offer, payload_type=0, address="198.51.100.1", port=3478, session_id=1, crypto=ours
    )
    assert "m=audio 3478 RTP/SAVP 0 101\r\n" in answer
    assert (
        f"a=crypto:3 AES_CM_128_HMAC_SHA1_32 inline:{base64.b64encode(bytes(30)).decode()}\r\n"
        in answer
    )
    assert parse_rtp_offer(answer).crypto == (
        f"3 AES_CM_128_HMAC_SHA1_32 inline:{base64.b64encode(bytes(30)).decode()}",
    )


@pytest.mark.parametrize(
    "line",
    [
        "1 AES_CM_128_HMAC_SHA1_80 inline:short",
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(bytes(20)).decode()}",
        f"1 AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(KEY).decode()} UNENCRYPTED_SRTP",
        f"x AES_CM_128_HMAC_SHA1_80 inline:{base64.b64encode(KEY).decode()}",
        f"1 F8_128_HMAC_SHA1_80 inline:{base64.b64encode(KEY).decode()}",
        f"1 AES_CM_128_HMAC_SHA1_80 uri:{base64.b64encode(KEY).decode()}",
    ],
)
def test_sdes_we_cannot_take(line: str) -> None:
    assert choose_crypto(parse_rtp_offer(savp(line))) is None
