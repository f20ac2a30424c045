"""The transceiver as a Twilio Media Streams client of a bot (`twilio+ws(s)://`), sans-IO.

Voice bots made for telephony (Pipecat's `TwilioFrameSerializer`, fastrtc, home-made ones)
are WebSocket servers that Twilio dials with the Media Streams protocol; this codec dials them
the same way (the messages are `twilio_events.py`'s):

* opening: `connected`, then `start` with the call's ids and, as `customParameters` (strings),
  `call_id`, `session_id`, `region`, `traceparent` and the caller's `session` config (JSON);
* the caller's 48 kHz frames -> 8 kHz (libswresample's filter, `resample.py`) -> μ-law
  (`g711.py`) -> a `media` message per frame, 20 ms (160 bytes), numbered (`chunk`,
  `sequenceNumber`) and stamped in ms of audio sent (`timestamp`);
* the bot's `media` -> μ-law decoded, resampled to 48 kHz, cut into 20 ms frames tagged with
  the stream's epoch, queued to play (the bot may send ahead: the output queue keeps up to
  its bound, `session.AHEAD_FRAMES`);
* the bot's `mark` -> echoed back once every frame queued before it has left the output queue
  (played, or dropped at the bound; `MarkLedger`); a part-frame left over when the queue runs
  dry is padded and played so its mark is not held forever;
* the bot's `clear` -> queued audio dropped at once (barge-in), pending marks echoed at once;
  frames of the old epoch reported played later are not counted;
* the call's end -> `stop`; the bot closing its socket ends the call (`closing_ends_call`),
  as a Twilio call ends when its `<Connect><Stream>` does.

Failures: whatever the bot sends that is not one of those, well formed, is `Malformed`
(counted as `twilio_*`) and the call goes on.
"""

from __future__ import annotations

import json

from firsthop.services.transceiver.agents import twilio_events as tw
from firsthop.services.transceiver.agents.events import (
    AgentEvent,
    CallInfo,
    ClearAudio,
    Malformed,
    Message,
    PlayAudio,
    Tag,
    ToAgent,
)
from firsthop.services.transceiver.media.frames import CALL_RATE, FrameCutter
from firsthop.services.transceiver.resample import Resampler
from firsthop.shared.wire.g711 import ulaw_decode, ulaw_encode

CHUNK_SAMPLES = 160  # 20 ms at 8 kHz: one `media` message to the bot


class TwilioProtocol:
    hold_events = False  # the bot has no events for the caller
    call_state_events = True  # the caller's data channel hears `call.state` from the bridge
    sends_ahead = True  # bots send faster than real time (Pipecat: twice); Twilio queues it
    closing_ends_call = True  # a stream closed by the bot is a call hung up

    def __init__(self, call: CallInfo) -> None:
        self.call = call
        self.stream_sid = tw.sid("MZ")
        self.call_sid = tw.sid("CA", call.call_id)
        self._down = Resampler(CALL_RATE, tw.RATE)
        self._up = Resampler(tw.RATE, CALL_RATE)
        self._out = FrameCutter()  # 48 kHz PCM of the bot short of a whole frame
        self.seq = self.chunk = self.sent_samples = 0
        self.epoch = 0
        self._up_started = False  # the bot's audio has begun since the last reset
        self.marks = tw.MarkLedger()

    def custom_parameters(self) -> dict[str, str]:
        call = self.call
        custom = {"call_id": call.call_id, "session_id": call.session_id, "region": call.region}
        if call.traceparent:
            custom["traceparent"] = call.traceparent
        if call.session is not None:
            custom["session"] = json.dumps(call.session)
        return custom

    # -- the call -> the bot -------------------------------------------------------------------

    def opening(self) -> list[Message]:
        self._down.reset()
        self.seq = self.chunk = self.sent_samples = 0
        start = tw.start(self._next(), self.stream_sid, self.call_sid, self.custom_parameters())
        return [tw.connected(), start]

    def caller_audio(self, pcm: bytes) -> Message | None:
        wire = self._down.push(pcm)
        if not wire:
            return None
        if not self.chunk:  # (`FrameCutter.lead`)
            wire = FrameCutter.lead(wire, 2 * CHUNK_SAMPLES)
        ulaw = ulaw_encode(wire)
        self.chunk += 1
        timestamp = self.sent_samples * 1000 // tw.RATE
        self.sent_samples += len(ulaw)
        return tw.media(self._next(), self.stream_sid, self.chunk, timestamp, ulaw)

    def takes_coded(self, codec: str) -> bool:
        return codec == "pcmu"  # (Media Streams are mu-law at 8 kHz: a PCMU call's, as is)

    def caller_coded(self, payload: bytes) -> Message | None:
        self.chunk += 1
        timestamp = self.sent_samples * 1000 // tw.RATE
        self.sent_samples += len(payload)
        return tw.media(self._next(), self.stream_sid, self.chunk, timestamp, payload)

    def caller_message(self, message: Message) -> list[AgentEvent]:
        return [Malformed("twilio_client_event_dropped")]  # Media Streams carry no events

    def call_state(self, state: str) -> Message | None:
        return None

    def dtmf(self, digit: str, duration: float) -> list[AgentEvent]:
        return [ToAgent(tw.dtmf(self._next(), self.stream_sid, digit))]

    def closing(self) -> list[Message]:
        return [tw.stop(self._next(), self.stream_sid, self.call_sid)]

    # -- the bot -> the call -------------------------------------------------------------------

    def on_message(self, message: Message) -> list[AgentEvent]:
        match tw.parse(message, self.stream_sid):
            case tw.BotMedia(ulaw):
                return self._media(ulaw)
            case tw.BotMark(name):
                return self._mark(name)
            case tw.BotClear():
                return self._clear()
            case tw.BadInput(reason):
                return [Malformed(reason)]
        return []

    def played(self, tag: Tag) -> list[AgentEvent]:
        return self._left(tag)

    def dropped(self, tag: Tag) -> list[AgentEvent]:
        return [Malformed("twilio_output_dropped"), *self._left(tag)]

    def link_lost(self) -> list[AgentEvent]:
        self.marks.clear()
        self._reset_output()
        return [ClearAudio()]

    def failed(self) -> list[AgentEvent]:
        return []  # the session's `call.state` says it

    # -- internals -------------------------------------------------------------------------------

    def _next(self) -> int:
        self.seq += 1
        return self.seq

    def _tag(self) -> Tag:
        return (str(self.epoch), "twilio")

    def _media(self, ulaw: bytes) -> list[AgentEvent]:
        pcm = self._up.push(ulaw_decode(ulaw))
        if not self._up_started and pcm:  # (`FrameCutter.lead`)
            self._up_started = True
            pcm = FrameCutter.lead(pcm)
        return self._queue(self._out.cut(pcm))

    def _queue(self, frames: list[bytes]) -> list[AgentEvent]:
        self.marks.add_frames(len(frames))
        tag = self._tag()
        return [PlayAudio(f, tag) for f in frames]

    def _padded(self) -> list[AgentEvent]:
        """The part-frame left over, padded to 20 ms with silence and queued."""
        frame = self._out.pad()
        return self._queue([frame]) if frame is not None else []

    def _mark(self, name: str) -> list[AgentEvent]:
        out: list[AgentEvent] = []
        if self.marks.idle:  # nothing playing: the part-frame can go now, with no gap
            out += self._padded()
        position = self.marks.queued + (1 if self._out.held else 0)
        due = self.marks.add(name, position)
        if due is None:
            return [*out, Malformed("twilio_mark_dropped")]
        return out + self._echo(due)

    def _clear(self) -> list[AgentEvent]:
        due = self.marks.clear()
        self._reset_output()
        return [ClearAudio(), *self._echo(due)]

    def _left(self, tag: Tag) -> list[AgentEvent]:
        if tag != self._tag():
            return []  # a frame from before a clear
        out = self._echo(self.marks.frame_left())
        if self.marks.idle and self.marks.pending and self._out.held:
            out += self._padded()  # the queue ran dry: play what a mark still waits for
        return out

    def _echo(self, names: list[str]) -> list[AgentEvent]:
        return [ToAgent(tw.mark(self._next(), self.stream_sid, name)) for name in names]

    def _reset_output(self) -> None:
        self.epoch += 1
        self._up.reset()
        self._up_started = False
        self._out.clear()
