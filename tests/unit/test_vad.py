from __future__ import annotations

import array
import math

from firsthop.services.agent.vad import FRAME_MS, HANG_MS, START_FRAMES, TurnTaker, frame_dbfs

FRAME = 960


def tone(level: float = 0.3) -> bytes:
    return array.array(
        "h", (int(32767 * level * math.sin(2 * math.pi * 300 * i / 48000)) for i in range(FRAME))
    ).tobytes()


SILENCE = bytes(FRAME * 2)


def test_levels() -> None:
    assert frame_dbfs(SILENCE) == -120.0
    assert -14 < frame_dbfs(tone(0.3)) < -12


def test_turn_detection_with_hangover() -> None:
    t = TurnTaker()
    events = []
    for _ in range(START_FRAMES - 1):
        events += t.feed(tone())
    assert events == []
    events += t.feed(tone())
    assert [e for e, _ in events] == ["speech_started"]
    for _ in range(20):
        assert t.feed(tone()) == []
    # short pauses inside speech do not end the turn
    for _ in range(HANG_MS // FRAME_MS - 1):
        assert t.feed(SILENCE) == []
    events = []
    for _ in range(2):
        events += t.feed(SILENCE)
    names = [e for e, _ in events]
    assert names == ["speech_stopped"]
    utterance = events[0][1]
    assert utterance is not None and 20 <= len(utterance) <= 30


def test_noise_floor_does_not_trigger() -> None:
    t = TurnTaker()
    for _ in range(100):
        assert t.feed(tone(0.001)) == []
