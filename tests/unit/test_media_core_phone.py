"""The media core on a phone call: plain RTP, G.711 both ways, RFC 4733 DTMF (fake clock)."""

from __future__ import annotations

import numpy as np
import pytest

from firsthop.services.transceiver.media import core
from firsthop.services.transceiver.media.codecs import G711_FRAME, make_codec
from firsthop.services.transceiver.media.core import (
    AudioReceived,
    CallMedia,
    DtmfReceived,
    MediaParams,
)
from firsthop.services.transceiver.media.frames import CALL_RATE, FRAME_BYTES
from firsthop.services.transceiver.media.srtp import SrtpContext
from firsthop.shared.wire import dtmf, g711, rtp

OURS, THEIRS, EVENT = 0x5EED, 0x7E1C0, 101
LAW = {
    "pcmu": (0, g711.ulaw_encode, g711.ulaw_decode),
    "pcma": (8, g711.alaw_encode, g711.alaw_decode),
}


def tone(freq: float, seconds: float, rate: int, level: float = 8000.0) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return (level * np.sin(2 * np.pi * freq * t)).astype("<i2").tobytes()


def dominant(pcm: bytes, rate: int) -> float:
    samples = np.frombuffer(pcm, "<i2").astype(float)
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.argmax(spectrum) * rate / len(samples))


def phone_call(codec: str) -> CallMedia:
    pt = LAW[codec][0]
    params = MediaParams(
        ssrc=OURS, cname="firsthop", payload_type=pt, codec=codec, telephone_event=EVENT
    )
    media = CallMedia(params, random=lambda n: b"\x01" * n)
    media.start(None, 0.0, 1_700_000_000.0)  # no keys: plain RTP (RTP/AVP)
    return media


def events(media: CallMedia) -> list[object]:
    out: list[object] = []
    while (e := media.next_event()) is not None:
        out.append(e)
    return out


@pytest.mark.parametrize("codec", ["pcmu", "pcma"])
def test_a_trunks_g711_is_heard_as_48_khz_frames(codec: str) -> None:
    pt, encode, _ = LAW[codec]
    media = phone_call(codec)
    narrow = encode(tone(1000.0, 1.0, 8000))
    for i in range(50):
        payload = narrow[i * G711_FRAME : (i + 1) * G711_FRAME]
        media.receive_datagram(
            rtp.RtpPacket(pt, 1000 + i, 160 * i, THEIRS, payload).encode(), i * 0.02
        )
    frames = [e.pcm for e in events(media) if isinstance(e, AudioReceived)]
    assert 48 <= len(frames) <= 50 and all(len(f) == FRAME_BYTES for f in frames)
    assert abs(dominant(b"".join(frames[5:]), CALL_RATE) - 1000.0) < 10
    stats = media.stats()
    assert stats["rtp_packets_in"] == 50 and stats["rtp_lost"] == 0
    media.receive_datagram(rtp.RtpPacket(pt, 1050, 8000, THEIRS, narrow[:240]).encode(), 1.0)
    assert len([e for e in events(media) if isinstance(e, AudioReceived)]) in (1, 2)  # 30 ms


@pytest.mark.parametrize("codec", ["pcmu", "pcma"])
def test_the_agents_voice_goes_out_as_g711_on_an_8_khz_clock(codec: str) -> None:
    pt, _, decode = LAW[codec]
    media = phone_call(codec)
    media.push_audio(tone(440.0, 1.0, CALL_RATE), None, 0.0)
    now = 0.0
    while now < 1.0:
        media.handle_timer(now)
        now = media.get_timer() or now + 0.02
    packets = [rtp.parse_rtp(d) for d in media.datagrams_to_send() if not rtp.is_rtcp(d)]
    assert len(packets) >= 49
    assert all(p.payload_type == pt and len(p.payload) == G711_FRAME for p in packets)
    assert [
        (b.sequence_number - a.sequence_number) & 0xFFFF
        for a, b in zip(packets, packets[1:], strict=False)
    ] == [1] * (len(packets) - 1)
    assert {
        (b.timestamp - a.timestamp) & 0xFFFFFFFF for a, b in zip(packets, packets[1:], strict=False)
    } == {160}
    heard = decode(b"".join(p.payload for p in packets[2:48]))
    assert abs(dominant(heard, 8000) - 440.0) < 10


def test_dtmf_is_told_once_per_key() -> None:
    media = phone_call("pcmu")

    def event(seq: int, ts: int, digit: str, end: bool, duration: int) -> bytes:
        payload = dtmf.build_event(digit, end=end, duration=duration)
        return rtp.RtpPacket(EVENT, seq, ts, THEIRS, payload).encode()

    for i, (end, duration) in enumerate(
        [(False, 160), (False, 320), (True, 800), (True, 800), (True, 800)]
    ):
        media.receive_datagram(event(10 + i, 4000, "5", end, duration), i * 0.02)
    media.receive_datagram(event(20, 9000, "#", True, 800), 1.0)
    media.receive_datagram(rtp.RtpPacket(EVENT, 21, 9999, THEIRS, b"\x01").encode(), 1.1)
    told = [e for e in events(media) if isinstance(e, DtmfReceived)]
    assert told == [DtmfReceived("5", 0.02), DtmfReceived("#", 0.1)]
    assert media.stats()["dtmf_in"] == 2 and media.stats()["dtmf_malformed"] == 1


def test_keys_past_the_calls_rate_are_counted_not_told() -> None:
    """A caller's keys, each a new timestamp, 200 a second for 2 s (as many as its
    datagrams may be): DTMF_BURST and what DTMF_RATE refills are told to the agent, the
    rest counted. (Before: every one, up to the datagram budget, 250 a second.)"""
    media = phone_call("pcmu")
    for i in range(400):
        payload = dtmf.build_event("1", end=True, duration=400)
        media.receive_datagram(rtp.RtpPacket(EVENT, i, i * 400, THEIRS, payload).encode(), i / 200)
    told = sum(isinstance(e, DtmfReceived) for e in events(media))
    expected = core.DTMF_BURST + core.DTMF_RATE * 399 / 200
    assert told == pytest.approx(expected, abs=1)
    assert media.stats()["dtmf_rate_limited"] == 400 - told


def test_another_payload_type_is_a_counted_drop() -> None:
    media = phone_call("pcma")
    media.receive_datagram(rtp.RtpPacket(0, 1, 0, THEIRS, bytes(160)).encode(), 0.0)
    assert events(media) == [] and media.stats()["rtp_payload_type_unknown"] == 1


def test_dtmf_codec() -> None:
    for digit in dtmf.DIGITS:
        event = dtmf.parse_event(dtmf.build_event(digit, end=True, volume=7, duration=1234))
        assert (event.digit, event.end, event.volume, event.duration) == (digit, True, 7, 1234)
    assert dtmf.parse_event(bytes([16, 0, 0, 1])).digit is None  # flash: not a key
    with pytest.raises(dtmf.DtmfError):
        dtmf.parse_event(b"\x05\x80")


def test_codec_names() -> None:
    assert make_codec("opus").clock_rate == CALL_RATE and make_codec("pcmu").clock_rate == 8000
    with pytest.raises(ValueError):
        make_codec("g729")


def test_a_phone_call_keyed_by_sdes_is_srtp_both_ways() -> None:
    """RTP/SAVP (RFC 4568): the trunk sends with the key it offered, we with ours."""
    theirs, ours = bytes(range(30)), bytes(range(30, 60))
    params = MediaParams(ssrc=OURS, cname="firsthop", payload_type=0, codec="pcmu")
    media = CallMedia(params, random=lambda n: b"\x01" * n)
    media.start(SrtpContext.from_sdes(theirs, ours, "SRTP_AES128_CM_SHA1_80"), 0.0, 0.0)
    trunk = SrtpContext.from_sdes(ours, theirs, "SRTP_AES128_CM_SHA1_80")  # its view
    narrow = g711.ulaw_encode(tone(1000.0, 0.4, 8000))
    for i in range(20):
        packet = rtp.RtpPacket(0, i, 160 * i, THEIRS, narrow[i * 160 : (i + 1) * 160]).encode()
        media.receive_datagram(trunk.protect_rtp(packet), i * 0.02)
    assert len([e for e in events(media) if isinstance(e, AudioReceived)]) >= 18
    media.receive_datagram(rtp.RtpPacket(0, 99, 0, THEIRS, bytes(160)).encode(), 1.0)  # plain
    assert media.stats()["srtp_auth_fail"] + media.stats()["srtp_malformed"] == 1
    media.push_audio(tone(440.0, 0.2, CALL_RATE), None, 1.0)
    media.handle_timer(1.0)
    out = [d for d in media.datagrams_to_send() if not rtp.is_rtcp(d)]
    assert out and all(trunk.unprotect_rtp(d) is not None for d in out)


def test_a_pcmu_calls_payloads_are_also_told_as_they_came() -> None:
    """For an agent that takes the call's own codec (G.711 straight through): each packet's
    payload as it came, and a lost packet's slot as encoded silence."""
    from firsthop.services.transceiver.media.core import CodedAudioReceived

    media = phone_call("pcmu")
    narrow = g711.ulaw_encode(tone(700.0, 0.2, 8000))
    payloads = [narrow[i * 160 : (i + 1) * 160] for i in range(10)]
    for i, payload in enumerate(payloads):
        if i == 5:
            continue  # lost
        media.receive_datagram(
            rtp.RtpPacket(0, 100 + i, 160 * i, THEIRS, payload).encode(), i * 0.02
        )
    coded = [e.payload for e in events(media) if isinstance(e, CodedAudioReceived)]
    silence = g711.ulaw_encode(bytes(320))
    assert coded == [*payloads[:5], silence, *payloads[6:]]


def test_frames_already_in_the_calls_codec_go_out_as_they_are() -> None:
    media = phone_call("pcmu")
    coded = bytes(range(160))
    media.push_coded(coded, "t", 0.0)
    media.handle_timer(0.0)
    (packet,) = [rtp.parse_rtp(d) for d in media.datagrams_to_send() if not rtp.is_rtcp(d)]
    assert packet.payload == coded and media.stats()["agent_frames_straight_through"] == 1


@pytest.mark.parametrize("codec", ["pcmu", "pcma"])
def test_a_recorded_phone_call_keeps_both_sides_g711_as_carried(codec: str) -> None:
    """The trunk's payloads on the left, what went out on the right, byte for byte: nothing
    decoded or coded again (the file is the call's own law, `recorder.py`'s WavG711)."""
    pt, encode, decode = LAW[codec]
    media = CallMedia(MediaParams(ssrc=OURS, cname="firsthop", payload_type=pt, codec=codec))
    assert media.record(0.0)
    media.start(None, 0.0, 1_700_000_000.0)
    narrow = encode(tone(1000.0, 1.0, 8000))
    media.push_audio(tone(440.0, 1.0, CALL_RATE), None, 0.0)
    sent: list[bytes] = []
    now = 0.0
    for i in range(50):
        payload = narrow[i * G711_FRAME : (i + 1) * G711_FRAME]
        media.receive_datagram(rtp.RtpPacket(pt, i, 160 * i, THEIRS, payload).encode(), now)
        media.handle_timer(now)
        sent += [rtp.parse_rtp(d).payload for d in media.datagrams_to_send() if d[1] < 200]
        now += 0.02
    recorder = media.recorder
    assert recorder is not None and recorder.file.suffix == ".wav"
    data = recorder.take() + recorder.close(now)
    left, right = data[58::2], data[59::2]
    assert left.startswith(narrow[: 48 * G711_FRAME])  # the trunk's bytes, where they came
    assert right.startswith(b"".join(sent[:48]))  # ours, as sent
    assert abs(dominant(decode(right[160:7840]), 8000) - 440.0) < 10
    assert recorder.replaced == recorder.late == 0
