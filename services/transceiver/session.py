"""One call on the transceiver, seen from Trio: lifecycle, agent bridge, events.

A `Session` owns an `RtcSession` (aiortc, behind the asyncio boundary) and runs as one task in
the transceiver's sessions nursery, from its answer until it is told to `end` (the decisions
are the `SessionTable`'s: setup and consent timeouts, drain, DELETE; a failed or closed
connection is reported to it through `on_state`):

* the agent bridge streams decoded audio to the agent frame by frame as it arrives, and
  plays the agent's frames into the call from a bounded queue (`output.clear` empties it);
  if the agent is unreachable or goes away the call goes on with silence while the bridge
  reconnects with backoff;
* events: JSON from the caller's data channel goes to the agent as `client.event`, the
  agent's `agent.event` goes to the caller; both sides get `call.state`;
* when it ends it closes the peer connection and always sends `session.end` to the agent.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from opentelemetry.trace import Span

from services.transceiver.ice_lite import Credentials
from services.transceiver.rtc import (
    AgentLink,
    AgentLinkError,
    RtcSession,
    SessionCallbacks,
    call_asyncio,
)
from shared.telemetry import traceparent_of

log = logging.getLogger("firsthop.transceiver.session")

Address = tuple[str, int]

AGENT_CONNECT_TIMEOUT = 5.0
MAX_EVENT_BYTES = 64 * 1024
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
    milestones: dict[str, float] = field(default_factory=dict)
    state: str = "new"
    ended: trio.Event = field(default_factory=trio.Event)
    end_reason: str | None = None
    rtc: RtcSession = field(init=False)

    def __post_init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._link: AgentLink | None = None
        self.rtc = RtcSession(
            ufrag=self.creds.local_ufrag,
            pwd=self.creds.local_pwd,
            candidates=self.ingress,
            send=self.send,
            callbacks=SessionCallbacks(
                audio=self._audio_in,
                state=self._state_in,
                event=self._event_in,
                selected=self.selected,
                milestone=self._milestone,
                count=self._count,
            ),
        )

    # -- callbacks from the asyncio side (same thread) ---------------------------------------

    def _audio_in(self, pcm: bytes) -> None:
        # Straight onto the agent's socket, frame by frame as it is decoded.
        link = self._link
        if link is None or not link.send_bytes(pcm):
            self.counters["agent_audio_dropped"] += 1

    def _state_in(self, state: str) -> None:
        self.state = state
        self.on_state(self, state)
        self._event_to_agent({"type": "call.state", "state": state})
        self.rtc.send_event(json.dumps({"type": "call.state", "state": state}))

    def _event_in(self, text: str) -> None:
        if len(text.encode()) > MAX_EVENT_BYTES:
            self.counters["event_dropped_oversize"] += 1
            return
        try:
            data = json.loads(text)
        except ValueError:
            self.counters["event_dropped_not_json"] += 1
            return
        self._event_to_agent({"type": "client.event", "data": data})

    def _event_to_agent(self, message: dict[str, Any]) -> None:
        link = self._link
        if link is None or not link.send_text(json.dumps(message)):
            self.counters["event_dropped_no_agent"] += 1

    def _milestone(self, name: str) -> None:
        if name not in self.milestones:
            self.milestones[name] = time.monotonic() - self.created
            if self.span is not None:
                self.span.add_event(name)
        if name == "datachannel_open":
            self.rtc.send_event(json.dumps({"type": "call.state", "state": self.state}))

    def _count(self, name: str) -> None:
        self.counters[name] += 1

    # -- lifecycle -----------------------------------------------------------------------------

    async def answer(self, offer_sdp: str) -> str:
        return await call_asyncio(self.rtc.answer(offer_sdp))

    def end(self, reason: str) -> None:
        if self.end_reason is None:
            self.end_reason = reason
        self.ended.set()

    async def run(self) -> None:
        """The session's whole life; returns once it has ended and is torn down."""
        try:
            async with trio.open_nursery() as nursery:
                if self.agent_url:
                    nursery.start_soon(self._agent_bridge)
                await self.ended.wait()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await call_asyncio(self.rtc.close())
            if self.span is not None:
                self.span.set_attribute("firsthop.end_reason", self.end_reason or "")
                self.span.end()
            log.info("session %s ended: %s", self.session_id, self.end_reason)

    # -- the agent bridge ------------------------------------------------------------------

    async def _agent_bridge(self) -> None:
        assert self.agent_url is not None
        delay = RECONNECT_MIN
        start = {
            "type": "session.start",
            "session_id": self.session_id,
            "call_id": self.call_id,
            "sample_rate": 48000,
            "frame_ms": 20,
            "traceparent": traceparent_of(self.span) if self.span else self.traceparent,
        }
        while True:
            closed = trio.Event()
            why: list[str] = []

            def on_closed(reason: str, closed: trio.Event = closed, why: list[str] = why) -> None:
                why.append(reason)
                self._token.run_sync_soon(closed.set)

            try:
                link = AgentLink(
                    self.agent_url,
                    on_binary=self.rtc.output.push,
                    on_text=self._from_agent,
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
                # The call goes on with silence while we reconnect.
                await trio.sleep(delay)
                delay = min(RECONNECT_MAX, delay * 2)
                continue
            link.send_text(json.dumps(start))
            self._link = link
            self.counters["agent_connects"] += 1
            delay = RECONNECT_MIN
            try:
                await closed.wait()
                self.counters["agent_failures"] += 1
                log.warning("session %s: agent link lost (%s)", self.session_id, why[0])
            finally:
                self._link = None
                if link.open:  # the session is ending: say so, then hang up
                    link.send_text(json.dumps({"type": "session.end"}))
                link.close()

    def _from_agent(self, text: str) -> None:
        try:
            msg = json.loads(text)
        except ValueError:
            self.counters["agent_bad_message"] += 1
            return
        if not isinstance(msg, dict):
            self.counters["agent_bad_message"] += 1
            return
        kind = msg.get("type")
        if kind == "output.clear":
            self.rtc.output.clear()
        elif kind == "agent.event":
            event = json.dumps(msg.get("data"))
            if len(event) > MAX_EVENT_BYTES:
                self.counters["event_dropped_oversize"] += 1
            elif not self.rtc.send_event(event):
                self.counters["event_dropped_no_channel"] += 1
