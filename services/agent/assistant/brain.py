"""The assistant's brain: a few rules from what the caller said to what it answers. Pure.

Strategy: lower-case the transcript, look for key words in order of priority (a greeting, the
time, the date, what it can do, its name, thanks, goodbye), and otherwise say back what it
heard. `now` (a timezone-aware datetime) is passed in, so answers are testable. The session's
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


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z']+", text.lower()))


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
    words = _words(heard)
    if not words:
        return "Sorry, I did not catch that. Could you say it again?"
    if "time" in words or {"clock", "hour"} & words:
        # A short first sentence: the first audio of an answer comes sooner.
        hour, minute, part = _spoken_time(now)
        return f"It is {hour} {minute}. {part.capitalize()}, {now:%H:%M} UTC."
    if {"date", "day", "today"} & words:
        return f"Today is {now:%A}. It is {now:%B} {now.day}, {now.year}."
    if {"help", "can", "do", "able"} & words and {"what", "how", "help"} & words:
        return (
            "I can greet you, tell you the time and the date, and say back what I heard. "
            "Ask me what time it is."
        )
    if "name" in words or {"who"} & words:
        return f"My name is {persona.name}. I am a small offline assistant."
    if {"hello", "hi", "hey", "greet", "morning", "evening", "afternoon"} & words:
        return persona.greeting or f"Hello! I am {persona.name}. How can I help you?"
    if {"thanks", "thank"} & words:
        return "You are welcome."
    if {"bye", "goodbye"} & words:
        return "Goodbye, and have a nice day."
    said = " ".join(heard.split()[:MAX_ECHO_WORDS])
    return f"I heard: {said}. I can tell you the time, or say hello."


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
