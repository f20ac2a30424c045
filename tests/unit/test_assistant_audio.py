"""The assistant's audio helpers: its wire formats, resampling (G.711 itself is
`shared/wire/g711.py`'s, tested in test_resample.py)."""

from __future__ import annotations

import numpy as np

from firsthop.services.agent.assistant.audio import from_wire, resample, to_wire


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
