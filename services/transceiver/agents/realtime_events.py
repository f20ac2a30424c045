"""The Realtime API's event vocabulary as data: client event types, the `error` server event,
event ids, and the audio formats a session config names (GA and beta spellings).

Pure functions, no state: `realtime.py` is the codec that uses them.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

MAX_CLIENT_EVENT = 64 * 1024  # bytes of one client event (data channel or sideband)

# Client events a backend is sent as they are (GA names; the beta's where they differ).
FORWARDED = frozenset(
    {
        "session.update",
        "transcription_session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "conversation.item.create",
        "conversation.item.retrieve",
        "conversation.item.truncate",
        "conversation.item.delete",
        "response.create",
        "response.cancel",
    }
)
CLEAR = "output_audio_buffer.clear"  # WebRTC only: the transceiver's own, never forwarded
CLIENT_EVENTS = FORWARDED | {CLEAR}

AUDIO_DELTAS = frozenset({"response.output_audio.delta", "response.audio.delta"})
AUDIO_DONES = frozenset({"response.output_audio.done", "response.audio.done"})

# The wire formats a session may ask for: name -> (sample rate, codec).
FORMATS: dict[str, tuple[int, str]] = {
    "pcm": (24000, "pcm"),
    "pcmu": (8000, "pcmu"),
    "pcma": (8000, "pcma"),
}
_GA_FORMATS = {"audio/pcm": "pcm", "audio/pcmu": "pcmu", "audio/pcma": "pcma"}
_BETA_FORMATS = {"pcm16": "pcm", "g711_ulaw": "pcmu", "g711_alaw": "pcma"}


def new_event_id() -> str:
    return "event_" + secrets.token_hex(10)


def event(kind: str, new_id: str, **fields: Any) -> str:
    """A server event of the bridge's own, as JSON text."""
    return json.dumps({"type": kind, "event_id": new_id, **fields})


def error_event(
    new_id: str,
    message: str,
    *,
    code: str | None,
    kind: str = "invalid_request_error",
    param: str | None = None,
    client_event_id: str | None = None,
) -> str:
    """OpenAI's `error` server event."""
    detail = {
        "type": kind,
        "code": code,
        "message": message,
        "param": param,
        "event_id": client_event_id,
    }
    return event("error", new_id, error=detail)


def audio_formats(session: object) -> tuple[str | None, str | None]:
    """The (input, output) formats a session config names ("pcm", "pcmu", "pcma"; None where
    it names none or one we do not know): GA `audio.{input,output}.format.type`, or the beta's
    `input_audio_format` / `output_audio_format`."""
    if not isinstance(session, dict):
        return None, None

    def ga(direction: str) -> str | None:
        audio = session.get("audio")
        side = audio.get(direction) if isinstance(audio, dict) else None
        fmt = side.get("format") if isinstance(side, dict) else None
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        return _GA_FORMATS.get(kind) if isinstance(kind, str) else None

    def beta(key: str) -> str | None:
        kind = session.get(key)
        return _BETA_FORMATS.get(kind) if isinstance(kind, str) else None

    return (
        ga("input") or beta("input_audio_format"),
        ga("output") or beta("output_audio_format"),
    )
