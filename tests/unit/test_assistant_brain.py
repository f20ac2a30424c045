"""The assistant's rule-based brain: what it answers, with the time passed in."""

from __future__ import annotations

from datetime import UTC, datetime

from firsthop.services.agent.assistant.brain import Persona, answer, sentences

MORNING = datetime(2026, 12, 1, 10, 32, tzinfo=UTC)
EVENING = datetime(2026, 12, 1, 19, 5, tzinfo=UTC)


def test_it_tells_the_time() -> None:
    assert answer("what time is it", MORNING) == "It is 10 32. In the morning, 10:32 UTC."
    assert answer("what time", EVENING) == "It is 7 oh 5. In the evening, 19:05 UTC."
    assert answer("the time", EVENING.replace(minute=0)).startswith("It is 7 o'clock.")


def test_it_greets_says_what_it_can_do_and_its_name() -> None:
    assert answer("hello there", MORNING).startswith("Hello")
    assert "time" in answer("what can you do", MORNING)
    assert "firsthop" in answer("what is your name", MORNING)
    assert answer("what day is it today", MORNING) == "Today is Tuesday. It is December 1, 2026."


def test_otherwise_it_says_what_it_heard_and_that_it_cannot_help() -> None:
    assert answer("the weather is nice", MORNING).startswith("I heard: the weather is nice.")
    booked = answer("Can you book a table for two tonight?", MORNING)
    assert booked.startswith("I heard: Can you book a table for two tonight. I cannot help")
    assert "did not catch" in answer("", MORNING)


def test_a_key_word_alone_is_not_the_question() -> None:
    # open speech: "today", "can", "do", "hi" inside a sentence ask nothing of the rules
    for heard in (
        "What is the weather like today?",
        "Can you help me find my keys?",
        "I think this is a good idea.",
        "Thank you for the report, please send the slides by Friday.",
    ):
        assert answer(heard, MORNING).startswith("I heard:"), heard
    assert answer("What's the time?", MORNING).startswith("It is 10 32.")
    assert answer("Hi!", MORNING).startswith("Hello")
    assert answer("How are you?", MORNING).startswith("I am fine")


def test_instructions_set_its_name_and_greeting() -> None:
    persona = Persona.from_instructions("You are Ada. Greet the user with: Welcome to Ada's.")
    assert persona.name == "Ada"
    assert answer("hi", MORNING, persona) == "Welcome to Ada's."
    assert "Ada" in answer("who are you", MORNING, persona)
    assert Persona.from_instructions("be helpful and brief") == Persona()


def test_sentences_split_where_synthesis_can_start_a_chunk() -> None:
    assert sentences("It is 10 32. That is 10:32 UTC.") == ["It is 10 32.", "That is 10:32 UTC."]
    assert sentences("  ") == []
    assert sentences("I can greet you, tell you the time and the date, and more. Ask me.") == [
        "I can greet you,",
        "tell you the time and the date,",
        "and more.",
        "Ask me.",
    ]
