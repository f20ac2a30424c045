"""The agent's output queue and clock for one session: pure, time passed in.

The agent's 20 ms frames are played at real time from a bounded queue. Two rules keep the
delay the agent's audio sees at its floor:

* When the call is idle (the agent sent nothing for the last `IDLE_AFTER` ticks) and the
  agent's audio starts, the first frame goes out at once and the output clock re-phases to
  it, instead of waiting up to 20 ms for the next tick of a clock that started when DTLS
  did. One missing frame mid-speech (a packet lost on the way in, a late frame) is a gap,
  not a pause: the clock keeps its phase (the core re-phases it only to a stream whose
  frames keep coming late, `core.LATE_RUN`).
* A queue that has grown (a stall in the agent, the network or this loop) drains through the
  agent's silence: a quiet frame arriving while 2 or more frames wait is dropped. Without it,
  audio arriving exactly as fast as it leaves keeps any backlog, and its delay, for the rest
  of the call. Speech is never dropped this way (an agent may send ahead on purpose).
  A queue made with `drain_quiet=False` keeps every frame (a backend that sends a whole
  answer ahead, faster than real time, means its pauses), up to its own, larger bound.

Each frame may carry an opaque tag (a Realtime backend's response and item): what `push`
drops and what `pop` plays is reported by tag, so what the caller really heard is known.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

from firsthop.services.transceiver.media.frames import CALL_RATE, FRAME_BYTES, FRAME_SAMPLES
from firsthop.shared.speedups import peak

Tag = TypeVar("Tag")

SAMPLE_RATE = CALL_RATE
MAX_FRAMES = 50  # 1 s of agent audio waiting to be played
BACKLOG = 2  # frames queued beyond which quiet frames are dropped
QUIET_PEAK = 64  # |sample| at or below this is silence (about -54 dBFS)
IDLE_AFTER = 10  # ticks (200 ms) with nothing from the agent before the call counts as idle


def is_quiet(pcm: bytes) -> bool:
    """Whether a frame is silence (every sample within QUIET_PEAK)."""
    return peak(pcm) <= QUIET_PEAK


class OutputQueue(Generic[Tag]):
    def __init__(self, max_frames: int = MAX_FRAMES, *, drain_quiet: bool = True) -> None:
        self.max_frames = max_frames
        self.drain_quiet = drain_quiet
        self.frames: deque[bytes] = deque()
        self.tags: deque[Tag | None] = deque()  # one per frame
        self.played_tag: Tag | None = None  # the tag of the frame `pop` last returned
        self.dropped_full = 0  # oldest frames dropped at the bound
        self.dropped_quiet = 0  # quiet frames dropped to drain a backlog
        self.start: float | None = None  # clock origin: frame n plays at start + n * 20 ms
        self.pts = 0
        self.idle = True  # nothing from the agent for the last IDLE_AFTER ticks
        self._empty = IDLE_AFTER  # ticks in a row with nothing to play

    def push(self, pcm: bytes, tag: Tag | None = None) -> list[Tag]:
        """Queue whole 20 ms frames of `pcm`; the tags of the frames dropped doing so."""
        frames = [
            pcm[off : off + FRAME_BYTES]
            for off in range(0, len(pcm) - FRAME_BYTES + 1, FRAME_BYTES)
        ]
        return self.push_frames(frames, tag)

    def push_frames(self, frames: list[bytes], tag: Tag | None = None) -> list[Tag]:
        """Queue 20 ms frames (`frames.FrameCutter` made them); the tags dropped doing so."""
        dropped: list[Tag] = []
        for frame in frames:
            if self.drain_quiet and len(self.frames) >= BACKLOG and is_quiet(frame):
                self.dropped_quiet += 1
                if tag is not None:
                    dropped.append(tag)
                continue
            if len(self.frames) >= self.max_frames:
                self.frames.popleft()
                old = self.tags.popleft()
                self.dropped_full += 1
                if old is not None:
                    dropped.append(old)
            self.frames.append(frame)
            self.tags.append(tag)
        return dropped

    def clear(self) -> None:
        self.frames.clear()
        self.tags.clear()

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
        self.played_tag = self.tags.popleft() if frame is not None else None
        self._empty = self._empty + 1 if frame is None else 0
        self.idle = self._empty >= IDLE_AFTER
        return frame
