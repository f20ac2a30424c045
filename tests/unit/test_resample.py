"""Streaming resampling (libswresample through PyAV) and G.711: level, frequency, seams."""

from __future__ import annotations

import array
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firsthop.services.call.caller import tone_power
from firsthop.services.transceiver.resample import Resampler
from firsthop.shared.wire.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode


def tone(freq: float, rate: int, seconds: float, amplitude: float = 0.3) -> bytes:
    n = int(rate * seconds)
    w = 2 * math.pi * freq / rate
    return array.array("h", (int(32767 * amplitude * math.sin(w * i)) for i in range(n))).tobytes()


def rms(pcm: bytes) -> float:
    samples = array.array("h")
    samples.frombytes(pcm)
    return math.sqrt(sum(s * s for s in samples) / max(1, len(samples))) / 32768


def streamed(r: Resampler, pcm: bytes, chunk: int) -> bytes:
    out = b"".join(r.push(pcm[i : i + chunk]) for i in range(0, len(pcm), chunk))
    return out + r.flush()


@pytest.mark.parametrize(("src", "dst"), [(48000, 24000), (24000, 48000), (48000, 8000)])
def test_a_tone_keeps_its_frequency_and_level_and_length(src: int, dst: int) -> None:
    pcm = tone(1000, src, 1.0)
    out = streamed(Resampler(src, dst), pcm, src // 50 * 2)  # 20 ms at a time
    assert abs(len(out) // 2 - dst) <= dst // 100  # one second in, one second out
    body = out[len(out) // 4 : 3 * len(out) // 4]  # away from the edges
    assert tone_power(body, 1000, dst) > 0.02  # a 0.3 tone: ~0.0225
    assert tone_power(body, 1500, dst) < 1e-5
    assert abs(20 * math.log10(rms(body) / rms(pcm))) < 0.5  # level within 0.5 dB


def test_downsampling_filters_what_would_alias() -> None:
    # 15 kHz cannot exist at 24 kHz: without a filter it would fold to 9 kHz.
    out = streamed(Resampler(48000, 24000), tone(15000, 48000, 0.5), 1920)
    body = out[len(out) // 4 : 3 * len(out) // 4]
    assert tone_power(body, 9000, 24000) < 1e-5
    assert rms(body) < 0.01


def test_upsampling_leaves_no_image() -> None:
    out = streamed(Resampler(24000, 48000), tone(1000, 24000, 0.5), 960)
    body = out[len(out) // 4 : 3 * len(out) // 4]
    assert tone_power(body, 23000, 48000) < 1e-5  # the image of 1 kHz around 24 kHz


def test_no_seams_between_frames() -> None:
    pcm = tone(440, 48000, 0.4)
    whole = streamed(Resampler(48000, 24000), pcm, len(pcm))
    framed = streamed(Resampler(48000, 24000), pcm, 1920)
    assert len(whole) == len(framed)
    a, b = array.array("h"), array.array("h")
    a.frombytes(whole)
    b.frombytes(framed)
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) <= 2


def test_same_rate_and_empty_and_odd() -> None:
    r = Resampler(24000, 24000)
    assert r.push(b"\x01\x02\x03") == b"\x01\x02"
    assert r.push(b"") == b"" and r.flush() == b""
    assert Resampler(48000, 24000).push(b"\x01") == b""


def test_tiny_streams_do_not_rebuild_the_filter_each_time() -> None:
    """A filter costs 15-20 pushes' worth to build: one is built anew only after 100 ms of
    audio, however often tiny streams end (flush) or are cleared (reset)."""
    r = Resampler(24000, 48000)
    frame = tone(440, 24000, 0.02)  # 20 ms
    for i in range(500):  # 10 s of audio, in 500 streams of one frame each
        r.push(frame)
        if i % 2:
            r.flush()
        else:
            r.reset()
    assert 10 <= r.builds <= 500 * 0.02 / 0.1 + 1  # one per 100 ms at most (500 before)
    tiny = Resampler(24000, 48000)
    for _ in range(1000):
        tiny.push(b"\x01\x02\x03\x04")
        tiny.flush()
    assert tiny.builds == 1
    # A long stream still ends with its whole tail: one second in, one second out.
    out = streamed(Resampler(24000, 48000), tone(1000, 24000, 1.0), 960)
    assert abs(len(out) // 2 - 48000) <= 48000 // 100


def test_g711_reference_codes() -> None:
    # G.711: silence and full scale.
    assert ulaw_encode(array.array("h", [0, 32767, -32768]).tobytes()) == b"\xff\x80\x00"
    assert alaw_encode(array.array("h", [0, 32767, -32768]).tobytes()) == b"\xd5\xaa\x2a"
    assert ulaw_decode(b"\xff") == b"\x00\x00"
    assert alaw_decode(b"\xd5") == array.array("h", [8]).tobytes()


def test_g711_decoding_matches_the_standard_code_points() -> None:
    # G.711 Tables 2a/2b: µ-law 0x00/0x80 are the extremes, 0xFF is zero; A-law's smallest
    # steps are 0xD5 (+8) and 0x55 (-8), its extremes 0xAA and 0x2A.
    ulaw, alaw = array.array("h"), array.array("h")
    ulaw.frombytes(ulaw_decode(bytes([0x00, 0x80, 0xFF])))
    alaw.frombytes(alaw_decode(bytes([0xD5, 0x55, 0xAA, 0x2A])))
    assert list(ulaw) == [-32124, 32124, 0]
    assert list(alaw) == [8, -8, 32256, -32256]


def test_g711_encoding_inverts_decoding() -> None:
    codes = bytes(range(256))
    ulaw = ulaw_encode(ulaw_decode(codes))
    assert [i for i in range(256) if ulaw[i] != i] == [0x7F]  # -0 comes back as +0 (0xFF)
    assert alaw_encode(alaw_decode(codes)) == codes


@given(st.integers(-32768, 32767))
def test_g711_round_trip_error_is_within_the_segment_step(s: int) -> None:
    pcm = array.array("h", [s]).tobytes()
    for enc, dec in ((ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)):
        back = array.array("h")
        back.frombytes(dec(enc(pcm)))
        # The quantisation step grows with the segment: at most 1/16 of |s| plus a floor.
        assert abs(back[0] - s) <= max(abs(s) // 16, 16) + 140, (s, back[0])


def test_g711_tone_survives() -> None:
    pcm = tone(1000, 8000, 0.5)
    for enc, dec in ((ulaw_encode, ulaw_decode), (alaw_encode, alaw_decode)):
        back = dec(enc(pcm))
        assert len(back) == len(pcm)
        assert tone_power(back, 1000, 8000) > 0.02
