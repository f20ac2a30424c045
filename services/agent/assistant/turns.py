"""Server VAD: where the caller's turns start and stop in the appended audio. Pure.

Strategy: cut the 24 kHz input into 10 ms frames, ask a frame classifier (webrtcvad on the
frame resampled to 16 kHz, gated by loudness so line noise never counts) whether it is speech.
A turn starts after `START_MS` of speech frames in a row and keeps `prefix_padding_ms` of
audio before them; it stops after `silence_duration_ms` without speech, or at
`MAX_TURN_MS`. The end of speech is known to a frame: at 10 ms (webrtcvad's shortest) the
turn ends on average 4 ms sooner than at 20 ms, and a stream whose frames do not line up with
the speech (any caller's) is heard ending at most 10 ms late, not 20 (measured: the bench's
three questions at ten phases, through Opus and not). Positions are milliseconds of audio
since the session began (`audio_start_ms` / `audio_end_ms` in the protocol), so nothing here
reads a clock.

Invariant: memory is bounded by the longest turn plus the prefix padding.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from firsthop.services.agent.assistant.audio import BYTES_PER_MS, dbfs, resample

FRAME_MS = 10
FRAME_BYTES = FRAME_MS * BYTES_PER_MS
START_MS = 60  # of speech in a row before a turn starts
START_FRAMES = START_MS // FRAME_MS
MAX_TURN_MS = 30_000  # a turn longer than this is cut (and committed)
MIN_DBFS = -50.0  # quieter frames are never speech

Classifier = Callable[[bytes], bool]  # one frame (FRAME_MS) of 24 kHz PCM16 -> speech?


@dataclass(frozen=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True)
class SpeechStopped:
    audio_end_ms: int
    audio: bytes  # the turn at 24 kHz, prefix padding included
    speech_end_ms: int  # end of the last speech frame: audio_end_ms - this is the VAD hangover


TurnEvent = SpeechStarted | SpeechStopped


def energy_classifier(threshold_dbfs: float = -40.0) -> Classifier:
    def classify(frame: bytes) -> bool:
        return dbfs(frame) >= threshold_dbfs

    return classify


def webrtc_classifier(threshold: float) -> Classifier:
    """webrtcvad (the mode from the 0..1 threshold) behind a loudness gate."""
    import webrtcvad

    vad = webrtcvad.Vad(max(0, min(3, int(threshold * 4))))

    def classify(frame: bytes) -> bool:
        if dbfs(frame) < MIN_DBFS:
            return False
        return bool(vad.is_speech(resample(frame, 24000, 16000), 16000))

    return classify


def default_classifier(threshold: float) -> Classifier:
    try:
        return webrtc_classifier(threshold)
    except ImportError:  # the assistant extra is not installed: loudness alone
        return energy_classifier()


class TurnDetector:
    def __init__(
        self,
        classifier: Classifier,
        *,
        prefix_padding_ms: int = 300,
        silence_duration_ms: int = 500,
    ) -> None:
        self.classify = classifier
        self.prefix_frames = max(0, prefix_padding_ms // FRAME_MS)
        self.silence_frames = max(1, silence_duration_ms // FRAME_MS)
        self.position_ms = 0  # audio consumed so far (whole frames)
        self._pending = b""  # less than a frame
        self._prefix: deque[bytes] = deque(maxlen=self.prefix_frames + START_FRAMES)
        self._run = 0  # speech frames in a row before a turn
        self._turn: list[bytes] = []
        self._quiet = 0
        self._speech_end_ms = 0
        self.speaking = False

    def feed(self, pcm: bytes) -> list[TurnEvent]:
        events: list[TurnEvent] = []
        data = self._pending + pcm
        whole = len(data) // FRAME_BYTES * FRAME_BYTES
        self._pending = data[whole:]
        for offset in range(0, whole, FRAME_BYTES):
            event = self._frame(data[offset : offset + FRAME_BYTES])
            if event is not None:
                events.append(event)
        return events

    def _frame(self, frame: bytes) -> TurnEvent | None:
        self.position_ms += FRAME_MS
        speech = self.classify(frame)
        if not self.speaking:
            self._prefix.append(frame)
            self._run = self._run + 1 if speech else 0
            if self._run < START_FRAMES:
                return None
            self.speaking = True
            self._turn = list(self._prefix)
            self._prefix.clear()
            self._quiet = 0
            self._speech_end_ms = self.position_ms
            return SpeechStarted(audio_start_ms=self.position_ms - START_FRAMES * FRAME_MS)
        self._turn.append(frame)
        if speech:
            self._quiet = 0
            self._speech_end_ms = self.position_ms
        else:
            self._quiet += 1
        if self._quiet >= self.silence_frames or len(self._turn) * FRAME_MS >= MAX_TURN_MS:
            return self.stop()
        return None

    def stop(self) -> SpeechStopped | None:
        """End the current turn now (a manual commit during speech); None if not in one."""
        if not self.speaking:
            return None
        audio = b"".join(self._turn)
        self.speaking = False
        self._turn = []
        self._run = 0
        self._quiet = 0
        return SpeechStopped(
            audio_end_ms=self.position_ms, audio=audio, speech_end_ms=self._speech_end_ms
        )

    def clear(self) -> None:
        self._pending = b""
        self._prefix.clear()
        self._turn = []
        self._run = 0
        self._quiet = 0
        self.speaking = False
