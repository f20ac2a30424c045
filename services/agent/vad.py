"""Turn-taking for the parrot agent: an energy VAD and the utterance state machine. Pure.

Frames are 20 ms of PCM16 mono at 48 kHz. Speech starts after `START_FRAMES` loud frames in a
row and stops after `HANG_MS` of quiet; the utterance (with a little lead-in) is then the reply.
While the reply plays, speech from the caller is a barge-in: the reply stops at once.
"""

from __future__ import annotations

import array
import math
from dataclasses import dataclass, field

FRAME_MS = 20
START_FRAMES = 3  # 60 ms of speech to start a turn
HANG_MS = 600  # silence that ends the caller's turn
LEAD_FRAMES = 5  # keep 100 ms before speech was detected
MAX_UTTERANCE_FRAMES = 15 * 1000 // FRAME_MS
THRESHOLD_DBFS = -45.0


def frame_dbfs(pcm: bytes) -> float:
    samples = array.array("h")
    samples.frombytes(pcm[: len(pcm) // 2 * 2])
    if not samples:
        return -120.0
    mean_square = sum(s * s for s in samples) / len(samples)
    if mean_square <= 0:
        return -120.0
    return 10 * math.log10(mean_square / (32768.0 * 32768.0))


@dataclass
class TurnTaker:
    threshold_dbfs: float = THRESHOLD_DBFS
    speaking: bool = False
    loud_run: int = 0
    quiet_ms: int = 0
    utterance: list[bytes] = field(default_factory=list)
    lead: list[bytes] = field(default_factory=list)

    def feed(self, pcm: bytes) -> list[tuple[str, list[bytes] | None]]:
        """One input frame in; events out: ("speech_started", None), ("speech_stopped",
        utterance frames)."""
        events: list[tuple[str, list[bytes] | None]] = []
        loud = frame_dbfs(pcm) >= self.threshold_dbfs
        if not self.speaking:
            self.lead.append(pcm)
            if len(self.lead) > LEAD_FRAMES:
                self.lead.pop(0)
            self.loud_run = self.loud_run + 1 if loud else 0
            if self.loud_run >= START_FRAMES:
                self.speaking = True
                self.quiet_ms = 0
                self.utterance = list(self.lead)
                self.lead = []
                events.append(("speech_started", None))
            return events
        self.utterance.append(pcm)
        self.quiet_ms = 0 if loud else self.quiet_ms + FRAME_MS
        if self.quiet_ms >= HANG_MS or len(self.utterance) >= MAX_UTTERANCE_FRAMES:
            spoken = self.utterance[: len(self.utterance) - self.quiet_ms // FRAME_MS]
            self.speaking = False
            self.loud_run = 0
            self.utterance = []
            events.append(("speech_stopped", spoken))
        return events
