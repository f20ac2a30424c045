"""What the session core asks of the I/O layer, and the error a client event can raise. Pure."""

from __future__ import annotations

import secrets
from dataclasses import dataclass


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


@dataclass(frozen=True)
class Transcribe:
    item_id: str
    audio: bytes  # 24 kHz PCM16
    respond: bool  # answer it once heard (server VAD with create_response)
    vad_hangover_ms: int | None  # end of speech to speech_stopped, for the metrics


@dataclass(frozen=True)
class Speak:
    response_id: str
    text: str


@dataclass(frozen=True)
class StopSpeaking:
    response_id: str


Command = Transcribe | Speak | StopSpeaking


class ClientError(Exception):
    def __init__(self, message: str, code: str = "invalid_value", param: str | None = None):
        super().__init__(message)
        self.code = code
        self.param = param
