"""The assistant's audio helpers: G.711 against the standard's code points, resampling."""

from __future__ import annotations

import numpy as np

from firsthop.services.agent.assistant.audio import (
    ALAW_TABLE,
    ULAW_TABLE,
    alaw_encode,
    from_wire,
    g711_decode,
    resample,
    to_wire,
    ulaw_encode,
)

CODES = bytes(range(256))


def test_g711_decoding_matches_the_standard_code_points() -> None:
    # G.711 Tables 2a/2b: µ-law 0x00/0x80 are the extremes, 0xFF is zero; A-law's smallest
    # steps are 0xD5 (+8) and 0x55 (-8), its extremes 0xAA and 0x2A.
    assert (ULAW_TABLE[0x00], ULAW_TABLE[0x80], ULAW_TABLE[0xFF]) == (-32124, 32124, 0)
    assert (ALAW_TABLE[0xD5], ALAW_TABLE[0x55]) == (8, -8)
    assert (ALAW_TABLE[0xAA], ALAW_TABLE[0x2A]) == (32256, -32256)


def test_g711_encoding_inverts_decoding() -> None:
    ulaw = ulaw_encode(g711_decode(CODES, "pcmu"))
    assert [i for i in range(256) if ulaw[i] != i] == [0x7F]  # -0 comes back as +0 (0xFF)
    assert alaw_encode(g711_decode(CODES, "pcma")) == CODES


def test_g711_round_trip_keeps_speech_quality() -> None:
    x = (np.sin(np.arange(8000) / 7) * 20000).astype("<i2")
    for law, encode in (("pcmu", ulaw_encode), ("pcma", alaw_encode)):
        y = np.frombuffer(g711_decode(encode(x.tobytes()), law), dtype="<i2").astype(float)
        noise = ((x - y) ** 2).sum()
        assert 10 * np.log10((x.astype(float) ** 2).sum() / noise) > 30, law


def test_wire_formats_carry_24khz_audio() -> None:
    pcm = (np.sin(np.arange(4800) / 9) * 9000).astype("<i2").tobytes()  # 200 ms
    assert to_wire(pcm, "pcm") == pcm
    for fmt in ("pcmu", "pcma"):
        wire = to_wire(pcm, fmt)
        assert len(wire) == 1600  # 200 ms at 8 kHz, a byte a sample
        assert len(from_wire(wire, fmt)) == len(pcm)


def test_resample_lengths() -> None:
    pcm = bytes(2 * 22050)
    assert len(resample(pcm, 22050, 24000)) == 2 * 24000
    assert len(resample(bytes(2 * 24000), 24000, 16000)) == 2 * 16000
    assert resample(b"", 24000, 16000) == b""
