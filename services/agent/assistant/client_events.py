"""The Realtime client events the assistant understands: one handler per `type`. Pure.

Each handler takes the session core, the parsed event and the wall-clock time, changes the
session and queues server events through it; a malformed event raises `ClientError`, which
the core turns into an `error` event with the client's `event_id`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any, Protocol

from firsthop.services.agent.assistant import brain
from firsthop.services.agent.assistant.audio import BYTES_PER_MS, AudioError, decode_audio
from firsthop.services.agent.assistant.commands import ClientError, new_id
from firsthop.services.agent.assistant.config import ConfigError, SessionConfig
from firsthop.services.agent.assistant.turns import SpeechStopped, TurnDetector


class SessionState(Protocol):
    """What a handler reads and changes of the session core (`session.RealtimeSession`)."""

    config: SessionConfig
    turns: TurnDetector | None
    buffer: bytearray  # manual-commit audio
    items: OrderedDict[str, dict[str, Any]]
    output_ms: dict[str, int]  # assistant item -> its audio sent so far
    turn_item: str | None  # the item of the turn in progress (server VAD)

    @property
    def response_id(self) -> str | None: ...
    def emit(self, kind: str, **fields: Any) -> None: ...
    def reset_turns(self) -> None: ...
    def append(self, pcm: bytes) -> None: ...
    def speech_stopped(self, ev: SpeechStopped) -> None: ...
    def commit(
        self, item_id: str, audio: bytes, *, respond: bool, hangover_ms: int | None = None
    ) -> None: ...
    def add_item(self, item: dict[str, Any], previous: str | None = None) -> None: ...
    def persona(self) -> brain.Persona: ...
    def heard_for_response(self, instructions: str | None) -> str: ...
    def start_response(self, text: str) -> None: ...
    def cancel_response(self, reason: str) -> None: ...


Handler = Callable[[SessionState, dict[str, Any], datetime], None]
HANDLERS: dict[str, Handler] = {}

MIN_COMMIT_MS = 100  # OpenAI refuses to commit less than this
MAX_TEXT = 4096  # characters of a conversation.item.create text kept
MAX_PARTS = 16  # content parts of one item
TRUNCATE_SLACK_MS = 200  # a player's count of audio heard may round up a frame or two


def handles(*names: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for name in names:
            HANDLERS[name] = fn
        return fn

    return register


def _str(event: dict[str, Any], key: str) -> str:
    value = event.get(key)
    if not isinstance(value, str) or not value:
        raise ClientError(
            f"Missing or invalid '{key}'", code="missing_required_parameter", param=key
        )
    return value


@handles("session.update")
def session_update(s: SessionState, event: dict[str, Any], wall: datetime) -> None:
    try:
        vad_changed = s.config.update(event.get("session", {}))
    except ConfigError as exc:
        raise ClientError(str(exc), param="session") from exc
    if vad_changed:
        s.reset_turns()
    s.emit("session.updated", session=s.config.describe())


@handles("input_audio_buffer.append")
def buffer_append(s: SessionState, event: dict[str, Any], wall: datetime) -> None:
    try:
        pcm = decode_audio(event.get("audio"), s.config.input_format)
    except AudioError as exc:
        raise ClientError(str(exc), param="audio") from exc
    s.append(pcm)


@handles("input_audio_buffer.commit")
def buffer_commit(s: SessionState, event: dict[str, Any], wall: datetime) -> None:
    if s.turns is not None:  # server VAD: commit the turn in progress, if any
        stopped = s.turns.stop()
        if stopped is None:
            raise ClientError(
                "Error committing input audio buffer: buffer is empty",
                code="input_audio_buffer_commit_empty",
            )
        s.speech_stopped(stopped)
        return
    if len(s.buffer) < MIN_COMMIT_MS * BYTES_PER_MS:
        raise ClientError(
            f"Error committing input audio buffer: buffer too small, at least {MIN_COMMIT_MS}ms",
            code="input_audio_buffer_commit_empty",
        )
    audio = bytes(s.buffer)
    s.buffer.clear()
    s.commit(new_id("item"), audio, respond=False)


@handles("input_audio_buffer.clear")
def buffer_clear(s: SessionState, event: dict[str, Any], wall: datetime) -> None:
    s.buffer.clear()
    if s.turns is not None:
        s.turns.clear()
    s.turn_item = None
    s.emit("input_audio_buffer.cleared")


@handles("conversation.item.create")
def item_create(s: SessionState, event: dict[str, Any], wall: datetime) -> None:
    item = event.get("item")
    if not isinstance(item, dict):
        raise ClientError("Missing 'item'", code="missing_required_parameter", param="item")
    if item.get("type", "message") != "message":
        raise ClientError(
            f"Unsupported item type {item.get('type')!r}: only messages", param="item.type"
        )
    role = item.get("role")
    if role not in ("user", "system", "assistant"):
        raise ClientError("item.role must be user, system or assistant", param="item.role")
    parts = item.get("content") or []
    if not isinstance(parts, list) or len(parts) > MAX_PARTS:
        raise ClientError(f"item.content is a list of at most {MAX_PARTS}", param="item.content")
    content = []
    for part in parts:
        if not isinstance(part, dict):
            raise ClientError("item.content entries are objects", param="item.content")
        text = part.get("text", part.get("transcript"))
        kind = part.get("type", "input_text")
        content.append({"type": kind, "text": text[:MAX_TEXT] if isinstance(text, str) else None})
    raw_id = item.get("id")
    item_id = raw_id[:64] if isinstance(raw_id, str) and raw_id else new_id("item")
    if item_id in s.items:
        raise ClientError(f"Item {item_id!r} already exists", param="item.id")
    previous = event.get("previous_item_id")
    stored = {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "role": role,
        "status": "completed",
        "content": content,
    }
    s.add_item(stored, previous if isinstance(previous, str) else None)


@handles("conversation.item.truncate")
def item_truncate(s: SessionState, event: dict[str, Any], wall: datetime) -> None:
    item_id = _str(event, "item_id")
    item = s.items.get(item_id)
    if item is None or item.get("role") != "assistant":
        raise ClientError(f"No assistant audio item {item_id!r}", param="item_id")
    end = event.get("audio_end_ms")
    if isinstance(end, bool) or not isinstance(end, int) or end < 0:
        raise ClientError("audio_end_ms must be a non-negative integer", param="audio_end_ms")
    if end > s.output_ms.get(item_id, 0) + TRUNCATE_SLACK_MS:
        raise ClientError(
            f"audio_end_ms {end} is past the item's audio ({s.output_ms.get(item_id, 0)} ms)",
            param="audio_end_ms",
        )
    # As OpenAI does: the text of audio the caller may not have heard leaves the context.
    for part in item.get("content") or []:
        if isinstance(part, dict) and "transcript" in part:
            part["transcript"] = None
    s.emit(
        "conversation.item.truncated",
        item_id=item_id,
        content_index=event.get("content_index", 0),
        audio_end_ms=end,
    )


@handles("conversation.item.delete")
def item_delete(s: SessionState, event: dict[str, Any], wall: datetime) -> None:
    item_id = _str(event, "item_id")
    if s.items.pop(item_id, None) is None:
        raise ClientError(f"No item {item_id!r}", param="item_id")
    s.emit("conversation.item.deleted", item_id=item_id)


@handles("conversation.item.retrieve")
def item_retrieve(s: SessionState, event: dict[str, Any], wall: datetime) -> None:
    item_id = _str(event, "item_id")
    item = s.items.get(item_id)
    if item is None:
        raise ClientError(f"No item {item_id!r}", param="item_id")
    s.emit("conversation.item.retrieved", item=item)


@handles("response.create")
def response_create(s: SessionState, event: dict[str, Any], wall: datetime) -> None:
    options = event.get("response")
    if options is not None and not isinstance(options, dict):
        raise ClientError("response must be an object", param="response")
    instructions = (options or {}).get("instructions")
    if s.response_id is not None:
        raise ClientError(
            "Conversation already has an active response in progress",
            code="conversation_already_has_active_response",
        )
    heard = s.heard_for_response(instructions if isinstance(instructions, str) else None)
    s.start_response(brain.answer(heard, wall, s.persona()))


@handles("response.cancel")
def response_cancel(s: SessionState, event: dict[str, Any], wall: datetime) -> None:
    wanted = event.get("response_id")
    if s.response_id is None or (isinstance(wanted, str) and wanted != s.response_id):
        raise ClientError(
            "Cancellation failed: no active response found", code="response_cancel_not_active"
        )
    s.cancel_response("client_cancelled")


@handles("output_audio_buffer.clear")
def output_clear(s: SessionState, event: dict[str, Any], wall: datetime) -> None:
    # WebRTC only: the transceiver owns the played buffer. Over a WebSocket there is nothing
    # buffered here (audio goes out as it is made), so it is accepted and does nothing.
    return
