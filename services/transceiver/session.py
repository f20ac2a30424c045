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
* events for the caller go to its data channel and to the call's sideband sockets (the
  internal API's `/events` WebSocket, at most `MAX_SIDEBANDS`, each with a bounded queue); a
  protocol that asks (`hold_events`: Realtime, whose `session.created` must come first) has
  them held, bounded, until the channel opens; what a sideband sends is handled as if it came
  on the data channel;
* when it ends it closes the peer connection and always sends `session.end` to the agent.
"""

from __future__ import annotations

import json
import logging
import random
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from opentelemetry.trace import Span, StatusCode

from firsthop.services.transceiver.agents import AgentProtocol, AgentUrlError, CallInfo, agent_kind
from firsthop.services.transceiver.agents.events import (
    AgentEvent,
    ClearAudio,
    Malformed,
    NoiseReduction,
    PlayAudio,
    Tag,
    ToAgent,
    ToCaller,
    ToSender,
)
from firsthop.services.transceiver.held import HeldEvents, utf8_len
from firsthop.services.transceiver.ice_lite import Credentials
from firsthop.services.transceiver.rtc import (
    AgentLink,
    AgentLinkError,
    Milestone,
    PlainRtpSession,
    RtcSession,
    SessionCallbacks,
    call_asyncio,
)
from firsthop.shared.address import Address
from firsthop.shared.ratelimit import TokenBucket
from firsthop.shared.session_config import UNSET, noise_reduction
from firsthop.shared.telemetry import traceparent_of

log = logging.getLogger("firsthop.transceiver.session")

AGENT_CONNECT_TIMEOUT = 5.0
RECONNECT_MIN = 0.2
RECONNECT_MAX = 5.0
# A link must stay open this long before its loss resets the backoff: one the agent closes
# right after opening (its own message limit, an overloaded backend) is a failed attempt.
HEALTHY_AFTER = 10.0
# Where a session can fail (the `session_error_<stage>` counters): a closed set.
STAGES = ("setup", "agent_connect", "agent", "media", "events", "close")
MAX_SIDEBANDS = 4  # sideband sockets per session
SIDEBAND_QUEUE = 256  # events waiting for one sideband socket
SIDEBAND_QUEUE_BYTES = 1 << 20  # and their bytes (an event alone may pass it: an empty queue)
Feed = trio.MemorySendChannel[tuple[str, int]]  # a sideband socket's events: (text, bytes)
AHEAD_FRAMES = 1500  # 30 s of a backend's answer sent ahead, queued to play
# A caller's data-channel events a second (burst): past them, dropped unparsed and unanswered
# (`client_events_rate_limited`). Tiny events at the session's datagram budget cost a core.
CLIENT_EVENT_RATE, CLIENT_EVENT_BURST = 100.0, 200.0
# The media core's counters set on the call's span at its end (`firsthop.media.<name>`).
SPAN_STATS = (
    "rtp_packets_in", "rtp_packets_out", "rtp_bytes_in", "rtp_bytes_out", "rtp_lost",
    "frames_decoded", "frames_repaired", "frames_repaired_fec", "jitter_late",
    "agent_frames_played", "output_dropped_full", "output_dropped_quiet", "srtp_auth_fail",
)  # fmt: skip


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
    ingress_tcp: list[Address] = field(default_factory=list)  # ICE-TCP, advertised passive
    span: Span | None = None
    session_config: dict[str, Any] | None = None  # the caller's Realtime session config
    agent_headers: list[tuple[str, str]] = field(default_factory=list)  # Realtime backends
    agent_tls: ssl.SSLContext | None = None  # for wss:// agents
    end_call: Callable[[Session, str], None] | None = None  # ask the transceiver to end it
    media: str = "webrtc"  # or "rtp": a phone call's plain RTP (`rtc/plain_rtp.py`)
    created: float = field(default_factory=time.monotonic)
    milestones: dict[Milestone, float] = field(default_factory=dict)
    state: str = "new"
    ended: trio.Event = field(default_factory=trio.Event)
    end_reason: str | None = None
    rtc: RtcSession | PlainRtpSession = field(init=False)

    def __post_init__(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._link: AgentLink | None = None
        self._agent: AgentProtocol | None = None
        self._held = HeldEvents()
        self._client_events = TokenBucket(CLIENT_EVENT_RATE, CLIENT_EVENT_BURST, time.monotonic())
        # the sidebands' client events, all of a session's sockets together (waited for)
        self._sideband_events = TokenBucket(CLIENT_EVENT_RATE, CLIENT_EVENT_BURST, time.monotonic())
        self._hold = False
        self._call_state_events = True
        self.failure: str | None = None  # the stage that raised, if one did
        # each sideband socket's feed of events (text, its UTF-8 size) -> the bytes queued
        self.sidebands: dict[Feed, int] = {}
        callbacks = SessionCallbacks(
            audio=self._guard("media", self._audio_in),
            state=self._guard("events", self._state_in),
            message=self._guard("events", self._message_in),
            selected=self.selected,
            milestone=self._guard("events", self._milestone),
            count=self._count,
            failed=self.fail,
            dtmf=self._guard("events", self._dtmf_in),
            coded_audio=self._guard("media", self._coded_in),
        )
        if self.media == "rtp":
            self.rtc = PlainRtpSession(self.send, callbacks, candidates=self.ingress)
        else:
            self.rtc = RtcSession(
                self.send, callbacks, candidates=self.ingress, tcp_candidates=self.ingress_tcp
            )
        asked = noise_reduction(self.session_config)  # (checked when the call was created)
        if asked not in (None, UNSET):
            self._noise_reduction(asked)

    # -- failure: whatever one call raises ends that call only ----------------------------------

    def _guard(self, stage: str, handler: Callable[..., None]) -> Callable[..., None]:
        """`handler` as called from aiortc's or the agent link's callbacks, where an
        exception would otherwise end up in the loop's handler (and the call go on broken)
        or in a task of aiortc's (and its media stop)."""

        def guarded(*args: Any) -> None:
            try:
                handler(*args)
            except Exception as exc:
                self.fail(stage, exc)

        return guarded

    def fail(self, stage: str, exc: BaseException) -> None:
        """Something raised while handling this call (a bug, or an input no check foresaw):
        logged and counted once, the caller told, and the call ended (`session_error`).
        Nothing of it reaches the transceiver's other calls."""
        if self.failure is not None:
            return
        self.failure = stage
        self.counters["session_errors"] += 1
        self.counters[f"session_error_{stage if stage in STAGES else 'other'}"] += 1
        log.error("session %s failed (%s): %r", self.session_id, stage, exc, exc_info=exc)
        if stage == "close" or self.ended.is_set():
            return  # already on its way out; only the teardown is left
        try:
            agent = self._agent
            for e in agent.failed() if agent is not None else []:
                if isinstance(e, ToCaller):
                    self._to_caller(e.text)
            if self._call_state_events:
                failed = {"type": "call.state", "state": "failed", "reason": "session_error"}
                self.rtc.send_event(json.dumps(failed))
        except Exception:
            log.exception("session %s: telling the caller failed too", self.session_id)
        if self.end_call is not None:
            self.end_call(self, "session_error")
        self.end("session_error")

    # -- callbacks from the asyncio side (same thread) ---------------------------------------

    def _noise_reduction(self, kind: str | None) -> None:
        if not self.rtc.set_noise_reduction(kind):
            log.warning(
                "session %s: noise reduction asked, unavailable here (not built or no pyrnnoise)",
                self.session_id,
            )
            self.counters["noise_reduction_unavailable"] += 1
        elif kind is not None:
            self.counters["noise_reduction_calls"] += 1

    def _straight_through(self, agent: AgentProtocol) -> bool:
        """A phone call's G.711 goes to this agent as it came (`takes_coded`)."""
        media = self.rtc.media
        return media is not None and agent.takes_coded(media.params.codec)

    def _coded_in(self, payload: bytes) -> None:
        agent, link = self._agent, self._link
        if agent is None or link is None or not link.open or not self._straight_through(agent):
            return  # (the decoded frames go, `_audio_in`)
        message = agent.caller_coded(payload)
        if message is not None and not self._to_agent(message):
            self.counters["agent_audio_dropped"] += 1
        self.counters["agent_audio_straight_through"] += 1

    def _audio_in(self, pcm: bytes) -> None:
        # Straight onto the agent's socket, frame by frame as it is decoded.
        agent, link = self._agent, self._link
        if agent is None or link is None or not link.open:
            self.counters["agent_audio_dropped"] += 1
            return
        if self.media == "rtp" and self._straight_through(agent):
            return  # (its G.711 went as it came, `_coded_in`)
        message = agent.caller_audio(pcm)
        if message is not None and not self._to_agent(message):
            self.counters["agent_audio_dropped"] += 1

    def _dtmf_in(self, digit: str, duration: float) -> None:
        """A key the caller pressed (RFC 4733): to the agent, in its protocol's words."""
        agent = self._agent
        if agent is None:
            self.counters["dtmf_dropped_no_agent"] += 1
            return
        self.counters["dtmf_to_agent"] += 1
        self._apply(agent, agent.dtmf(digit, duration), None)

    def _state_in(self, state: str) -> None:
        self.state = state
        self.on_state(self, state)
        agent = self._agent
        message = agent.call_state(state) if agent is not None else None
        if message is not None and not self._to_agent(message):
            self.counters["event_dropped_no_agent"] += 1
        if self._call_state_events:
            self.rtc.send_event(json.dumps({"type": "call.state", "state": state}))

    def _message_in(self, message: str | bytes) -> None:
        """The caller's data channel: the agent protocol decides, within the event budget."""
        if not self._client_events.take(time.monotonic()):
            self.counters["client_events_rate_limited"] += 1
            return
        self.client_message(message)

    def client_message(self, message: str | bytes, sideband: Feed | None = None) -> None:
        """A client event from the data channel, or from the `sideband` socket whose feed
        this is: handled alike; a reply to it (an error) goes back to where it came from."""
        agent = self._agent
        if agent is None:
            self.counters["event_dropped_no_agent"] += 1
            return
        try:
            self._apply(agent, agent.caller_message(message), sideband)
        except Exception as exc:
            self.fail("events", exc)

    def _to_caller(self, text: str) -> None:
        """A server event: to every sideband socket, and to the data channel."""
        size = utf8_len(text)
        for sideband in self.sidebands:
            self._to_sideband(sideband, text, size)
        self._to_channel(text, size)

    def _to_sideband(self, sideband: Feed, text: str, size: int | None = None) -> None:
        """Queued for one socket, within its bytes (an event alone may pass them)."""
        size = utf8_len(text) if size is None else size
        queued = self.sidebands.get(sideband, 0)
        if queued and queued + size > SIDEBAND_QUEUE_BYTES:
            self.counters["events_dropped_sideband"] += 1
            return
        try:
            sideband.send_nowait((text, size))
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self.counters["events_dropped_sideband"] += 1
            return
        if sideband in self.sidebands:
            self.sidebands[sideband] = queued + size

    def sideband_took(self, sideband: Feed, size: int) -> None:
        """The socket's task took an event of `size` bytes off `sideband`'s queue."""
        if sideband in self.sidebands:
            self.sidebands[sideband] -= size

    async def sideband_turn(self) -> None:
        """Wait for the session's sideband event budget (backpressure: the socket is not
        read meanwhile, so its sender slows down; nothing is dropped)."""
        while (wait := self._sideband_events.wait(time.monotonic())) > 0:
            self.counters["sideband_events_paced"] += 1
            await trio.sleep(wait)

    def _to_channel(self, text: str, size: int | None = None) -> None:
        """To the data channel (held until it opens if the protocol asks, bounded; dropped
        and counted otherwise). `size`: its UTF-8 bytes, if known."""
        if self._held:
            self._held.flush(self.rtc.send_event)
        if not self._held and self.rtc.send_event(text):
            return
        if not self._hold:
            self.counters["event_dropped_no_channel"] += 1
        elif not self._held.hold(text, size):
            self.counters["events_dropped_held"] += 1

    def open_sideband(self) -> tuple[Feed, trio.MemoryReceiveChannel[tuple[str, int]]] | None:
        """A new sideband socket's feed of server events (None: the session has enough)."""
        if len(self.sidebands) >= MAX_SIDEBANDS or self.ended.is_set():
            return None
        send, receive = trio.open_memory_channel[tuple[str, int]](SIDEBAND_QUEUE)
        self.sidebands[send] = 0
        return send, receive

    def close_sideband(self, send: Feed) -> None:
        self.sidebands.pop(send, None)
        send.close()

    def _to_agent(self, message: str | bytes) -> bool:
        link = self._link
        return link is not None and link.send(message)

    def _milestone(self, milestone: Milestone) -> None:
        if milestone not in self.milestones:
            self.milestones[milestone] = time.monotonic() - self.created
            if self.span is not None:
                self.span.add_event(milestone.value)
        if milestone is Milestone.DATACHANNEL_OPEN:
            self._held.flush(self.rtc.send_event)
            if self._call_state_events:
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
        """The session's whole life; returns once it has ended and is torn down. It never
        raises (but Trio's cancellation): a failure ends this call, nothing else."""
        try:
            async with trio.open_nursery() as nursery:
                if self.agent_url:
                    nursery.start_soon(self._agent_bridge, self.agent_url)
                await self.ended.wait()
                nursery.cancel_scope.cancel()
        except Exception as exc:  # the bridge raised something it does not handle
            self.fail("agent", exc)
        finally:
            with trio.CancelScope(shield=True):
                await self._teardown()

    async def _teardown(self) -> None:
        for send in self.sidebands:
            send.close()  # their sockets close: the session is over
        self.sidebands.clear()
        try:
            with trio.move_on_after(5):
                await call_asyncio(self.rtc.close())
            totals = self.rtc.totals()
            self.counters.update(totals)
            if self.span is not None:  # the call's media, on its span
                for name in SPAN_STATS:
                    self.span.set_attribute(f"firsthop.media.{name}", totals.get(name, 0))
                for name, value in self.rtc.quality().items():
                    self.span.set_attribute(f"firsthop.media.{name}", value)
        except Exception as exc:
            self.fail("close", exc)
        if self.span is not None:
            if self.failure is not None:
                self.span.set_status(StatusCode.ERROR, f"failed in {self.failure}")
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
        media = self.rtc.media
        call = CallInfo(
            self.session_id,
            self.call_id,
            traceparent,
            self.session_config,
            self.region,
            codec=media.params.codec if media is not None else "opus",
        )
        agent = kind.protocol(call)
        self._agent = agent
        # (a phone call has no data channel to hold events for: the sidebands hear them)
        self._hold = agent.hold_events and self.media == "webrtc"
        self._call_state_events = agent.call_state_events
        if agent.sends_ahead:
            self.rtc.configure_output(AHEAD_FRAMES, drain_quiet=False)
        self.rtc.on_played = lambda tag: self._played(agent, tag)
        self.rtc.on_dropped = lambda tag: self._dropped(agent, tag)
        realtime = kind.name == "realtime"
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
                    on_message=self._guard("agent", lambda m: self._from_agent(agent, m)),
                    on_closed=on_closed,
                    headers=self.agent_headers if realtime else [],
                    tls=self.agent_tls,
                )
            except AgentLinkError as exc:
                self.counters["agent_bad_url"] += 1
                log.error("session %s: %s; the call goes on without an agent", self.session_id, exc)
                return
            # The link is the session's from now on (it takes nothing until it is open): what
            # the agent says the moment it is open may need an answer.
            self._link = link
            try:
                with trio.fail_after(AGENT_CONNECT_TIMEOUT):
                    await call_asyncio(link.connect(first=agent.opening()))
            except (OSError, AgentLinkError, trio.TooSlowError) as exc:
                self._link = None
                link.close()
                self.counters["agent_failures"] += 1
                log.warning("session %s: agent unreachable (%s)", self.session_id, exc)
                delay = await self._back_off(delay)
                continue
            except Exception as exc:  # not the network's doing: this call's failure
                self._link = None
                link.close()
                self.fail("agent_connect", exc)
                return
            except BaseException:  # the call is ending, perhaps just as the link opened
                self._link = None
                self._hang_up(agent, link)
                raise
            self.counters["agent_connects"] += 1
            opened = trio.current_time()
            try:
                await closed.wait()
                self._link = None
                if trio.current_time() - opened >= HEALTHY_AFTER:
                    delay = RECONNECT_MIN  # it was up: a new outage starts from the bottom
                else:
                    self.counters["agent_links_short"] += 1
                self._apply(agent, agent.link_lost())
                if agent.closing_ends_call:  # Media Streams: the stream is the call
                    # The bot hung up, or the link failed (over-size message, too slow, ...).
                    reason = "agent_closed" if link.hung_up else "agent_lost"
                    self.counters["agent_hangups" if link.hung_up else "agent_failures"] += 1
                    log.info(
                        "session %s: the agent link ended the call (%s)", self.session_id, why[0]
                    )
                    if self.end_call is not None:
                        self.end_call(self, reason)
                    return
                self.counters["agent_failures"] += 1
                log.warning("session %s: agent link lost (%s)", self.session_id, why[0])
            finally:
                self._link = None
                self._hang_up(agent, link)
            delay = await self._back_off(delay)

    def _hang_up(self, agent: AgentProtocol, link: AgentLink) -> None:
        """The link is done with: if it is open, the agent is told the session is ending (in
        its protocol's words), then the link is closed."""
        if link.open:
            try:
                for message in agent.closing():
                    link.send(message)
            except Exception as exc:
                self.fail("close", exc)
        link.close()

    async def _back_off(self, delay: float) -> float:
        """Wait before the next attempt (`delay`, less up to half of it at random, so the
        calls of a restarted backend do not all come back at once); the next delay."""
        await trio.sleep(delay * random.uniform(0.5, 1.0))
        return min(RECONNECT_MAX, delay * 2)

    def _from_agent(self, agent: AgentProtocol, message: str | bytes) -> None:
        self._apply(agent, agent.on_message(message))

    def _played(self, agent: AgentProtocol, tag: object) -> None:
        """The media core played a tagged frame (on the loop thread, from the media clock)."""
        self._tagged(agent.played, tag)

    def _dropped(self, agent: AgentProtocol, tag: object) -> None:
        """A tagged frame of the agent's will never play (the output queue's bound)."""
        self._tagged(agent.dropped, tag)

    def _tagged(self, report: Callable[[Tag], list[AgentEvent]], tag: object) -> None:
        if isinstance(tag, tuple):
            agent = self._agent
            try:
                if agent is not None:
                    self._apply(agent, report(tag))
            except Exception as exc:
                self.fail("media", exc)

    def _apply(
        self,
        agent: AgentProtocol,
        events: list[AgentEvent],
        sideband: Feed | None = None,
    ) -> None:
        """Carry out what the agent protocol asks of the call (`sideband`: the socket whose
        client event this answers, if it was not the data channel's)."""
        for e in events:
            match e:
                case PlayAudio(pcm, tag, True):
                    self.rtc.push_coded(pcm, tag)  # G.711 straight through
                case PlayAudio(pcm, tag):
                    self.rtc.push_audio(pcm, tag)  # (what it drops: `_dropped`)
                case NoiseReduction(kind):
                    self._noise_reduction(kind)
                case ClearAudio():
                    self.rtc.clear_audio()
                    self.counters["output_cleared"] += 1  # barge-ins, mostly
                case ToCaller(text):
                    self._to_caller(text)
                case ToSender(text) if sideband is not None:
                    self._to_sideband(sideband, text)
                case ToSender(text):
                    self._to_channel(text)
                case ToAgent(message):
                    if not self._to_agent(message):
                        self.counters["event_dropped_no_agent"] += 1
                case Malformed(reason):
                    self.counters[reason] += 1
