"""Server-side noise suppression: the session's word for it, RNNoise itself, and the media
core running it on a call's decoded audio only when asked."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from firsthop.services.bench.hearing import denoised, shipped_denoised, shipped_library
from firsthop.services.transceiver.agents.events import (
    CallInfo,
    NoiseReduction,
    ToAgent,
    ToSender,
)
from firsthop.services.transceiver.agents.realtime import RealtimeProtocol
from firsthop.services.transceiver.media import denoise
from firsthop.services.transceiver.media.core import AudioReceived
from firsthop.services.transceiver.media.denoise import BLOCK, DenoiseError, Denoiser
from firsthop.shared.session_config import UNSET, SessionConfigError, noise_reduction

from .test_media_core import PT, THEIRS, events, keyed
from .test_opus import encode


def ga(value: object) -> dict[str, object]:
    return {"audio": {"input": {"noise_reduction": value}}}


def test_the_session_says_near_far_off_or_nothing() -> None:
    assert noise_reduction(ga({"type": "near_field"})) == "near_field"
    assert noise_reduction({"input_audio_noise_reduction": {"type": "far_field"}}) == "far_field"
    assert noise_reduction(ga(None)) is None
    assert noise_reduction({"audio": {"input": {}}}) == UNSET
    assert noise_reduction(None) == UNSET
    for bad in ({"type": "loud"}, "near_field", {"kind": "near_field"}, 1):
        with pytest.raises(SessionConfigError):
            noise_reduction(ga(bad))


def test_a_session_update_turns_it_on_and_off_and_goes_on_to_the_backend() -> None:
    ids = itertools.count()
    codec = RealtimeProtocol(CallInfo("s", "c", None, {}), new_id=lambda: f"e{next(ids)}")
    on = json.dumps({"type": "session.update", "session": ga({"type": "near_field"})})
    events_on = codec.caller_message(on)
    assert events_on[0] == NoiseReduction("near_field")
    assert isinstance(events_on[1], ToAgent)
    assert codec.caller_message(json.dumps({"type": "session.update", "session": ga(None)}))[0] == (
        NoiseReduction(None)
    )
    plain = codec.caller_message(json.dumps({"type": "session.update", "session": {}}))
    assert not any(isinstance(e, NoiseReduction) for e in plain)
    bad = codec.caller_message(
        json.dumps({"type": "session.update", "session": ga({"type": "loud"})})
    )
    (error,) = [json.loads(e.text) for e in bad if isinstance(e, ToSender)]
    assert error["type"] == "error" and "noise_reduction" in error["error"]["message"]
    assert not any(isinstance(e, (NoiseReduction, ToAgent)) for e in bad)


def noise(samples: int, level: float = 1500.0, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, level, samples).clip(-32768, 32767)


def rms(pcm: bytes) -> float:
    return float(np.sqrt(np.mean(np.frombuffer(pcm, "<i2").astype(np.float64) ** 2)))


def test_rnnoise_keeps_the_length_and_silences_steady_noise() -> None:
    d = Denoiser()
    pcm = noise(48000).astype("<i2").tobytes()
    out = b"".join(d.process(pcm[i : i + 1920]) for i in range(0, len(pcm), 1920))
    assert len(out) == len(pcm)
    assert rms(out[48000:]) < rms(pcm[48000:]) / 10  # past its first half second
    odd = Denoiser()  # part-blocks: held for the next call, the length kept
    parts = [odd.process(pcm[i : i + 700]) for i in range(0, 7000, 700)]
    assert [len(p) for p in parts] == [700] * 10
    assert len(odd.process(bytearray(pcm[:960]))) == 960  # any bytes-like
    with pytest.raises(DenoiseError):
        odd.process(pcm[:3])  # not PCM16
    assert BLOCK == 480
    d.close()
    assert d.process(pcm[:1920]) == pcm[:1920]  # closed: untouched


def test_the_media_core_denoises_what_the_agent_hears_only_when_asked() -> None:
    packets = encode(noise(50 * 960).astype(np.int16), fec=False)
    heard = {}
    for asked in (None, "near_field"):
        media, caller = keyed()
        if asked:
            assert media.set_noise_reduction(asked)
        for i, payload in enumerate(packets):
            caller.send(caller.rtp(i, i * 960, payload, THEIRS, PT), i * 0.02)
        frames = [e.pcm for e in events(media) if isinstance(e, AudioReceived)]
        assert len(frames) == len(packets)
        heard[asked] = rms(b"".join(frames[25:]))
        assert media.stats()["frames_denoised"] == (len(packets) if asked else 0)
        media.close()
    assert heard["near_field"] < heard[None] / 10, heard


def speech_like(seconds: float = 2.0) -> bytes:
    """Harmonic bursts (a voice's shape: pitch, pauses) over steady noise."""
    t = np.arange(int(48000 * seconds)) / 48000
    voiced = sum(np.sin(2 * np.pi * f * t) / k for k, f in enumerate((180, 360, 540, 900), 1))
    bursts = (np.sin(2 * np.pi * 1.5 * t) > 0) * 6000 * voiced
    return bytes((bursts + noise(t.size, 800)).clip(-32768, 32767).astype("<i2").tobytes())


def test_the_built_rnnoise_runs_the_shipped_model_on_its_int8_path() -> None:
    """Ours (int8 weights) and pyrnnoise's library (their float copies) compute the same model:
    the outputs differ by rounding, far below what either removes."""
    pcm = speech_like()
    ours, _ = denoised(pcm)
    lib = denoise._load()
    assert 2_000_000 < len(lib.blob) < 4_000_000  # the int8 weights, not the 11.5 MB float copies
    assert b"gru1_input_weights_float" not in lib.blob and b"gru1_input_weights_int8" in lib.blob
    reference, _ = shipped_denoised(pcm)
    signal = np.frombuffer(pcm, "<i2").astype(np.float64)
    removed = float(np.sum((signal - reference) ** 2))
    apart = float(np.sum((ours - reference) ** 2))
    assert apart < removed / 10_000, (apart, removed)  # 1e-6 of it measured on AVX2
    assert rms(ours.astype("<i2").tobytes()) > rms(pcm) / 3  # the voice is kept


def test_the_voice_probability_is_the_shipped_models() -> None:
    """RNNoise's VAD (a layer of one output, summed apart from the others) block by block:
    ours and pyrnnoise's library agree to rounding, through speech and pauses alike."""
    pcm = speech_like()
    ours = denoise.Denoiser()
    lib = shipped_library()
    state = lib.rnnoise_create(None)
    out = np.empty(480, dtype=np.float32)
    heard, reference = [], []
    for i in range(0, len(pcm) - 959, 960):  # one 10 ms block at a time
        ours.process(pcm[i : i + 960])
        heard.append(ours.speech)
        block = np.frombuffer(pcm[i : i + 960], "<i2").astype(np.float32)
        reference.append(lib.rnnoise_process_frame(state, out.ctypes.data, block.ctypes.data))
    lib.rnnoise_destroy(state)
    ours.close()
    assert min(reference) < 0.1 and max(reference) > 0.9  # the input has both
    assert max(abs(a - b) for a, b in zip(heard, reference, strict=True)) < 0.1


@pytest.mark.parametrize("blob", [b"", bytes(64), b"DNNw" + bytes(200), b"junk" * 5000])
def test_a_blob_that_is_not_the_model_is_refused_not_read(blob: bytes) -> None:
    lib = denoise._load().lib
    model = lib.firsthop_rnnoise_model(blob, len(blob))
    assert not lib.firsthop_rnnoise_create(model)
    lib.firsthop_rnnoise_model_free(model)


def test_a_model_of_other_shapes_is_refused() -> None:
    engine = denoise._load()
    name = b"gru2_recurrent_bias".ljust(44, b"\0")
    at = engine.blob.index(name) - 20  # the array's head: DNNw, version, type, size, block
    head = bytearray(engine.blob[at : at + 20])
    head[12:16] = (4 * 383).to_bytes(4, "little")  # 383 outputs where the layer has 384
    blob = engine.blob[:at] + bytes(head) + engine.blob[at + 20 :]
    model = engine.lib.firsthop_rnnoise_model(blob, len(blob))
    assert not engine.lib.firsthop_rnnoise_create(model)
    engine.lib.firsthop_rnnoise_model_free(model)
    state = engine.lib.firsthop_rnnoise_create(engine.model)  # the real one still loads
    assert state
    engine.lib.firsthop_rnnoise_destroy(state)


def test_run_time_dispatch_picks_the_best_kernels_this_cpu_has() -> None:
    import platform
    from pathlib import Path

    lines = Path("/proc/cpuinfo").read_text().splitlines()
    flags = set(next(ln for ln in lines if ln.startswith("flags")).split(":", 1)[1].split())
    expected = "generic"
    if platform.machine() == "x86_64" and "sse4_1" in flags:
        expected = "avx2" if {"avx", "avx2", "fma", "xsave"} <= flags else "sse4.1"
    assert denoise._load().kernels == expected
