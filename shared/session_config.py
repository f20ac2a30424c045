"""A Realtime session config's one rule book: how big it may be, and how an update merges in.

Two services hold a call's session config and must agree on it to the byte:

* signaling builds it when the call is created: the ephemeral key's bound session, overridden
  by the call's own ``session`` part, then ``?model=`` (`merge_sessions`);
* the transceiver merges every ``session.update`` the caller sends after that into what it
  holds (`merge_update`), because after a backend reconnect it must send the backend the
  session as the caller left it, in one ``session.update``.

**The merge** (what OpenAI's API does): the fields an update names replace the old ones, and
objects merge key by key — except the settings in `WHOLE`, which are replaced whole. Most of
them are tagged unions (``{"type": "semantic_vad", ...}``), where merging keys across
variants would make something the caller never asked for (a ``semantic_vad`` carrying
``server_vad``'s ``silence_duration_ms``, an ``audio/pcmu`` format with ``rate: 24000``).
Lists and ``null`` always replace.

**The bound**: at most `MAX_SESSION_BYTES` of JSON and `MAX_DEPTH` levels of nesting, checked
on the merged result, so no sequence of updates makes a session bigger than one create may;
an update that would is refused and the old session kept (`SessionConfigError`).

Pure: no I/O. Errors: `SessionConfigError` (`status` 400 or 413, `reason`).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

MAX_SESSION_BYTES = 16 * 1024  # of JSON, as sent on (docs/architecture.md §6)
MAX_DEPTH = 16  # levels of objects and lists

# Settings replaced whole when given (GA names, then the beta's top-level spellings).
WHOLE: frozenset[tuple[str, ...]] = frozenset(
    {
        ("audio", "input", "format"),
        ("audio", "output", "format"),
        ("audio", "input", "turn_detection"),
        ("audio", "input", "transcription"),
        ("audio", "input", "noise_reduction"),
        ("tools",),
        ("tool_choice",),
        ("tracing",),
        ("truncation",),
        ("prompt",),
        ("turn_detection",),
        ("input_audio_transcription",),
        ("input_audio_noise_reduction",),
    }
)


class SessionConfigError(ValueError):
    """A session config, or the result of an update, breaks a bound (`status`: HTTP's)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _depth(value: object, limit: int = MAX_DEPTH) -> int:
    """Nesting depth, counted no further than just past `limit` (a cheap refusal)."""
    if limit < 0:
        return MAX_DEPTH + 1
    if isinstance(value, dict):
        return 1 + max((_depth(v, limit - 1) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v, limit - 1) for v in value), default=0)
    return 0


def size_of(session: Mapping[str, Any]) -> int:
    """Bytes of JSON the session is sent as (``json.dumps``' default form, the larger)."""
    return len(json.dumps(session).encode())


def check_bounds(session: Mapping[str, Any], where: str = "session") -> None:
    """Raise `SessionConfigError` if `session` is too deep (400) or too big (413)."""
    if _depth(session) > MAX_DEPTH:
        raise SessionConfigError(400, f"{where} is nested too deeply")
    if size_of(session) > MAX_SESSION_BYTES:
        raise SessionConfigError(413, f"{where} is over {MAX_SESSION_BYTES} bytes")


def _merge(base: Any, top: Any, path: tuple[str, ...]) -> Any:
    if isinstance(base, dict) and isinstance(top, dict) and path not in WHOLE:
        out = dict(base)
        for key, value in top.items():
            out[key] = _merge(base[key], value, (*path, key)) if key in base else value
        return out
    return copy.deepcopy(top)


def merge_sessions(*layers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Later layers override earlier ones, by the rules above (no bound is checked)."""
    out: dict[str, Any] = {}
    for layer in layers:
        if layer:
            out = _merge(out, dict(layer), ())
    return out


def merge_update(session: Mapping[str, Any] | None, update: Mapping[str, Any]) -> dict[str, Any]:
    """The session after `update` (a ``session.update``'s ``session``), within the bounds;
    `SessionConfigError` if the result would break one (`session` is left as it was)."""
    if _depth(update) > MAX_DEPTH:  # before merging: a deep update is not walked twice
        raise SessionConfigError(400, "session is nested too deeply")
    out = merge_sessions(session, update)
    check_bounds(out)
    return out


NOISE_REDUCTION_KINDS = ("near_field", "far_field")
UNSET = "unset"  # (what `noise_reduction` says of a session that names none)


def noise_reduction(session: Mapping[str, Any] | None) -> str | None:
    """What a session (or an update) asks of the input's noise reduction: ``near_field`` or
    ``far_field``, None for off (``null``), `UNSET` when it does not say. The GA field
    (``audio.input.noise_reduction``) wins over the beta one (``input_audio_noise_reduction``).
    `SessionConfigError` (400) for anything but ``null`` or ``{"type": <a kind>}``."""
    if not session:
        return UNSET
    audio = session.get("audio")
    audio_in = audio.get("input") if isinstance(audio, dict) else None
    if isinstance(audio_in, dict) and "noise_reduction" in audio_in:
        value = audio_in["noise_reduction"]
    elif "input_audio_noise_reduction" in session:
        value = session["input_audio_noise_reduction"]
    else:
        return UNSET
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in NOISE_REDUCTION_KINDS:
        raise SessionConfigError(
            400, 'noise_reduction must be null or {"type": "near_field" | "far_field"}'
        )
    return str(kind)
