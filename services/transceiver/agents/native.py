"""firsthop's native agent protocol (docs/architecture.md §8), sans-IO.

Text frames are JSON control messages, binary frames are audio: PCM16 little-endian, mono,
48 kHz, 20 ms (960 samples, 1920 bytes) per frame, both ways.

* to the agent: `session.start` (session_id, call_id, sample_rate, frame_ms, traceparent),
  the caller's audio frames, `client.event` (the caller's data-channel JSON), `call.state`,
  `session.end`;
* from the caller's data channel: JSON text, over 64 KiB, not JSON or binary is dropped and
  counted (`event_dropped_*`);
* from the agent: audio frames to play, `output.clear` (barge-in), `agent.event` (its `data`
  goes to the caller's data channel, at most `MAX_EVENT_BYTES`). Anything else is ignored;
  what is not JSON, not an object, or too big is `Malformed`.
"""

from __future__ import annotations

import json

from firsthop.services.transceiver.agents.events import (
    AgentEvent,
    CallInfo,
    ClearAudio,
    Malformed,
    Message,
    PlayAudio,
    Tag,
    ToAgent,
    ToCaller,
)
from firsthop.services.transceiver.media.frames import CALL_RATE

SAMPLE_RATE = CALL_RATE
FRAME_MS = 20
MAX_EVENT_BYTES = 64 * 1024  # an event for the caller's data channel, or from it


class NativeProtocol:
    hold_events = False  # an event for a caller with no open data channel is dropped
    call_state_events = True  # the caller's channel hears the call's state
    sends_ahead = False  # frames come at real time: the output queue drains a backlog
    closing_ends_call = False  # a lost link is reconnected; the call goes on

    def __init__(self, call: CallInfo) -> None:
        self.call = call

    def opening(self) -> list[Message]:
        start = {
            "type": "session.start",
            "session_id": self.call.session_id,
            "call_id": self.call.call_id,
            "sample_rate": SAMPLE_RATE,
            "frame_ms": FRAME_MS,
            "traceparent": self.call.traceparent,
        }
        return [json.dumps(start)]

    def caller_audio(self, pcm: bytes) -> Message | None:
        return pcm

    def caller_message(self, message: Message) -> list[AgentEvent]:
        if isinstance(message, bytes):
            return [Malformed("event_dropped_binary")]
        if len(message.encode()) > MAX_EVENT_BYTES:
            return [Malformed("event_dropped_oversize")]
        try:
            data = json.loads(message)
            # (one level deeper than it came: a nesting that parsed may not encode)
            return [ToAgent(json.dumps({"type": "client.event", "data": data}))]
        except (ValueError, RecursionError):
            return [Malformed("event_dropped_not_json")]

    def takes_coded(self, codec: str) -> bool:
        return False  # (the native protocol is 48 kHz PCM)

    def caller_coded(self, payload: bytes) -> Message | None:
        return None

    def call_state(self, state: str) -> Message | None:
        return json.dumps({"type": "call.state", "state": state})

    def dtmf(self, digit: str, duration: float) -> list[AgentEvent]:
        event = {"type": "dtmf", "digit": digit, "duration_ms": round(duration * 1000)}
        return [ToAgent(json.dumps(event))]

    def closing(self) -> list[Message]:
        return [json.dumps({"type": "session.end"})]

    def on_message(self, message: Message) -> list[AgentEvent]:
        if isinstance(message, bytes):
            if len(message) % 2:  # PCM16: half a sample would shift every one after it
                return [Malformed("agent_bad_audio")]
            return [PlayAudio(message)]
        if len(message) > MAX_EVENT_BYTES + 1024:  # (no message of ours is longer: unparsed)
            return [Malformed("event_dropped_oversize")]
        try:
            msg = json.loads(message)
        except (ValueError, RecursionError):
            return [Malformed("agent_bad_message")]
        if not isinstance(msg, dict):
            return [Malformed("agent_bad_message")]
        kind = msg.get("type")
        if kind == "output.clear":
            return [ClearAudio()]
        if kind == "agent.event":
            text = json.dumps(msg.get("data"))
            if len(text) > MAX_EVENT_BYTES:
                return [Malformed("event_dropped_oversize")]
            return [ToCaller(text)]
        return []

    def played(self, tag: Tag) -> list[AgentEvent]:
        return []  # native frames carry no tag

    def dropped(self, tag: Tag) -> list[AgentEvent]:
        return []

    def link_lost(self) -> list[AgentEvent]:
        return []

    def failed(self) -> list[AgentEvent]:
        return []  # the session's `call.state` says it
