"""`firsthop bench hearing`'s and `bench recording`'s own arithmetic: word errors, noise at a
given SNR and the SNR read back, and the recording bench's figures (a real minute)."""

from __future__ import annotations

import numpy as np

from firsthop.services.bench.hearing import (
    SNR_DB,
    in_noise,
    normalize,
    pink_noise,
    snr_db,
    summarize,
    word_errors,
)


def test_word_errors_count_edits_after_normalising_what_is_only_spelling() -> None:
    assert word_errors("What time is it?", "what time is it") == (0, 4)
    assert word_errors("My favourite colour is green.", "My favorite color is green") == (0, 5)
    assert word_errors("Call me at six.", "Call me at 6.") == (0, 4)
    assert word_errors("Can you book a table", "Can you work a table") == (1, 5)
    assert word_errors("a b c", "") == (3, 3)
    assert word_errors("a b c", "a x b c y") == (2, 3)
    assert normalize("Let's go") == ["let", "us", "go"]


def test_noise_goes_in_at_the_snr_asked_and_is_read_back() -> None:
    t = np.arange(48000) / 48000
    speech = (6000 * np.sin(2 * np.pi * 300 * t) * (t > 0.3)).astype("<i2").tobytes()
    noisy, clean = in_noise(speech, SNR_DB, seed=1)
    signal = np.frombuffer(noisy, "<i2").astype(np.float64)
    assert len(signal) == len(clean) == 48000 + 72000  # half a second before, a second after
    assert abs(snr_db(signal, clean) - SNR_DB) < 1.0
    assert snr_db(clean, clean) > 60  # no noise: nothing in the quiet frames
    pink = pink_noise(48000, 2)
    assert abs(float(np.sqrt(np.mean(pink**2))) - 1.0) < 1e-6
    low, high = np.abs(np.fft.rfft(pink))[10:100].mean(), np.abs(np.fft.rfft(pink))[-90:].mean()
    assert low > 5 * high  # its power falls with frequency


def test_the_summary_is_per_recognizer_caller_and_condition() -> None:
    rows = [
        {"recognizer": "whisper", "caller": "aiortc", "condition": "piper/clean", "heard": "a",
         "errors": 0, "words": 4, "sentences": 1},
        {"recognizer": "whisper", "caller": "aiortc", "condition": "piper/clean", "heard": "",
         "errors": 4, "words": 4, "sentences": 1},
        {"recognizer": "whisper", "caller": "chromium", "condition": "piper/clean", "heard": "x",
         "errors": 1, "words": 10, "sentences": 2},
    ]  # fmt: skip
    out = summarize(rows)
    assert out["whisper aiortc piper/clean"] == {
        "wer_pct": 50.0, "sentences": 2, "word_for_word": 1, "unheard": 1,
    }  # fmt: skip
    assert out["whisper chromium piper/clean"]["wer_pct"] == 10.0
    assert out["whisper chromium piper/clean"]["word_for_word"] == 0  # (scored as one text)
