"""Played-audio bookkeeping (agents/playout.py): started/stopped/cleared from frames' fate."""

from __future__ import annotations

from firsthop.services.transceiver.agents.playout import Cleared, Playout, Started, Stopped

R1, R2 = "resp_1", "resp_2"
A, B = (R1, "item_a"), (R2, "item_b")


def test_started_on_first_played_frame_stopped_when_drained_after_done() -> None:
    p = Playout()
    p.queued(A, 3)
    assert p.played(A) == [Started(R1)]
    assert p.played(A) == []
    assert p.audio_done(R1) == []  # one frame still queued
    assert p.played(A) == [Stopped(R1)]
    assert p.position_ms("item_a") == 60


def test_done_after_the_queue_drained_stops_at_once() -> None:
    p = Playout()
    p.queued(A, 1)
    assert p.played(A) == [Started(R1)]
    assert p.audio_done(R1) == [Stopped(R1)]  # the backend was slow to say it was done
    assert p.audio_done(R1) == []  # said twice (output_audio.done, then response.done)


def test_no_audio_no_events() -> None:
    p = Playout()
    assert p.audio_done(R1) == []
    assert p.clear() == Cleared(None, None, 0)


def test_a_new_response_before_the_last_one_stopped() -> None:
    p = Playout()
    p.queued(A, 1)
    p.queued(B, 1)
    assert p.played(A) == [Started(R1)]
    assert p.played(B) == [Stopped(R1), Started(R2)]


def test_clear_says_what_was_cut_and_how_far_and_refuses_its_late_audio() -> None:
    p = Playout()
    p.queued(A, 10)
    for _ in range(4):
        p.played(A)
    assert p.clear() == Cleared(R1, "item_a", 80)
    assert not p.wanted(R1) and p.wanted(R2)
    assert p.played(A) == [Started(R1)]  # (cannot happen: the queue was cleared) no crash
    assert p.clear().response_id == R1


def test_clear_of_queued_but_unplayed_audio() -> None:
    p = Playout()
    p.queued(B, 5)
    assert p.clear() == Cleared(R2, "item_b", 0)


def test_dropped_frames_count_as_passed() -> None:
    p = Playout()
    p.queued(A, 3)
    assert p.dropped(A) == []  # the bound dropped the oldest: the caller is past it
    assert p.played(A) == [Started(R1)]
    p.audio_done(R1)
    assert p.played(A) == [Stopped(R1)]
    assert p.position_ms("item_a") == 60


def test_state_is_bounded() -> None:
    p = Playout()
    for i in range(1000):
        tag = (f"r{i}", f"i{i}")
        p.queued(tag, 2)
        p.played(tag)
        p.clear()
    assert len(p.pending) <= 32 and len(p.item_ms) <= 32 and len(p.refused) <= 32
