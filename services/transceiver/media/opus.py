"""Opus on libopus itself (ctypes): a decoder with loss concealment, and an encoder.

aiortc decodes through FFmpeg's libopus wrapper, which cannot conceal: FFmpeg takes an empty
packet as end of stream and always decodes with `decode_fec=0`. A lost packet then leaves a
hole in what the agent hears. Called directly, libopus does both repairs (RFC 6716 §4.4):

* `recover(next_payload)`: the lost frame from the in-band FEC (LBRR) the *next* packet
  carries when the sender encodes with `useinbandfec` (browsers do under loss); libopus falls
  back to concealment when that packet carries none;
* `conceal()`: packet-loss concealment, extrapolated from what came before.

It decodes straight to mono (libopus downmixes), which is what the agent takes.

`OpusEncoder` codes the agent's 20 ms mono frames for the caller: the same libopus call
PyAV's encoder ends in, without the AudioFrame, Packet and codec-context work around it
(measured: 82 us a frame through PyAV, about a third of that here). It uses libopus's
restricted low-delay mode (CELT only): 2.5 ms of look-ahead where the VoIP mode's 6.5 ms
delays every word the agent says by 4 ms more. What the VoIP mode would add is SILK, which
pays off below ~24 kb/s and carries in-band FEC; at our 48 kb/s CELT codes voice well
(measured on espeak speech: 19 dB waveform SNR, 112 bytes a frame against VoIP's 109) at a
third of the cost (51 us a frame against 150), and we send no FEC (nor did we in the VoIP
mode): the caller's decoder conceals a lost frame. It encodes at `COMPLEXITY` 6, not
libopus's default 9: 40 us a frame against 61, for a wideband PESQ of 4.41 against 4.45.

The library is the one PyAV ships (so it is the same build aiortc's encoder uses), else the
system's. Its per-frame calls (`opus_encode`, `opus_decode`) go through the C extension
(`shared/_speedups.c`, given their addresses once) where it is built: a ctypes call and the
copy out cost about 2.5 us a frame each way here, a tenth of that from C. Elsewhere ctypes
makes them.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
from typing import Any

import av

from firsthop.services.transceiver.media.frames import CALL_RATE, FRAME_SAMPLES
from firsthop.shared.speedups import native

SAMPLE_RATE = CALL_RATE
# FRAME_SAMPLES (20 ms): what is concealed when the lost frame's length is unknown
MAX_SAMPLES = 5760  # 120 ms, the longest Opus packet (RFC 6716 §3.2.5)
MAX_PACKET = 1500  # bytes an encoded frame may take (far above 20 ms at 48 kb/s: 120)
APPLICATION_VOIP = 2048  # OPUS_APPLICATION_VOIP
APPLICATION_RESTRICTED_LOWDELAY = 2051  # OPUS_APPLICATION_RESTRICTED_LOWDELAY: CELT only
SET_BITRATE = 4002  # OPUS_SET_BITRATE_REQUEST
SET_COMPLEXITY = 4010  # OPUS_SET_COMPLEXITY_REQUEST
GET_COMPLEXITY = 4011  # OPUS_GET_COMPLEXITY_REQUEST
# The encoder's complexity (libopus: 0-10; its default, which we ran at before, is 9). CELT's
# cost steps down below 7 and is flat from 7 to 10: measured in one run, 56-61 us a frame at
# 7-10, 40-41 us at 5-6, 35 us at 4; wideband PESQ (ITU-T P.862.2) on 13.6 s of piper speech at
# 48 kb/s 4.452 at 9 and 10, 4.408 at 6. So 6: the encode, two thirds of a call's codec time, a
# third cheaper, for 0.04 of PESQ's 4.64 (libwebrtc runs Opus at 5 on phones).
COMPLEXITY = 6
GET_LOOKAHEAD = 4027  # OPUS_GET_LOOKAHEAD_REQUEST


class OpusError(Exception):
    pass


_INT = ctypes.POINTER(ctypes.c_int)
# What each libopus call takes and gives (opus.h); opus_encoder_ctl is variadic: left bare.
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "opus_decoder_create": ([ctypes.c_int32, ctypes.c_int, _INT], ctypes.c_void_p),
    "opus_decoder_destroy": ([ctypes.c_void_p], None),
    "opus_decode": (
        [
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_int32,
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_int,
        ],
        ctypes.c_int,
    ),
    "opus_packet_has_lbrr": ([ctypes.c_char_p, ctypes.c_int32], ctypes.c_int),
    "opus_encoder_create": ([ctypes.c_int32, ctypes.c_int, ctypes.c_int, _INT], ctypes.c_void_p),
    "opus_encoder_destroy": ([ctypes.c_void_p], None),
    "opus_encode": (
        [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int32],
        ctypes.c_int32,
    ),
}


def _load() -> ctypes.CDLL:
    bundled = sorted(glob.glob(os.path.join(os.path.dirname(av.__file__) + ".libs", "libopus*")))
    path = bundled[0] if bundled else ctypes.util.find_library("opus")
    if path is None:
        raise OpusError("libopus not found (PyAV's bundled copy nor the system's)")
    lib = ctypes.CDLL(path)
    for name, (argtypes, restype) in _SIGNATURES.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, restype
    if native is not None:
        encode, decode = (
            ctypes.cast(f, ctypes.c_void_p).value for f in (lib.opus_encode, lib.opus_decode)
        )
        native.opus_bind(encode or 0, decode or 0)  # (0: refused, ValueError)
    return lib


_lib: ctypes.CDLL | None = None


def prepare() -> None:
    """Load libopus now (`OpusError` if it cannot be), not at the first call."""
    _library()


def _library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        _lib = _load()
    return _lib


class OpusDecoder:
    """One stream's decoder state (48 kHz mono out). Not thread-safe: one caller."""

    _state: int | None = None  # (until made: what __init__ raised before it leaves no state)

    def __init__(self) -> None:
        self._lib = _library()
        error = ctypes.c_int(0)
        self._state = self._lib.opus_decoder_create(SAMPLE_RATE, 1, ctypes.byref(error))
        if not self._state or error.value != 0:
            self.close()
            raise OpusError(f"opus_decoder_create failed ({error.value})")
        self._pcm: ctypes.Array[ctypes.c_char] | None = None  # (ctypes' decode only: 11.5 KB)
        self.last_samples = FRAME_SAMPLES  # the length of the last frame, what a loss lasts

    def decode(self, payload: bytes) -> bytes:
        """PCM16 mono of one packet; `OpusError` if it is not valid Opus."""
        if not payload:
            raise OpusError("empty packet")
        return self._run(payload, MAX_SAMPLES, 0)

    def conceal(self) -> bytes:
        """One lost frame's worth of concealment."""
        return self._run(None, self.last_samples, 0)

    def recover(self, next_payload: bytes) -> tuple[bytes, bool]:
        """The lost frame before `next_payload`, from its in-band FEC if it has any (else
        concealment), and whether it had; `next_payload` itself is decoded after."""
        if not next_payload or self._lib.opus_packet_has_lbrr(next_payload, len(next_payload)) != 1:
            return self.conceal(), False
        return self._run(next_payload, self.last_samples, 1), True

    def _run(self, payload: bytes | None, frame_size: int, fec: int) -> bytes:
        if not self._state:
            raise OpusError("the decoder is closed")
        if native is not None:
            try:
                pcm = native.opus_decode(self._state, payload, frame_size, fec)
            except ValueError as exc:
                raise OpusError(f"opus_decode failed ({exc})") from None
        else:
            if self._pcm is None:
                self._pcm = ctypes.create_string_buffer(MAX_SAMPLES * 2)
            n = self._lib.opus_decode(
                self._state, payload, len(payload or b""), self._pcm, frame_size, fec
            )
            if n < 0:
                raise OpusError(f"opus_decode failed ({n})")
            pcm = ctypes.string_at(self._pcm, n * 2)  # one copy (`.raw` copies all 11 KB)
        if payload is not None and not fec:
            self.last_samples = len(pcm) // 2
        return pcm

    def close(self) -> None:
        if self._state:
            self._lib.opus_decoder_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()


class OpusEncoder:
    """One stream's encoder: 48 kHz mono, `bitrate` bits/s, restricted low delay (CELT) unless
    another libopus `application` is asked for, at `complexity` (0-10)."""

    _state: int | None = None  # (as the decoder's)

    def __init__(
        self,
        bitrate: int,
        application: int = APPLICATION_RESTRICTED_LOWDELAY,
        complexity: int = COMPLEXITY,
    ) -> None:
        self._lib = _library()
        error = ctypes.c_int(0)
        self._state = self._lib.opus_encoder_create(
            SAMPLE_RATE, 1, application, ctypes.byref(error)
        )
        if not self._state or error.value != 0:
            self.close()
            raise OpusError(f"opus_encoder_create failed ({error.value})")
        for request, value, name in (
            (SET_BITRATE, bitrate, "OPUS_SET_BITRATE"),
            (SET_COMPLEXITY, complexity, "OPUS_SET_COMPLEXITY"),
        ):
            if self._lib.opus_encoder_ctl(
                ctypes.c_void_p(self._state), request, ctypes.c_int32(value)
            ):
                self.close()
                raise OpusError(f"opus_encoder_ctl({name}, {value}) failed")
        self._out: ctypes.Array[ctypes.c_char] | None = None  # (ctypes' encode only)

    @property
    def lookahead(self) -> int:
        """Samples (at 48 kHz) the encoder delays its input by."""
        return self._get(GET_LOOKAHEAD, "OPUS_GET_LOOKAHEAD")

    @property
    def complexity(self) -> int:
        return self._get(GET_COMPLEXITY, "OPUS_GET_COMPLEXITY")

    def _get(self, request: int, name: str) -> int:
        value = ctypes.c_int32(0)
        if self._lib.opus_encoder_ctl(ctypes.c_void_p(self._state), request, ctypes.byref(value)):
            raise OpusError(f"opus_encoder_ctl({name}) failed")
        return value.value

    def encode(self, pcm: bytes) -> bytes:
        """One frame of PCM16 mono (2.5 to 60 ms; we send 20) as one Opus packet."""
        if not self._state:
            raise OpusError("the encoder is closed")
        if native is not None:
            try:
                return native.opus_encode(self._state, pcm, MAX_PACKET)
            except ValueError as exc:
                raise OpusError(f"opus_encode failed ({exc})") from None
        if self._out is None:
            self._out = ctypes.create_string_buffer(MAX_PACKET)
        n = self._lib.opus_encode(self._state, pcm, len(pcm) // 2, self._out, MAX_PACKET)
        if n < 0:
            raise OpusError(f"opus_encode failed ({n})")
        return ctypes.string_at(self._out, n)

    def close(self) -> None:
        if self._state:
            self._lib.opus_encoder_destroy(self._state)
            self._state = None

    def __del__(self) -> None:
        self.close()
