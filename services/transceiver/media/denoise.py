"""Server-side noise suppression: RNNoise (Xiph, BSD-3) on a call's decoded 48 kHz audio.

The library and its model come in the `pyrnnoise` wheel (Apache-2.0; `pip install
firsthop[noise]`), loaded here through ctypes from the package's directory without importing
the package (its Python side pulls in plotting and file I/O the transceiver has no use for).
RNNoise takes 10 ms frames (480 samples at 48 kHz) of floats in PCM16's range and keeps its
own state per stream: one `Denoiser` per call, only for a call whose session asked
(`audio.input.noise_reduction`, docs/architecture.md §8).
"""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path
from typing import Any

BLOCK = 480  # samples: RNNoise's frame, 10 ms at 48 kHz
KINDS = ("near_field", "far_field")  # OpenAI's names; RNNoise has one model for both


class DenoiseError(RuntimeError):
    pass


_lib: Any = None


def _library() -> Any:
    global _lib
    if _lib is None:
        spec = importlib.util.find_spec("pyrnnoise")
        if spec is None or not spec.submodule_search_locations:
            raise DenoiseError("noise suppression needs pyrnnoise: pip install firsthop[noise]")
        path = Path(next(iter(spec.submodule_search_locations))) / "librnnoise.so"
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as exc:
            raise DenoiseError(f"cannot load {path}: {exc}") from exc
        lib.rnnoise_create.argtypes = [ctypes.c_void_p]
        lib.rnnoise_create.restype = ctypes.c_void_p
        lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]
        lib.rnnoise_destroy.restype = None
        lib.rnnoise_get_frame_size.restype = ctypes.c_int
        lib.rnnoise_process_frame.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.rnnoise_process_frame.restype = ctypes.c_float
        if lib.rnnoise_get_frame_size() != BLOCK:
            raise DenoiseError(f"{path}: RNNoise's frame is not {BLOCK} samples")
        _lib = lib
    return _lib


def available() -> bool:
    try:
        _library()
    except DenoiseError:
        return False
    return True


class Denoiser:
    """One stream's RNNoise: PCM16 mono 48 kHz in, the same length out. Whole 10 ms blocks
    go through at once; a part-block is held for the next call, and until the first whole
    block the output is that much silence (20 ms frames, the usual, are never held)."""

    def __init__(self) -> None:
        import numpy as np

        self._np = np
        self._lib = _library()
        self._state = self._lib.rnnoise_create(None)
        if not self._state:
            raise DenoiseError("rnnoise_create failed")
        self._held = np.zeros(0, dtype=np.float32)
        self._ready = np.zeros(0, dtype=np.int16)
        self.frames = 0
        self.speech = 0.0  # RNNoise's voice probability of the last block

    def process(self, pcm: bytes) -> bytes:
        np = self._np
        if self._state is None:
            return pcm
        samples = np.frombuffer(pcm, dtype="<i2")
        held = np.concatenate((self._held, samples.astype(np.float32)))
        whole = len(held) // BLOCK * BLOCK
        block_in = np.ascontiguousarray(held[:whole])
        block_out = np.empty_like(block_in)
        process, state = self._lib.rnnoise_process_frame, self._state
        base_in, base_out = block_in.ctypes.data, block_out.ctypes.data
        for offset in range(0, whole * 4, BLOCK * 4):
            self.speech = process(state, base_out + offset, base_in + offset)
        self._held = held[whole:]
        self.frames += 1
        out = np.clip(block_out, -32768, 32767).astype("<i2")
        if self._ready.size or len(out) != len(samples):
            ready = np.concatenate((self._ready, out))
            short = len(samples) - len(ready)
            if short > 0:
                ready = np.concatenate((np.zeros(short, dtype=np.int16), ready))
            out, self._ready = ready[: len(samples)], ready[len(samples) :]
        return bytes(out.tobytes())

    def close(self) -> None:
        if self._state is not None:
            self._lib.rnnoise_destroy(self._state)
            self._state = None
