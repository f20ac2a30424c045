from __future__ import annotations

import array
import math

from firsthop.services.transceiver.media.frames import FRAME_BYTES
from firsthop.services.transceiver.media.pacing import (
    BACKLOG,
    IDLE_AFTER,
    MAX_FRAMES,
    OutputQueue,
    is_quiet,
)

QUIET = bytes(FRAME_BYTES)
LOUD = array.array(
    "h", (int(8000 * math.sin(2 * math.pi * 440 * i / 48000)) for i in range(FRAME_BYTES // 2))
).tobytes()


def test_quiet_detection() -> None:
    assert is_quiet(QUIET)
    assert is_quiet(array.array("h", [30, -40] * 480).tobytes())
    assert not is_quiet(LOUD)


def test_clock_ticks_every_20_ms_and_rephases_when_idle() -> None:
    q: OutputQueue[None] = OutputQueue()
    assert q.next_deadline(100.0) == 100.0
    assert q.pop() is None and q.idle
    assert q.next_deadline(100.0) == 100.02
    assert q.may_start_early()
    q.push(LOUD)  # agent audio arrives 5 ms before the tick
    q.rephase(100.015)
    assert q.pop() == LOUD and not q.idle
    assert abs(q.next_deadline(100.015) - 100.035) < 1e-9  # the clock follows the new phase
    q.push(LOUD)
    assert not q.may_start_early()  # mid-speech: keep the clock


def test_one_missing_frame_mid_speech_keeps_the_clock_a_pause_does_not() -> None:
    q: OutputQueue[None] = OutputQueue()
    q.push(LOUD)
    q.next_deadline(100.0)
    assert q.pop() == LOUD
    for tick in range(1, IDLE_AFTER):
        q.next_deadline(100.0)
        assert q.pop() is None and not q.idle  # a gap: no re-phasing on the next frame
        assert not q.may_start_early(), tick
    q.next_deadline(100.0)
    assert q.pop() is None and q.idle and q.may_start_early()  # a pause: it may


def test_backlog_drains_through_silence_never_through_speech() -> None:
    q: OutputQueue[None] = OutputQueue()
    q.push(LOUD * BACKLOG)
    q.push(QUIET * 5)
    assert len(q.frames) == BACKLOG and q.dropped_quiet == 5
    q.push(LOUD * 3)  # speech sent ahead on purpose stays
    assert len(q.frames) == BACKLOG + 3
    q.clear()
    q.push(QUIET)  # a lone quiet frame is played (it is the agent's silence, not backlog)
    assert len(q.frames) == 1


def test_bounded() -> None:
    q: OutputQueue[None] = OutputQueue()
    q.push(LOUD * (MAX_FRAMES + 7))
    assert len(q.frames) == MAX_FRAMES and q.dropped_full == 7


def test_tags_are_reported_played_and_dropped_and_a_sends_ahead_queue_keeps_quiet() -> None:
    q: OutputQueue[str] = OutputQueue(4, drain_quiet=False)
    assert q.push(LOUD * 2, "a") == []
    assert q.push(QUIET * 2, "b") == []  # kept: a backend that sends ahead means its pauses
    assert q.push(LOUD, "c") == ["a"]  # the bound drops the oldest, and says whose it was
    assert q.pop() == LOUD and q.played_tag == "a"
    assert q.pop() == QUIET and q.played_tag == "b"
    q.clear()
    assert q.pop() is None and q.played_tag is None and not q.tags
