"""The call's 20 ms frame, one owner: its rate and size, and the one frame cutter.

Every path that turns an agent's audio into the call's frames cuts it here: the media
core (`core.py`, for any agent's `push_audio`), the Realtime bridge (a backend's deltas,
resampled to 48 kHz) and the Twilio Media Streams bridge (a bot's 8 kHz mu-law, resampled).
What differs between them is *when* a part-frame is given up on, not how it is cut:

* `cut(pcm)`: the whole frames of what is held plus `pcm`; the rest is held;
* `pad()`: the held part-frame, padded with silence to a whole frame (None if none);
* `lead(pcm, unit)`: `pcm` led by silence to a whole number of frames (or of `unit`s: the
  Twilio bridge's chunks toward the bot). A resampler's first
  output falls a few samples short of its input's length, and leading it whole sends each
  later chunk out at once. Cutting instead would hold back most of a frame (~20 ms).

Invariants: frames are PCM16 mono at `CALL_RATE`, `FRAME_BYTES` each; at most one part-frame
(< FRAME_BYTES) is held. Pure.
"""

from __future__ import annotations

CALL_RATE = 48000  # Hz: the call's audio, both ways (Opus at 48 kHz, RFC 7587)
FRAME_SAMPLES = 960  # 20 ms
FRAME_BYTES = FRAME_SAMPLES * 2  # PCM16 mono


class FrameCutter:
    def __init__(self) -> None:
        self.held = bytearray()  # a part-frame, waiting for the rest

    def cut(self, pcm: bytes | bytearray) -> list[bytes]:
        held = self.held
        held += pcm
        n = len(held) // FRAME_BYTES
        if not n:
            return []
        frames = [bytes(held[i * FRAME_BYTES : (i + 1) * FRAME_BYTES]) for i in range(n)]
        del held[: n * FRAME_BYTES]
        return frames

    def pad(self) -> bytes | None:
        if not self.held:
            return None
        frame = bytes(self.held) + bytes(FRAME_BYTES - len(self.held))
        self.held.clear()
        return frame

    def clear(self) -> None:
        self.held.clear()

    @staticmethod
    def lead(pcm: bytes, unit: int = FRAME_BYTES) -> bytes:
        return bytes(-len(pcm) % unit) + pcm
