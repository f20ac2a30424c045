"""One Realtime session of the assistant, sans-IO: client events in, server events out.

Strategy (aioquic's shape): the I/O layer feeds `receive(text, wall)` with each client text
frame, `transcribed(...)` with what recognition heard, `spoken(...)` with each synthesized
chunk and `speech_done(...)` when a response's audio is complete; after each call it sends
`events` (server events, JSON-ready dicts) and runs `commands` (`Transcribe`, `Speak`,
`StopSpeaking`). Nothing here reads a clock (`wall` is the time the brain tells), sleeps or
does I/O; audio positions come from the audio itself.

Invariants: every server event has a unique `event_id`; at most one response is in progress;
a response always ends with `response.done` (completed or cancelled); chunks and transcripts
for a response that has ended are dropped; the conversation keeps at most `MAX_ITEMS` items,
the manual-commit buffer at most `MAX_BUFFER_MS` of audio. Bad client events become `error`
events carrying the client's `event_id`, never exceptions.
"""

from __future__ import annotations

import itertools
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from firsthop.services.agent.assistant import brain
from firsthop.services.agent.assistant.audio import BYTES_PER_MS, duration_ms, encode_audio
from firsthop.services.agent.assistant.client_events import HANDLERS
from firsthop.services.agent.assistant.commands import (
    ClientError,
    Command,
    Speak,
    StopSpeaking,
    Transcribe,
    new_id,
)
from firsthop.services.agent.assistant.config import SessionConfig
from firsthop.services.agent.assistant.turns import (
    Classifier,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
    default_classifier,
)

MAX_ITEMS = 200
MAX_BUFFER_MS = 60_000  # manual mode: audio waiting for input_audio_buffer.commit
DELTA_MS = 200  # audio per response.output_audio.delta


@dataclass
class Response:
    id: str
    item_id: str
    text: str
    spoken: list[str] = field(default_factory=list)  # sentences whose audio went out
    audio_ms: int = 0


class RealtimeSession:
    def __init__(
        self,
        config: SessionConfig,
        *,
        classifier: Classifier | None = None,
    ) -> None:
        self.config = config
        self._classifier = classifier
        self.events: list[dict[str, Any]] = []
        self.commands: list[Command] = []
        self.items: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.response: Response | None = None
        self.audio_ms = 0  # all input audio so far
        self.output_ms: dict[str, int] = {}  # assistant item -> audio sent, for truncate
        self._turns_origin_ms = 0
        self.turns = self._detector()
        self.buffer = bytearray()  # manual mode only
        self.turn_item: str | None = None
        self._answered: set[str] = set()
        self._seq = itertools.count(1)
        self.emit("session.created", session=self.config.describe())

    # ---- what the I/O layer drains -------------------------------------------------------

    def take(self) -> tuple[list[dict[str, Any]], list[Command]]:
        events, commands = self.events, self.commands
        self.events, self.commands = [], []
        return events, commands

    # ---- inputs ---------------------------------------------------------------------------

    def receive(self, text: str | bytes, wall: datetime) -> None:
        """One client frame (a JSON text event)."""
        event_id = None
        try:
            if isinstance(text, bytes):
                raise ClientError("binary frames are not Realtime events", param="type")
            try:
                event = json.loads(text)
            except (ValueError, RecursionError) as exc:  # nesting too deep: RecursionError
                raise ClientError("not JSON", code="invalid_json") from exc
            if not isinstance(event, dict):
                raise ClientError("an event is a JSON object")
            raw_id = event.get("event_id")
            event_id = raw_id[:128] if isinstance(raw_id, str) else None
            kind = event.get("type")
            handler = HANDLERS.get(kind) if isinstance(kind, str) else None
            if handler is None:
                shown = kind[:64] if isinstance(kind, str) else kind
                raise ClientError(f"Unsupported event type: {shown!r}", param="type")
            handler(self, event, wall)
        except ClientError as exc:
            self.error(str(exc), code=exc.code, param=exc.param, event_id=event_id)

    def transcribed(self, item_id: str, transcript: str, wall: datetime, *, respond: bool) -> None:
        item = self.items.get(item_id)
        if item is None:
            return  # deleted meanwhile
        item["content"][0]["transcript"] = transcript
        if transcript:  # the whole turn's words at once: recognition runs on the whole turn
            self.emit(
                "conversation.item.input_audio_transcription.delta",
                item_id=item_id,
                content_index=0,
                delta=transcript,
            )
        self.emit(
            "conversation.item.input_audio_transcription.completed",
            item_id=item_id,
            content_index=0,
            transcript=transcript,
        )
        if respond and transcript.strip() and self.response is None:
            self._answered.add(item_id)
            self.start_response(brain.answer(transcript, wall, self.persona()))

    def spoken(self, response_id: str, sentence: str, pcm: bytes) -> None:
        """A synthesized sentence (24 kHz PCM16): its transcript delta, then its audio."""
        r = self.response
        if r is None or r.id != response_id:
            return
        ids = self._ids(r)
        delta = sentence if not r.spoken else " " + sentence
        r.spoken.append(sentence)
        self.emit("response.output_audio_transcript.delta", **ids, delta=delta)
        step = DELTA_MS * BYTES_PER_MS
        for offset in range(0, len(pcm), step):
            chunk = pcm[offset : offset + step]
            r.audio_ms += duration_ms(chunk)
            self.output_ms[r.item_id] = r.audio_ms
            wire = encode_audio(chunk, self.config.output_format)
            self.emit("response.output_audio.delta", **ids, delta=wire)

    def speech_done(self, response_id: str) -> None:
        if self.response is not None and self.response.id == response_id:
            self._finish("completed")

    # ---- outputs --------------------------------------------------------------------------

    def emit(self, kind: str, **fields: Any) -> None:
        self.events.append({"type": kind, "event_id": f"event_{next(self._seq)}", **fields})

    def error(
        self,
        message: str,
        *,
        code: str = "invalid_value",
        param: str | None = None,
        event_id: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        self.emit(
            "error",
            error={
                "type": kind,
                "code": code,
                "message": message,
                "param": param,
                "event_id": event_id,
            },
        )

    # ---- conversation ---------------------------------------------------------------------

    def _last_item_id(self) -> str | None:
        return next(reversed(self.items), None)

    def add_item(self, item: dict[str, Any], previous: str | None = None) -> None:
        previous = previous if previous is not None else self._last_item_id()
        self.items[item["id"]] = item
        while len(self.items) > MAX_ITEMS:
            dropped, _ = self.items.popitem(last=False)
            self.output_ms.pop(dropped, None)
            self._answered.discard(dropped)
        self.emit("conversation.item.added", previous_item_id=previous, item=item)
        if item.get("status") == "completed":
            self.emit("conversation.item.done", previous_item_id=previous, item=item)

    def persona(self) -> brain.Persona:
        return brain.Persona.from_instructions(self.config.instructions)

    # ---- input audio ----------------------------------------------------------------------

    def reset_turns(self) -> None:
        """A new turn detector for the session's (changed) turn_detection; audio waiting for a
        manual commit is dropped."""
        self.turns = self._detector()
        self.buffer.clear()

    def _detector(self) -> TurnDetector | None:
        td = self.config.turn_detection
        if td is None:
            return None
        self._turns_origin_ms = self.audio_ms  # VAD positions are relative to its creation
        classifier = self._classifier or default_classifier(td.threshold)
        return TurnDetector(
            classifier,
            prefix_padding_ms=td.prefix_padding_ms,
            silence_duration_ms=td.silence_duration_ms,
        )

    def append(self, pcm: bytes) -> None:
        self.audio_ms += duration_ms(pcm)
        if self.turns is None:
            if len(self.buffer) + len(pcm) > MAX_BUFFER_MS * BYTES_PER_MS:
                raise ClientError(
                    f"input audio buffer is full ({MAX_BUFFER_MS // 1000} s): commit or clear",
                    code="input_audio_buffer_full",
                )
            self.buffer += pcm
            return
        for ev in self.turns.feed(pcm):
            if isinstance(ev, SpeechStarted):
                self._speech_started(ev.audio_start_ms + self._turns_origin_ms)
            else:
                self.speech_stopped(ev)

    def _speech_started(self, audio_start_ms: int) -> None:
        td = self.config.turn_detection
        if self.response is not None and td is not None and td.interrupt_response:
            self._finish("cancelled", reason="turn_detected")
        self.turn_item = new_id("item")
        self.emit(
            "input_audio_buffer.speech_started",
            audio_start_ms=max(0, audio_start_ms),
            item_id=self.turn_item,
        )

    def speech_stopped(self, ev: SpeechStopped) -> None:
        item_id = self.turn_item or new_id("item")
        self.turn_item = None
        end_ms = ev.audio_end_ms + self._turns_origin_ms
        self.emit("input_audio_buffer.speech_stopped", audio_end_ms=end_ms, item_id=item_id)
        td = self.config.turn_detection
        self.commit(
            item_id,
            ev.audio,
            respond=bool(td and td.create_response),
            hangover_ms=ev.audio_end_ms - ev.speech_end_ms,
        )

    def commit(
        self, item_id: str, audio: bytes, *, respond: bool, hangover_ms: int | None = None
    ) -> None:
        previous = self._last_item_id()
        self.emit("input_audio_buffer.committed", previous_item_id=previous, item_id=item_id)
        item = {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "user",
            "status": "completed",
            "content": [{"type": "input_audio", "transcript": None}],
        }
        self.add_item(item, previous)
        self.commands.append(Transcribe(item_id, audio, respond, hangover_ms))

    # ---- responses ------------------------------------------------------------------------

    def _ids(self, r: Response) -> dict[str, Any]:
        return {"response_id": r.id, "item_id": r.item_id, "output_index": 0, "content_index": 0}

    def _response_object(self, r: Response, status: str, output: list[Any]) -> dict[str, Any]:
        return {
            "object": "realtime.response",
            "id": r.id,
            "status": status,
            "status_details": None,
            "output": output,
            "conversation_id": self.config.session_id,
            "output_modalities": ["audio"],
            "max_output_tokens": "inf",
            "audio": {
                "output": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "voice": self.config.voice,
                }
            },
            "usage": None,
            "metadata": None,
        }

    def _assistant_item(self, r: Response, status: str) -> dict[str, Any]:
        content = [{"type": "output_audio", "transcript": " ".join(r.spoken) or None}]
        return {
            "id": r.item_id,
            "object": "realtime.item",
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content if status != "in_progress" else [],
        }

    def start_response(self, text: str) -> None:
        if self.response is not None:
            raise ClientError(
                "Conversation already has an active response in progress",
                code="conversation_already_has_active_response",
            )
        r = Response(id=new_id("resp"), item_id=new_id("item"), text=text)
        self.response = r
        self.emit("response.created", response=self._response_object(r, "in_progress", []))
        item = self._assistant_item(r, "in_progress")
        self.emit("response.output_item.added", response_id=r.id, output_index=0, item=item)
        self.add_item(item)
        self.emit(
            "response.content_part.added",
            **self._ids(r),
            part={"type": "audio", "transcript": ""},
        )
        self.commands.append(Speak(r.id, text))

    def _finish(self, status: str, reason: str | None = None) -> None:
        r = self.response
        assert r is not None
        self.response = None
        if status != "completed":
            self.commands.append(StopSpeaking(r.id))
        ids = self._ids(r)
        transcript = " ".join(r.spoken)
        self.emit("response.output_audio.done", **ids)
        self.emit("response.output_audio_transcript.done", **ids, transcript=transcript)
        self.emit(
            "response.content_part.done", **ids, part={"type": "audio", "transcript": transcript}
        )
        item = self._assistant_item(r, "completed" if status == "completed" else "incomplete")
        if r.item_id in self.items:
            self.items[r.item_id] = item
        self.emit("response.output_item.done", response_id=r.id, output_index=0, item=item)
        self.emit("conversation.item.done", previous_item_id=None, item=item)
        done = self._response_object(r, status, [item])
        if reason is not None:
            done["status_details"] = {"type": status, "reason": reason}
        self.emit("response.done", response=done)

    @property
    def response_id(self) -> str | None:
        return self.response.id if self.response is not None else None

    def cancel_response(self, reason: str) -> None:
        if self.response is not None:
            self._finish("cancelled", reason=reason)

    def heard_for_response(self, instructions: str | None) -> str:
        """What a response.create answers: the newest user text not yet answered, else the
        response's instructions, else the last user text, else a hello."""
        last = None
        for item_id, item in reversed(self.items.items()):
            if item.get("role") != "user":
                continue
            text = _item_text(item)
            if not text:
                continue
            if item_id not in self._answered:
                self._answered.add(item_id)
                return text
            last = last or text
        return instructions or last or "hello"


def _item_text(item: dict[str, Any]) -> str:
    parts = []
    for part in item.get("content") or []:
        if isinstance(part, dict):
            for key in ("text", "transcript"):
                if isinstance(part.get(key), str):
                    parts.append(part[key])
    return " ".join(parts).strip()
