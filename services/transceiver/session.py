"""One call on the transceiver, seen from Trio: lifecycle, agent bridge, events.

A `Session` owns an `RtcSession` (aiortc, behind the asyncio boundary) and runs as one task in
the transceiver's sessions nursery, from its answer until it is told to `end` (the decisions
are the `SessionTable`'s: setup and consent timeouts, drain, DELETE; a failed or closed
connection is reported to it through `on_state`):

* the agent bridge streams decoded audio to the agent frame by frame as it arrives, and
  plays the agent's frames into the call from a bounded queue (`output.clear` empties it);
  if the agent is unreachable or goes away the call goes on with silence while the bridge
  reconnects with backoff;
* events: JSON from the caller's data channel goes to the agent, what the agent sends for the
  caller goes to the data channel; both sides hear of the call's state;
* what those look like on the wire is the agent protocol's business (`agents/`, chosen by
  the agent URL's scheme): the bridge here only carries them;
* when it ends it closes the peer connection and always sends `session.end` to the agent.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from opentelemetry.trace import Span

from firsthop.services.transceiver.agents import AgentProtocol, AgentUrlError, CallInfo, agent_kind
from firsthop.services.transceiver.agents.events import ClearAudio, Malformed, PlayAudio, ToCaller
from firsthop.services.transceiver.ice_lite import Credentials
from firsthop.services.transceiver.rtc import (
    AgentLink,
    AgentLinkError,
    Milestone,
    RtcSession,
    SessionCallbacks,
    call_asyncio,
)
from firsthop.shared.address import Address
from firsthop.shared.telemetry import traceparent_of

log = logging.getLogger("firsthop.transceiver.session")

AGENT_CONNECT_TIMEOUT = 5.0
MAX_EVENT_BYTES = 64 * 1024  # a caller's data-channel message
RECONNECT_MIN = 0.2
RECONNECT_MAX = 5.0


@dataclass(eq=False)
class Session:
    session_id: str
    call_id: str
    agent_url: str | None
    region: str
    ingress: list[Address]
    creds: Credentials  # the first ones: the session table owns them from then on
    send: Callable[[bytes, Address], None]
    selected: Callable[[], Address | None]  # the media path the session table chose
    on_state: Callable[[Session, str], None]  # aiortc's connection state, as it changes
    counters: Counter[str]
    traceparent: str | None = None
    span: Span | None = None
    created: float = field(default_factory=time.monotonic)
    milestones: dict[Milestone, float] = field(default_factory=dict)
    state: str = "new"
    ended: trio.Event = field(default_factory=trio.Event)
    end_reason: str | None = None
    rtc: RtcSession = field(init=False)

    def __post_init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._link: AgentLink | None = None
        self._agent: AgentProtocol | None = None
        self.rtc = RtcSession(
            candidates=self.ingress,
            send=self.send,
            callbacks=SessionCallbacks(
                audio=self._audio_in,
                state=self._state_in,
                message=self._message_in,
                selected=self.selected,
                milestone=self._milestone,
                count=self._count,
            ),
        )

    # -- callbacks from the asyncio side (same thread) ---------------------------------------

    def _audio_in(self, pcm: bytes) -> None:
        # Straight onto the agent's socket, frame by frame as it is decoded.
        agent = self._agent
        message = agent.caller_audio(pcm) if agent is not None else None
        if message is None or not self._to_agent(message):
            self.counters["agent_audio_dropped"] += 1

    def _state_in(self, state: str) -> None:
        self.state = state
        self.on_state(self, state)
        agent = self._agent
        message = agent.call_state(state) if agent is not None else None
        if message is None or not self._to_agent(message):
            self.counters["event_dropped_no_agent"] += 1
        self.rtc.send_event(json.dumps({"type": "call.state", "state": state}))

    def _message_in(self, message: str | bytes) -> None:
        """The caller's data channel: JSON text for the agent; anything else is dropped."""
        if isinstance(message, bytes):
            self.counters["event_dropped_binary"] += 1
            return
        if len(message.encode()) > MAX_EVENT_BYTES:
            self.counters["event_dropped_oversize"] += 1
            return
        try:
            data = json.loads(message)
        except (ValueError, RecursionError):
            self.counters["event_dropped_not_json"] += 1
            return
        agent = self._agent
        out = agent.caller_event(data) if agent is not None else None
        if out is None or not self._to_agent(out):
            self.counters["event_dropped_no_agent"] += 1

    def _to_agent(self, message: str | bytes) -> bool:
        link = self._link
        return link is not None and link.send(message)

    def _milestone(self, milestone: Milestone) -> None:
        if milestone not in self.milestones:
            self.milestones[milestone] = time.monotonic() - self.created
            if self.span is not None:
                self.span.add_event(milestone.value)
        if milestone is Milestone.DATACHANNEL_OPEN:
            self.rtc.send_event(json.dumps({"type": "call.state", "state": self.state}))

    def _count(self, name: str) -> None:
        self.counters[name] += 1

    # -- lifecycle -----------------------------------------------------------------------------

    async def answer(self, offer_sdp: str) -> str:
        local = (self.creds.local_ufrag, self.creds.local_pwd)
        return await call_asyncio(self.rtc.answer(offer_sdp, local))

    def end(self, reason: str) -> None:
        if self.end_reason is None:
            self.end_reason = reason
        self.ended.set()

    async def run(self) -> None:
        """The session's whole life; returns once it has ended and is torn down."""
        try:
            async with trio.open_nursery() as nursery:
                if self.agent_url:
                    nursery.start_soon(self._agent_bridge, self.agent_url)
                await self.ended.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await call_asyncio(self.rtc.close())
            self.counters.update(self.rtc.totals())
            if self.span is not None:
                self.span.set_attribute("firsthop.end_reason", self.end_reason or "")
                self.span.end()
            log.info("session %s ended: %s", self.session_id, self.end_reason)

    # -- the agent bridge ------------------------------------------------------------------

    async def _agent_bridge(self, url: str) -> None:
        """Keep the call's agent connected: connect, say hello, carry messages both ways
        until the link or the call ends; on a lost link the call goes on in silence while
        this reconnects with backoff. The call's end is said to the agent, then it hangs up."""
        try:
            kind = agent_kind(url)
        except AgentUrlError as exc:
            self.counters["agent_bad_url"] += 1
            log.error("session %s: %s; the call goes on without an agent", self.session_id, exc)
            return
        traceparent = traceparent_of(self.span) if self.span else self.traceparent
        agent = kind.protocol(CallInfo(self.session_id, self.call_id, traceparent))
        delay = RECONNECT_MIN
        while True:
            closed = trio.Event()
            why: list[str] = []

            def on_closed(reason: str, closed: trio.Event = closed, why: list[str] = why) -> None:
                why.append(reason)
                self._token.run_sync_soon(closed.set)

            try:
                link = AgentLink(
                    kind.ws_url,
                    on_message=lambda message: self._from_agent(agent, message),
                    on_closed=on_closed,
                )
            except AgentLinkError as exc:
                self.counters["agent_bad_url"] += 1
                log.error("session %s: %s; the call goes on without an agent", self.session_id, exc)
                return
            try:
                with trio.fail_after(AGENT_CONNECT_TIMEOUT):
                    await call_asyncio(link.connect())
            except (OSError, AgentLinkError, trio.TooSlowError) as exc:
                link.close()
                self.counters["agent_failures"] += 1
                log.warning("session %s: agent unreachable (%s)", self.session_id, exc)
                await trio.sleep(delay)
                delay = min(RECONNECT_MAX, delay * 2)
                continue
            for message in agent.opening():
                link.send(message)
            self._link, self._agent = link, agent
            self.counters["agent_connects"] += 1
            delay = RECONNECT_MIN
            try:
                await closed.wait()
                self.counters["agent_failures"] += 1
                log.warning("session %s: agent link lost (%s)", self.session_id, why[0])
            finally:
                self._link = self._agent = None
                if link.open:  # the session is ending: say so, then hang up
                    for message in agent.closing():
                        link.send(message)
                link.close()

    def _from_agent(self, agent: AgentProtocol, message: str | bytes) -> None:
        match agent.on_message(message):
            case PlayAudio(pcm):
                self.rtc.output.push(pcm)
            case ClearAudio():
                self.rtc.output.clear()
            case ToCaller(text):
                if not self.rtc.send_event(text):
                    self.counters["event_dropped_no_channel"] += 1
            case Malformed(reason):
                self.counters[reason] += 1
