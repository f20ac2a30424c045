"""The transceiver as a Realtime-API client of a backend (`realtime+ws(s)://`), sans-IO.

The caller speaks OpenAI's Realtime WebRTC API (audio on the call, events on its data channel
or a sideband socket); the backend speaks the Realtime event protocol over WebSocket. This
codec is the bridge between the two:

* opening: `session.update` with the caller's session config (again after a reconnect, with
  every `session.update` the caller sent since merged in by `shared.session_config`'s rule,
  the one signaling uses; an update that would take the session past its 16 KiB is refused
  with an `error` and not forwarded, so what is re-sent is what the backend had);
* the caller's 48 kHz frames -> `input_audio_buffer.append`, base64 PCM16 24 kHz (or G.711
  at 8 kHz if the session asks for `audio/pcmu` / `audio/pcma`);
* `response.output_audio.delta` (beta: `response.audio.delta`) -> decoded, resampled to
  48 kHz and cut into 20 ms frames tagged (response_id, item_id) to play; not forwarded to
  the caller (OpenAI's WebRTC API does not send audio deltas on the data channel);
* every other backend event -> to the caller untouched (a second `session.created` after a
  reconnect is kept back: to the caller it is the same session);
* `input_audio_buffer.speech_started` -> barge-in: queued output cleared at once,
  `output_audio_buffer.cleared`, and `conversation.item.truncate` at what was really played
  (`playout.py` keeps that from the frames' fate);
* client events: a JSON object with a string `type`, at most `MAX_CLIENT_EVENT` bytes, of a
  known type, is forwarded as it is; `output_audio_buffer.clear` is handled here; anything
  else is answered with an `error` event and not forwarded.

Failures: a backend message that is not a JSON object with a string `type`, or audio that is
not base64, is `Malformed` (counted, `realtime_*`), never raised.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from firsthop.services.transceiver.agents.events import (
    AgentEvent,
    CallInfo,
    ClearAudio,
    Malformed,
    Message,
    NoiseReduction,
    PlayAudio,
    Tag,
    ToAgent,
    ToCaller,
    ToSender,
)
from firsthop.services.transceiver.agents.playout import Playout, PlayoutEvent, Started
from firsthop.services.transceiver.agents.realtime_events import (
    AUDIO_DELTAS,
    AUDIO_DONES,
    CLEAR,
    CLIENT_EVENTS,
    FORMATS,
    MAX_CLIENT_EVENT,
    audio_formats,
    error_event,
    event,
    new_event_id,
)
from firsthop.services.transceiver.media.frames import CALL_RATE, FrameCutter
from firsthop.services.transceiver.resample import Resampler
from firsthop.shared.session_config import UNSET, SessionConfigError, merge_update, noise_reduction
from firsthop.shared.wire.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode

MAX_ITEMS = 32  # items whose audio length is remembered (for truncates)
# A backend's ids are kept with every queued frame (its tag) and in the playout's maps: an id
# past MAX_ID characters is refused (`realtime_bad_audio`), so 1,500 queued frames cannot
# hold 1,500 ids of a megabyte each. An audio delta past MAX_DELTA characters of base64
# (192 KiB decoded: 4 s at 24 kHz, 24 s of G.711) is refused too (`realtime_audio_oversize`):
# one callback decodes and queues a whole delta, every call's media clock waiting.
MAX_ID = 128
MAX_DELTA = 256 * 1024
CODED_FRAME = 160  # bytes of 20 ms of G.711 at 8 kHz (a phone call's, straight through)

_ENCODE: dict[str, Callable[[bytes], bytes]] = {"pcmu": ulaw_encode, "pcma": alaw_encode}
_DECODE: dict[str, Callable[[bytes], bytes]] = {"pcmu": ulaw_decode, "pcma": alaw_decode}


class RealtimeProtocol:
    hold_events = True  # session.created must be the first thing the caller sees
    call_state_events = False  # the caller's channel carries Realtime events only
    sends_ahead = True  # backends send answers faster than real time
    closing_ends_call = False  # a lost link is reconnected; the call goes on

    def __init__(self, call: CallInfo, new_id: Callable[[], str] = new_event_id) -> None:
        self.call = call
        self.new_id = new_id
        self.session: dict[str, Any] | None = dict(call.session) if call.session else None
        self.in_format = self.out_format = "pcm"
        self._down = Resampler(CALL_RATE, FORMATS["pcm"][0])
        self._up = Resampler(FORMATS["pcm"][0], CALL_RATE)
        self._set_formats(self.session)
        self.playout = Playout()
        self._out = FrameCutter()  # 48 kHz audio of `_out_tag` short of a whole frame
        self._out_tag: Tag | None = None
        self._coded = bytearray()  # G.711 straight through: short of a whole frame
        self._created_seen = False
        self._sent_samples: OrderedDict[str, int] = OrderedDict()  # item -> samples of audio

    # -- the call -> the backend --------------------------------------------------------------

    def opening(self) -> list[Message]:
        self._down.reset()
        if self.session is None:
            return []
        return [json.dumps({"type": "session.update", "session": self.session})]

    def caller_audio(self, pcm: bytes) -> Message | None:
        wire = self._down.push(pcm)
        encode = _ENCODE.get(self.in_format)
        if encode is not None:
            wire = encode(wire)
        if not wire:
            return None
        audio = base64.b64encode(wire).decode()
        return json.dumps({"type": "input_audio_buffer.append", "audio": audio})

    def takes_coded(self, codec: str) -> bool:
        """A phone call whose G.711 is what the session's input format asks for."""
        return codec == self.in_format

    def caller_coded(self, payload: bytes) -> Message | None:
        audio = base64.b64encode(payload).decode()
        return json.dumps({"type": "input_audio_buffer.append", "audio": audio})

    def caller_message(self, message: Message) -> list[AgentEvent]:
        if isinstance(message, bytes):
            return self._invalid("binary messages are not Realtime events", "invalid_event")
        if len(message) > MAX_CLIENT_EVENT or len(message.encode()) > MAX_CLIENT_EVENT:
            return self._invalid(
                f"event over {MAX_CLIENT_EVENT} bytes", "event_too_large", count="oversize"
            )
        try:
            data = json.loads(message)
        except (ValueError, RecursionError):
            return self._invalid("the event is not valid JSON", "invalid_json", count="not_json")
        if not isinstance(data, dict):
            return self._invalid("an event must be a JSON object", "invalid_event")
        client_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
        kind = data.get("type")
        if not isinstance(kind, str):
            return self._invalid(
                "missing required parameter: 'type'",
                "missing_required_parameter",
                param="type",
                client_event_id=client_id,
            )
        if kind not in CLIENT_EVENTS:
            return self._invalid(
                f"Invalid value: {kind[:64]!r}. Supported values are: "
                + ", ".join(repr(k) for k in sorted(CLIENT_EVENTS)),
                "invalid_value",
                param="type",
                client_event_id=client_id,
                count="unknown_type",
            )
        if kind == CLEAR:
            return self._clear()
        if kind == "session.update" and isinstance(data.get("session"), dict):
            try:
                asked = noise_reduction(data["session"])
                self.session = merge_update(self.session, data["session"])
            except SessionConfigError as exc:
                # Refused whole, not forwarded: the backend keeps the session we would re-send.
                return self._invalid(
                    f"session.update refused ({exc.reason} once merged); the session is unchanged",
                    "session_too_large" if exc.status == 413 else "invalid_value",
                    param="session",
                    client_event_id=client_id,
                    count="session_refused",
                )
            self._set_formats(data["session"])
            if asked != UNSET:  # the edge runs it, before the backend hears the caller
                return [NoiseReduction(asked), ToAgent(message)]
        return [ToAgent(message)]

    def call_state(self, state: str) -> Message | None:
        return None  # the backend has no word for it

    def dtmf(self, digit: str, duration: float) -> list[AgentEvent]:
        """OpenAI's SIP calls tell the app of a key on its sideband socket with this server
        event; the backend (a model) has no client event for it."""
        event = {
            "type": "input_audio_buffer.dtmf_event_received",
            "event_id": self.new_id(),
            "event": digit,
            "received_at": int(time.time()),
        }
        return [ToCaller(json.dumps(event))]

    def closing(self) -> list[Message]:
        return []

    # -- the backend -> the call ----------------------------------------------------------------

    def on_message(self, message: Message) -> list[AgentEvent]:
        if isinstance(message, bytes):
            return [Malformed("realtime_binary_dropped")]
        try:
            msg = json.loads(message)
        except (ValueError, RecursionError):
            return [Malformed("realtime_bad_event")]
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            return [Malformed("realtime_bad_event")]
        kind = msg["type"]
        if kind in AUDIO_DELTAS:
            return self._delta(msg)
        if kind == "session.created":
            if self._created_seen:
                return [Malformed("realtime_session_created_kept_back")]
            self._created_seen = True
        if kind in ("session.created", "session.updated"):
            self._set_formats(msg.get("session"))
        if kind == "input_audio_buffer.speech_started":
            return [ToCaller(message), *self._clear()]
        done = msg.get("response_id") if kind in AUDIO_DONES else None
        if kind == "response.done":
            response = msg.get("response")
            done = response.get("id") if isinstance(response, dict) else None
        if isinstance(done, str):  # the tail of its audio, the event, then maybe `stopped`
            return [*self._flush(), ToCaller(message), *self._done(done)]
        return [ToCaller(message)]

    def played(self, tag: Tag) -> list[AgentEvent]:
        return self._playout(self.playout.played(tag))

    def dropped(self, tag: Tag) -> list[AgentEvent]:
        return [Malformed("realtime_output_dropped"), *self._playout(self.playout.dropped(tag))]

    def link_lost(self) -> list[AgentEvent]:
        self._up.reset()
        self._out.clear()
        self._coded.clear()  # (a phone call's G.711 straight through: the old response's)
        self._out_tag = None
        gone = error_event(
            self.new_id(),
            "the Realtime backend is gone; reconnecting (the call goes on in silence)",
            code="backend_unavailable",
            kind="server_error",
        )
        cleared = self.playout.clear()
        out: list[AgentEvent] = [ClearAudio()]
        if cleared.response_id is not None:
            out.append(self._cleared_event(cleared.response_id))
        return [*out, ToCaller(gone)]

    def failed(self) -> list[AgentEvent]:
        gone = error_event(
            self.new_id(),
            "the call failed on the server and has ended",
            code="session_failed",
            kind="server_error",
        )
        return [ToCaller(gone)]

    # -- internals ---------------------------------------------------------------------------------

    def _delta(self, msg: dict[str, Any]) -> list[AgentEvent]:
        rid, item, delta = msg.get("response_id"), msg.get("item_id"), msg.get("delta")
        if not (isinstance(rid, str) and isinstance(item, str) and isinstance(delta, str)):
            return [Malformed("realtime_bad_audio")]
        if len(rid) > MAX_ID or len(item) > MAX_ID:
            return [Malformed("realtime_bad_audio")]
        if len(delta) > MAX_DELTA:
            return [Malformed("realtime_audio_oversize")]
        if not self.playout.wanted(rid):
            return [Malformed("realtime_audio_after_clear")]
        try:
            wire = base64.b64decode(delta, validate=True)
        except (binascii.Error, ValueError):
            return [Malformed("realtime_bad_audio")]
        tag = (rid, item)
        out: list[AgentEvent] = []
        if tag != self._out_tag:
            out += self._flush()
            self._out_tag = tag
        straight = self.call.codec == self.out_format  # a phone call's own G.711
        decode = _DECODE.get(self.out_format)
        pcm = decode(wire) if decode is not None and not straight else wire
        if not straight and len(pcm) % 2:  # (PCM16: half a sample would shift all after it)
            return out + [Malformed("realtime_bad_audio")]
        samples = len(wire) if straight else len(pcm) // 2
        self._sent_samples[item] = self._sent_samples.get(item, 0) + samples
        self._sent_samples.move_to_end(item)
        while len(self._sent_samples) > MAX_ITEMS:
            self._sent_samples.popitem(last=False)
        if straight:  # G.711 straight through: 20 ms of it a frame, as it came
            self._coded += wire
            whole = len(self._coded) // CODED_FRAME * CODED_FRAME
            chunks = [bytes(self._coded[i : i + CODED_FRAME]) for i in range(0, whole, CODED_FRAME)]
            del self._coded[:whole]
            return out + self._frames(chunks, coded=True)
        return out + self._frames(self._out.cut(self._up.push(pcm)))

    def _frames(self, frames: list[bytes], coded: bool = False) -> list[AgentEvent]:
        tag = self._out_tag
        if tag is None:
            return []
        if frames:
            self.playout.queued(tag, len(frames))
        return [PlayAudio(f, tag, coded) for f in frames]

    def _flush(self) -> list[AgentEvent]:
        """The end of one stream of audio: the filter's tail, and a last padded frame."""
        if self._out_tag is None:
            return []
        frames = self._out.cut(self._up.flush())
        last = self._out.pad()  # the stream's end: its part-frame, padded, plays
        out = self._frames(frames + [last] if last is not None else frames)
        if self._coded:  # (straight through: its part-frame, padded with coded silence)
            silence = _ENCODE[self.call.codec](bytes(2 * CODED_FRAME))
            padded = bytes(self._coded) + silence[len(self._coded) :]
            self._coded.clear()
            out += self._frames([padded], coded=True)
        self._out_tag = None
        return out

    def _done(self, response_id: str) -> list[AgentEvent]:
        return self._playout(self.playout.audio_done(response_id))

    def _clear(self) -> list[AgentEvent]:
        """Barge-in, or the client's `output_audio_buffer.clear`: silence now, tell the
        caller, and truncate the item at what it heard."""
        self._up.reset()
        self._out.clear()
        self._coded.clear()
        self._out_tag = None
        cleared = self.playout.clear()
        if cleared.response_id is None:
            return [ClearAudio()]
        out: list[AgentEvent] = [ClearAudio(), self._cleared_event(cleared.response_id)]
        if cleared.item_id is not None:
            # Never past the audio the backend sent (the last frame was padded to 20 ms).
            rate = FORMATS[self.out_format][0]
            sent_ms = self._sent_samples.get(cleared.item_id, 0) * 1000 // rate
            truncate = {
                "type": "conversation.item.truncate",
                "event_id": self.new_id(),
                "item_id": cleared.item_id,
                "content_index": 0,
                "audio_end_ms": min(cleared.audio_end_ms, sent_ms),
            }
            out.append(ToAgent(json.dumps(truncate)))
        return out

    def _cleared_event(self, response_id: str) -> ToCaller:
        text = event("output_audio_buffer.cleared", self.new_id(), response_id=response_id)
        return ToCaller(text)

    def _playout(self, events: list[PlayoutEvent]) -> list[AgentEvent]:
        out: list[AgentEvent] = []
        for e in events:
            kind = "started" if isinstance(e, Started) else "stopped"
            text = event(f"output_audio_buffer.{kind}", self.new_id(), response_id=e.response_id)
            out.append(ToCaller(text))
        return out

    def _invalid(
        self,
        message: str,
        code: str,
        *,
        param: str | None = None,
        client_event_id: str | None = None,
        count: str = "invalid",
    ) -> list[AgentEvent]:
        text = error_event(
            self.new_id(), message, code=code, param=param, client_event_id=client_event_id
        )
        return [Malformed(f"realtime_client_event_{count}"), ToSender(text)]

    def _set_formats(self, session: object) -> None:
        fin, fout = audio_formats(session)
        if fin is not None and fin != self.in_format:
            self.in_format = fin
            self._down = Resampler(CALL_RATE, FORMATS[fin][0])
        if fout is not None and fout != self.out_format:
            self.out_format = fout
            self._up = Resampler(FORMATS[fout][0], CALL_RATE)
