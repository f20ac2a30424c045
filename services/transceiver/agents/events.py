"""What agent protocols exchange with a call: messages, and the events an agent causes."""

from __future__ import annotations

from dataclasses import dataclass

Message = str | bytes  # one WebSocket message: text, or binary


@dataclass(frozen=True, slots=True)
class CallInfo:
    session_id: str
    call_id: str
    traceparent: str | None


@dataclass(frozen=True, slots=True)
class PlayAudio:
    """A 20 ms frame to play to the caller, PCM16 mono 48 kHz (paced by the transceiver)."""

    pcm: bytes


@dataclass(frozen=True, slots=True)
class ClearAudio:
    """Barge-in: drop what is queued to play."""


@dataclass(frozen=True, slots=True)
class ToCaller:
    """JSON text for the caller's data channel."""

    text: str


@dataclass(frozen=True, slots=True)
class Malformed:
    """A message the protocol could not use; `reason` is the counter."""

    reason: str


AgentEvent = PlayAudio | ClearAudio | ToCaller | Malformed
