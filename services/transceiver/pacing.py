"""The agent's output queue and clock for one session: pure, time passed in.

The agent's 20 ms frames are played at real time from a bounded queue. Two rules keep the
delay the agent's audio sees at its floor:

* When the call is idle (the last frame played was silence) and the agent's audio starts,
  the first frame goes out at once and the output clock re-phases to it, instead of waiting
  up to 20 ms for the next tick of a clock that started when DTLS did.
* A queue that has grown (a stall in the agent, the network or this loop) drains through the
  agent's silence: a quiet frame arriving while 2 or more frames wait is dropped. Without it,
  audio arriving exactly as fast as it leaves keeps any backlog, and its delay, for the rest
  of the call. Speech is never dropped this way (an agent may send ahead on purpose).
"""

from __future__ import annotations

import array
from collections import deque

SAMPLE_RATE = 48000
FRAME_SAMPLES = 960  # 20 ms
FRAME_BYTES = FRAME_SAMPLES * 2
MAX_FRAMES = 50  # 1 s of agent audio waiting to be played
BACKLOG = 2  # frames queued beyond which quiet frames are dropped
QUIET_PEAK = 64  # |sample| at or below this is silence (about -54 dBFS)


def is_quiet(pcm: bytes) -> bool:
    samples = array.array("h")
    samples.frombytes(pcm)
    return max(samples, default=0) <= QUIET_PEAK and -min(samples, default=0) <= QUIET_PEAK


class OutputQueue:
    def __init__(self) -> None:
        self.frames: deque[bytes] = deque()
        self.dropped_full = 0  # oldest frames dropped at the bound
        self.dropped_quiet = 0  # quiet frames dropped to drain a backlog
        self.start: float | None = None  # clock origin: frame n plays at start + n * 20 ms
        self.pts = 0
        self.idle = True  # the last frame played was silence

    def push(self, pcm: bytes) -> None:
        for off in range(0, len(pcm) - FRAME_BYTES + 1, FRAME_BYTES):
            frame = pcm[off : off + FRAME_BYTES]
            if len(self.frames) >= BACKLOG and is_quiet(frame):
                self.dropped_quiet += 1
                continue
            if len(self.frames) >= MAX_FRAMES:
                self.frames.popleft()
                self.dropped_full += 1
            self.frames.append(frame)

    def clear(self) -> None:
        self.frames.clear()

    def next_deadline(self, now: float) -> float:
        """Advance to the next frame; when it is due (now, for the very first)."""
        if self.start is None:
            self.start = now
            return now
        self.pts += FRAME_SAMPLES
        return self.start + self.pts / SAMPLE_RATE

    def may_start_early(self) -> bool:
        """True if arriving agent audio may go out before the deadline (idle and empty)."""
        return self.idle and not self.frames

    def rephase(self, now: float) -> None:
        """Play the current frame now: the clock's origin moves so that `pts` is due now."""
        self.start = now - self.pts / SAMPLE_RATE

    def pop(self) -> bytes | None:
        frame = self.frames.popleft() if self.frames else None
        self.idle = frame is None
        return frame
