"""The assistant's brain: a few rules from what the caller said to what it answers. Pure.

Strategy: lower-case the transcript and look for what was asked, phrase by phrase, in order
of priority (the time, the date, what it can do, its name; a short greeting, thanks or goodbye);
anything else is answered honestly: it says what it heard and that it cannot help with it.
`now` (a timezone-aware datetime) is passed in, so answers are testable. The session's
`instructions` may name the assistant ("your name is Ada", "you are Ada") and give a greeting
("greet the user with: ..."); nothing else in them is honoured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

DEFAULT_NAME = "firsthop"
MAX_ECHO_WORDS = 30  # what "I heard" repeats at most
LONG_CLAUSE = 40  # characters: a longer sentence is synthesized clause by clause

_NAME = re.compile(r"\b(?i:your name is|you are called|you are|call yourself)\s+([A-Z][\w-]{0,30})")
_GREETING = re.compile(r"\bgreet(?: the user)? with[:\s]+[\"“]?([^\"”\n]{1,200})", re.IGNORECASE)


@dataclass(frozen=True)
class Persona:
    name: str = DEFAULT_NAME
    greeting: str | None = None

    @classmethod
    def from_instructions(cls, instructions: str | None) -> Persona:
        if not instructions:
            return cls()
        name = _NAME.search(instructions)
        greeting = _GREETING.search(instructions)
        return cls(
            name=name.group(1) if name else DEFAULT_NAME,
            greeting=greeting.group(1).strip() if greeting else None,
        )


def _plain(text: str) -> str:
    """Lower-case words and apostrophes only, single-spaced: what the rules read."""
    return " ".join(re.findall(r"[a-z0-9']+", text.lower()))


def _rule(*phrases: str) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(phrases) + r")\b")


# A rule answers only what was asked of it: with open-vocabulary recognition, a key word
# alone ("today" in "what is the weather like today") is not the question.
_TIME = _rule("what time", "the time", "time is it", "what's the time", "clock", "what hour")
_DATE = _rule("what day", "which day", "the date", "what's the date", "today's date", "date today")
_ABILITIES = _rule(
    "what can you do", "what can you", "how can you help", "what do you do", "what are you able"
)
_ASKS_NAME = _rule("your name", "who are you", "who is this", "who am i talking to")
_HOW = _rule("how are you", "how's it going", "how are things")
_GREETS = _rule("hello", "hi", "hey", "good morning", "good afternoon", "good evening", "greet")
_THANKS = _rule("thank you", "thanks")
_BYE = _rule("bye", "goodbye", "see you")
SHORT = 5  # words: a greeting, thanks or goodbye is short; a longer sentence asks something


def _spoken_time(now: datetime) -> tuple[int, str, str]:
    """(hour on a 12-hour clock, the minutes as said, the part of the day)."""
    part = "in the morning" if now.hour < 12 else "in the afternoon"
    if now.hour >= 18:
        part = "in the evening"
    if now.minute == 0:
        minute = "o'clock"
    else:
        minute = f"oh {now.minute}" if now.minute < 10 else str(now.minute)
    return now.hour % 12 or 12, minute, part


def answer(heard: str, now: datetime, persona: Persona | None = None) -> str:
    """What the assistant says to `heard` (a transcript or the response's instructions)."""
    persona = persona or Persona()
    text = _plain(heard)
    if not text:
        return "Sorry, I did not catch that. Could you say it again?"
    short = len(text.split()) <= SHORT
    if _TIME.search(text):
        # A short first sentence: the first audio of an answer comes sooner.
        hour, minute, part = _spoken_time(now)
        return f"It is {hour} {minute}. {part.capitalize()}, {now:%H:%M} UTC."
    if _DATE.search(text):
        return f"Today is {now:%A}. It is {now:%B} {now.day}, {now.year}."
    if _ABILITIES.search(text):
        return (
            "I can greet you, tell you the time and the date, and say back what I heard. "
            "Ask me what time it is."
        )
    if _ASKS_NAME.search(text):
        return f"My name is {persona.name}. I am a small offline assistant."
    if _HOW.search(text):
        return "I am fine, thank you. How can I help you?"
    if short and _GREETS.search(text):
        return persona.greeting or f"Hello! I am {persona.name}. How can I help you?"
    if short and _THANKS.search(text):
        return "You are welcome."
    if short and _BYE.search(text):
        return "Goodbye, and have a nice day."
    said = " ".join(heard.split()[:MAX_ECHO_WORDS]).rstrip(".?!,;: ")
    return (
        f"I heard: {said}. I cannot help with that, I am a small offline assistant. "
        "I can tell you the time and the date."
    )


def sentences(text: str) -> list[str]:
    """Split an answer where synthesis can start a new chunk: after . ! ? and, in a sentence
    longer than `LONG_CLAUSE` characters, after its commas too (the first audio comes sooner)."""
    out: list[str] = []
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        sentence = sentence.strip()
        if len(sentence) > LONG_CLAUSE:
            out += [c.strip() for c in re.split(r"(?<=,)\s+", sentence)]
        elif sentence:
            out.append(sentence)
    return [s for s in out if s]
