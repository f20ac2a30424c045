"""The assistant's session configuration: what `session.update` asks, what is honoured. Pure.

`SessionConfig.update` takes the `session` object of a client's `session.update` in the GA
shape (`audio.input.turn_detection`, `audio.output.voice`, ...) or the beta one
(`turn_detection`, `voice`, `input_audio_transcription`, ...), honours what the assistant
can do and ignores the rest without an error (an app written for OpenAI names its models,
voices and transcription models). `describe` is the GA session object the
`session.created` / `session.updated` events carry: what the assistant really does, so an
asked-for voice or transcription model that it does not have is not echoed back. Audio
formats are honoured: 24 kHz `audio/pcm`, and G.711 `audio/pcmu` / `audio/pcma` (8 kHz).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from firsthop.services.agent.assistant.audio import RATE
from firsthop.shared.session_config import UNSET, SessionConfigError, noise_reduction

MAX_INSTRUCTIONS = 16 * 1024  # characters kept
DEFAULT_INSTRUCTIONS = "You are firsthop, a small offline voice assistant."


# The audio formats a session may ask for (GA `audio.*.format.type`, beta `*_audio_format`);
# audio/pcm at another rate than 24 kHz is not one: the session keeps what it had.
GA_FORMATS = {"audio/pcm": "pcm", "audio/pcmu": "pcmu", "audio/pcma": "pcma"}
BETA_FORMATS = {"pcm16": "pcm", "g711_ulaw": "pcmu", "g711_alaw": "pcma"}


def _format_name(fmt: object) -> str | None:
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        return None
    if fmt["type"] == "audio/pcm" and fmt.get("rate", RATE) != RATE:
        return None
    return GA_FORMATS.get(fmt["type"])


def _format(name: str) -> dict[str, Any]:
    return {"type": "audio/pcm", "rate": RATE} if name == "pcm" else {"type": f"audio/{name}"}


class ConfigError(ValueError):
    """A session.update whose shape is wrong (not its values: those are clamped)."""


def _number(value: Any, default: float, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return float(min(high, max(low, value)))


@dataclass
class TurnDetection:
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True

    def update(self, raw: dict[str, Any]) -> None:
        self.threshold = _number(raw.get("threshold"), self.threshold, 0.0, 1.0)
        self.prefix_padding_ms = int(
            _number(raw.get("prefix_padding_ms"), self.prefix_padding_ms, 0, 2000)
        )
        self.silence_duration_ms = int(
            _number(raw.get("silence_duration_ms"), self.silence_duration_ms, 100, 5000)
        )
        if isinstance(raw.get("create_response"), bool):
            self.create_response = raw["create_response"]
        if isinstance(raw.get("interrupt_response"), bool):
            self.interrupt_response = raw["interrupt_response"]

    def describe(self) -> dict[str, Any]:
        # semantic_vad (OpenAI's model-based turn detection) is run as server_vad.
        return {
            "type": "server_vad",
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
            "create_response": self.create_response,
            "interrupt_response": self.interrupt_response,
            "idle_timeout_ms": None,
        }


@dataclass
class SessionConfig:
    session_id: str
    model: str = "assistant"
    voice: str = "joe"  # the voice actually speaking (set by the server)
    recognizer: str = "pocketsphinx"
    instructions: str = DEFAULT_INSTRUCTIONS
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    transcription_language: str = "en"
    input_format: str = "pcm"  # pcm (24 kHz PCM16) | pcmu | pcma (G.711, 8 kHz)
    output_format: str = "pcm"
    # The edge runs it (RNNoise in the transceiver, before this server hears the caller); the
    # assistant keeps what the session asked so that session.updated says what is in force.
    noise_reduction: str | None = None

    def update(self, raw: object) -> bool:
        """Apply a client's session object; True if the turn detection settings changed."""
        if not isinstance(raw, dict):
            raise ConfigError("session must be an object")
        try:  # checked before anything is applied: a refused update changes nothing
            kind = noise_reduction(raw)
        except SessionConfigError as exc:
            raise ConfigError(exc.reason) from exc
        if isinstance(raw.get("model"), str) and raw["model"]:
            self.model = raw["model"][:128]
        if isinstance(raw.get("instructions"), str):
            self.instructions = raw["instructions"][:MAX_INSTRUCTIONS]
        audio = raw.get("audio")
        audio_in = audio.get("input") if isinstance(audio, dict) else None
        audio_out = audio.get("output") if isinstance(audio, dict) else None
        for side, beta, attr in (
            (audio_in, "input_audio_format", "input_format"),
            (audio_out, "output_audio_format", "output_format"),
        ):
            name = _format_name(side.get("format") if isinstance(side, dict) else None)
            beta_name = raw.get(beta)
            name = name or (BETA_FORMATS.get(beta_name) if isinstance(beta_name, str) else None)
            if name is not None:
                setattr(self, attr, name)
        if kind != UNSET:
            self.noise_reduction = kind
        changed = False
        if isinstance(audio_in, dict) and "turn_detection" in audio_in:
            changed = self._turn_detection(audio_in["turn_detection"])
        elif "turn_detection" in raw:  # the beta shape
            changed = self._turn_detection(raw["turn_detection"])
        return changed

    def _turn_detection(self, raw: object) -> bool:
        if raw is None:
            self.turn_detection = None
            return True
        if not isinstance(raw, dict):
            raise ConfigError("turn_detection must be an object or null")
        if self.turn_detection is None:
            self.turn_detection = TurnDetection()
        self.turn_detection.update(raw)
        return True

    def describe(self) -> dict[str, Any]:
        return {
            "object": "realtime.session",
            "type": "realtime",
            "id": self.session_id,
            "model": self.model,
            "output_modalities": ["audio"],
            "instructions": self.instructions,
            "tools": [],
            "tool_choice": "auto",
            "max_output_tokens": "inf",
            "tracing": None,
            "prompt": None,
            "expires_at": 0,
            "include": None,
            "audio": {
                "input": {
                    "format": _format(self.input_format),
                    "transcription": {
                        "model": self.recognizer,
                        "language": self.transcription_language,
                    },
                    "noise_reduction": (
                        {"type": self.noise_reduction} if self.noise_reduction else None
                    ),
                    "turn_detection": (
                        self.turn_detection.describe() if self.turn_detection else None
                    ),
                },
                "output": {
                    "format": _format(self.output_format),
                    "voice": self.voice,
                    "speed": 1.0,
                },
            },
        }
