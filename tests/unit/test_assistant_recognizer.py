"""The Whisper recognizer's pure parts: the encoder's short window and the repeat cut."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from firsthop.services.agent.assistant.recognizer import (
    ASR_RATE,
    WINDOW_FRAMES,
    deloop,
    window_frames,
    words_of,
)


def test_a_turn_gets_its_length_and_two_seconds_in_whole_seconds() -> None:
    assert window_frames(0) == 200
    assert window_frames(ASR_RATE) == 300  # 1 s of speech
    assert window_frames(ASR_RATE + ASR_RATE // 100) == 400  # and one frame more
    assert window_frames(int(2.5 * ASR_RATE)) == 500
    assert window_frames(28 * ASR_RATE) == WINDOW_FRAMES  # a whole window: faster-whisper's


def test_a_repeat_of_the_beginning_is_cut() -> None:
    assert deloop("What time is it? What time is it") == "What time is it?"
    assert deloop("Hello there. Hello there. Hello there") == "Hello there."
    assert deloop("What time is it? What time is it? What time") == "What time is it?"
    assert deloop("Where's the station? Where's the station? Where") == "Where's the station?"
    assert deloop("Can you book a table for two tonight? Can you") == (
        "Can you book a table for two tonight?"
    )
    assert deloop("the package should arrive next week, the package should") == (
        "the package should arrive next week,"
    )


def test_what_is_not_a_repeat_stays() -> None:
    for text in (
        "What time is it?",
        "No, no, no.",  # one word is not a sentence said again
        "I said yes. Yes I did.",
        "Well, well done.",
        "Thank you, thank you very much.",
        "Hello there. Hello there, what time is it?",
        "What time is it? What time is it in Tokyo?",
        "",
    ):
        assert deloop(text) == text


@given(st.text(max_size=200))
def test_deloop_only_ever_cuts(text: str) -> None:
    cut = deloop(text)
    assert text.startswith(cut)
    assert words_of(cut) == words_of(text)[: len(words_of(cut))]
