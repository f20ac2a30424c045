"""The protocols a transceiver speaks to agents, each a sans-IO codec (docs/architecture.md §8).

A call's agent URL names the protocol by its scheme. Each protocol turns what happens in the
call (the caller's decoded audio, its data-channel events, the call's state, its end) into
WebSocket messages for the agent, and the agent's messages into `AgentEvent`s for the call
(audio to play, a barge-in clear, an event for the caller). The WebSocket itself is
`rtc/agent_link.py`'s; the session (`session.py`) connects the two.

Adding an agent kind: a module here with a class that has the `AgentProtocol` methods, and
its scheme in `shared/agent_url.py` and its class in `PROTOCOLS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from firsthop.services.transceiver.agents.events import AgentEvent, CallInfo, Message, Tag
from firsthop.services.transceiver.agents.native import NativeProtocol
from firsthop.services.transceiver.agents.realtime import RealtimeProtocol
from firsthop.services.transceiver.agents.twilio import TwilioProtocol
from firsthop.shared.agent_url import PREFIXES, TLS_SCHEMES, split_agent_url


class AgentProtocol(Protocol):
    hold_events: bool  # events for the caller wait (bounded) until its data channel opens
    call_state_events: bool  # the caller's data channel hears `call.state` from the bridge
    sends_ahead: bool  # the agent sends audio faster than real time: queue it all, longer
    closing_ends_call: bool  # the agent closing its socket hangs up (else: reconnect)

    def opening(self) -> list[Message]:
        """What to send as soon as the WebSocket is open (again, after a reconnect)."""

    def caller_audio(self, pcm: bytes) -> Message | None:
        """One 20 ms frame of the caller, PCM16 mono 48 kHz."""

    def takes_coded(self, codec: str) -> bool:
        """Whether the caller's audio goes to the agent in the call's own codec (`pcmu`,
        `pcma`), as it came: G.711 straight through (then `caller_audio` is not called)."""

    def caller_coded(self, payload: bytes) -> Message | None:
        """One G.711 payload of the caller's, as it came (when `takes_coded`)."""

    def caller_message(self, message: Message) -> list[AgentEvent]:
        """A message the caller sent on its data channel (or a sideband socket)."""

    def call_state(self, state: str) -> Message | None:
        """The call's connection state changed."""

    def dtmf(self, digit: str, duration: float) -> list[AgentEvent]:
        """The caller pressed a key (a phone call's RFC 4733 event)."""

    def closing(self) -> list[Message]:
        """What to send before hanging up (the call is over)."""

    def on_message(self, message: Message) -> list[AgentEvent]:
        """What one message from the agent asks of the call."""

    def played(self, tag: Tag) -> list[AgentEvent]:
        """A tagged frame was played to the caller."""

    def dropped(self, tag: Tag) -> list[AgentEvent]:
        """A tagged frame was dropped by the output queue (its bound)."""

    def link_lost(self) -> list[AgentEvent]:
        """The WebSocket to the agent went away mid-call (it is being reconnected)."""

    def failed(self) -> list[AgentEvent]:
        """The call failed on our side and is ending (`session.py`): what its caller is told
        beyond the ``call.state`` the session sends where `call_state_events`."""


class AgentUrlError(ValueError):
    pass


@dataclass(frozen=True)
class AgentKind:
    name: str
    ws_url: str  # where the WebSocket goes (the scheme's own prefix removed)
    protocol: Callable[[CallInfo], AgentProtocol]


PROTOCOLS: dict[str, Callable[[CallInfo], AgentProtocol]] = {
    "native": NativeProtocol,
    "realtime": RealtimeProtocol,
    "twilio": TwilioProtocol,
}


def agent_kind(url: str) -> AgentKind:
    """Which protocol an agent URL names, and where its WebSocket goes (the schemes are
    `shared/agent_url.py`'s)."""
    split = split_agent_url(url)
    if split is None:
        schemes = ", ".join(PREFIXES)
        raise AgentUrlError(f"agent URL {url[:80]!r} does not start with one of: {schemes}")
    name, ws_url = split
    return AgentKind(name, ws_url, PROTOCOLS[name])


__all__ = [
    "TLS_SCHEMES",
    "AgentEvent",
    "AgentKind",
    "AgentProtocol",
    "AgentUrlError",
    "CallInfo",
    "agent_kind",
]
