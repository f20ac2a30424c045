"""What agent protocols exchange with a call: messages, and the events an agent causes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Message = str | bytes  # one WebSocket message: text, or binary
Tag = tuple[str, str]  # a frame's (response_id, item_id): whose audio it is (Realtime)


@dataclass(frozen=True, slots=True)
class CallInfo:
    session_id: str
    call_id: str
    traceparent: str | None
    session: dict[str, Any] | None = None  # the caller's Realtime session config, if any
    region: str = ""  # the transceiver's region the call is placed in
    codec: str = "opus"  # the call's: a phone call's may be pcmu or pcma


@dataclass(frozen=True, slots=True)
class PlayAudio:
    """A 20 ms frame to play to the caller, PCM16 mono 48 kHz (paced by the transceiver);
    a tagged frame is reported back to the protocol when it is played or dropped."""

    pcm: bytes
    tag: Tag | None = None
    coded: bool = False  # `pcm` is 20 ms in the call's own codec (G.711 straight through)


@dataclass(frozen=True, slots=True)
class ClearAudio:
    """Barge-in: drop what is queued to play."""


@dataclass(frozen=True, slots=True)
class NoiseReduction:
    """RNNoise on the caller's audio before the agent hears it (`near_field`/`far_field`),
    or off (None): the session asked."""

    kind: str | None


@dataclass(frozen=True, slots=True)
class ToCaller:
    """JSON text for the caller's data channel (and the call's sideband sockets)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToSender:
    """JSON text for whoever sent the client event being answered, and no one else (an
    `error` for an invalid event: the data channel's, or that one sideband socket's)."""

    text: str


@dataclass(frozen=True, slots=True)
class ToAgent:
    """A message for the agent (a reply to the caller's event, a truncate, ...)."""

    message: Message


@dataclass(frozen=True, slots=True)
class Malformed:
    """A message the protocol could not use, or dropped; `reason` is the counter."""

    reason: str


AgentEvent = PlayAudio | ClearAudio | NoiseReduction | ToCaller | ToSender | ToAgent | Malformed
