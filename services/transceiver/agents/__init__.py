"""The protocols a transceiver speaks to agents, each a sans-IO codec (docs/architecture.md §8).

A call's agent URL names the protocol by its scheme. Each protocol turns what happens in the
call (the caller's decoded audio, its data-channel events, the call's state, its end) into
WebSocket messages for the agent, and the agent's messages into `AgentEvent`s for the call
(audio to play, a barge-in clear, an event for the caller). The WebSocket itself is
`rtc/agent_link.py`'s; the session (`session.py`) connects the two.

Adding an agent kind: a module here with a class that has the `AgentProtocol` methods, and
its scheme in `SCHEMES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from firsthop.services.transceiver.agents.events import AgentEvent, CallInfo, Message
from firsthop.services.transceiver.agents.native import NativeProtocol


class AgentProtocol(Protocol):
    def opening(self) -> list[Message]:
        """What to send as soon as the WebSocket is open."""

    def caller_audio(self, pcm: bytes) -> Message | None:
        """One 20 ms frame of the caller, PCM16 mono 48 kHz."""

    def caller_event(self, data: object) -> Message | None:
        """A JSON value the caller sent on its data channel."""

    def call_state(self, state: str) -> Message | None:
        """The call's connection state changed."""

    def closing(self) -> list[Message]:
        """What to send before hanging up (the call is over)."""

    def on_message(self, message: Message) -> AgentEvent | None:
        """What one message from the agent asks of the call (None: nothing)."""


class AgentUrlError(ValueError):
    pass


@dataclass(frozen=True)
class AgentKind:
    name: str
    ws_url: str  # where the WebSocket goes (the scheme's own prefix removed)
    protocol: Callable[[CallInfo], AgentProtocol]


SCHEMES: dict[str, tuple[str, Callable[[CallInfo], AgentProtocol]]] = {
    "ws://": ("native", NativeProtocol),
}


def agent_kind(url: str) -> AgentKind:
    """Which protocol an agent URL names, and where its WebSocket goes."""
    for prefix, (name, protocol) in SCHEMES.items():
        if url.startswith(prefix):
            return AgentKind(name, url, protocol)
    schemes = ", ".join(SCHEMES)
    raise AgentUrlError(f"agent URL {url[:80]!r} does not start with one of: {schemes}")


__all__ = ["AgentEvent", "AgentKind", "AgentProtocol", "AgentUrlError", "CallInfo", "agent_kind"]
