"""Two loops of the per-frame media path in C where the extension is built (`_speedups.c`),
in numpy where it is not: the same results either way (a property test holds them equal).
(The extension also makes libopus's per-frame calls for `media/opus.py`, which falls back
to ctypes.)

* `mask(data, key)`: RFC 6455 §5.3's XOR, on every frame the transceiver sends an agent
  (a WebSocket client masks all it sends) and on every frame an agent server receives;
* `peak(pcm)`: the largest |sample| of a PCM16 frame, the output queue's quiet check.

Why C: on a 20 ms frame numpy's fixed cost per call (its array and scalar objects) is the
whole cost, about 4 us each (measured; well under 1 us in C); at the knee the transceiver
spends about 300 us a frame in all (docs/capacity.md). `BUILT` says which is in use; the
build is optional like the relay's fast path (setup.py), and `make test` checks it was built.
"""

from __future__ import annotations

import numpy as np

try:
    from firsthop.shared import _speedups
except ImportError:  # no C compiler where it was installed: numpy's
    _speedups = None  # type: ignore[assignment]

BUILT = _speedups is not None
native = _speedups  # the C module itself, or None: media/opus.py binds libopus's calls into it


Buffer = bytes | bytearray | memoryview


def mask_numpy(data: Buffer, key: bytes) -> bytes:
    """XOR `data` with the 4-byte `key` repeated; the same call unmasks."""
    if len(key) != 4:
        raise ValueError("a WebSocket mask key is 4 bytes")
    data = memoryview(data).cast("B")  # (bytes, whatever the buffer's items, as C counts)
    n = len(data)
    if n == 0:
        return b""
    pad = -n % 4
    words = np.frombuffer(bytes(data) + bytes(pad) if pad else data, dtype="<u4")
    out: bytes = (words ^ np.uint32(int.from_bytes(key, "little"))).tobytes()
    return out[:n] if pad else out


def peak_numpy(pcm: Buffer) -> int:
    """The largest |sample| of PCM16 little-endian (an odd last byte is ignored)."""
    pcm = memoryview(pcm).cast("B")  # (bytes, whatever the buffer's items, as C counts)
    samples = np.frombuffer(pcm, dtype="<i2", count=len(pcm) // 2)
    if samples.size == 0:
        return 0
    return max(int(samples.max()), -int(samples.min()))


if _speedups is not None:
    mask = _speedups.mask
    peak = _speedups.peak
else:
    mask = mask_numpy
    peak = peak_numpy
