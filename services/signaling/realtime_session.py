"""The pure parts of the OpenAI-compatible Realtime API (`realtime_api`): no I/O, time passed in.

* `secret_request`: the body of ``POST /v1/realtime/client_secrets`` -> (lifetime, session).
* `merge_sessions` (`shared.session_config`, the one merge rule, the transceiver's too): an
  ephemeral key's bound session, overridden by the call's own (the multipart ``session``
  part, ``?model=``).
* `describe_session`: the session object OpenAI answers with (``object: realtime.session``,
  an ``id``, defaults filled). Settings we cannot honour are accepted and reflected as given.
* `choose_agent`: ``session.model`` naming an ``--agent-url`` NAME, else ``?agent=``, else
  ``--default-agent``, else no agent.
* `parse_multipart`: a strict, bounded ``multipart/form-data`` reader for the parts ``sdp``
  and ``session``.
* `openai_error`: OpenAI's error body ``{"error": {"message", "type", "param", "code"}}``.

Every failure is a `Problem` (400, 413) whose reason says what was wrong.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from firsthop.services.signaling.errors import Problem
from firsthop.shared.session_config import (
    SessionConfigError,
    check_bounds,
    merge_sessions,
    noise_reduction,
)

MIN_EXPIRY, MAX_EXPIRY, DEFAULT_EXPIRY = 10, 7200, 600
DEFAULT_MODEL = "gpt-realtime"
MAX_PARTS = 8
MAX_PART_HEADERS = 8
MAX_HEADER_LINE = 1024
BOUNDARY = re.compile(r"^[0-9A-Za-z'()+_,\-./:=? ]{1,70}$")  # RFC 2046 bchars


def _defaults() -> dict[str, Any]:
    pcm = {"type": "audio/pcm", "rate": 24000}
    return {
        "type": "realtime",
        "model": DEFAULT_MODEL,
        "output_modalities": ["audio"],
        "instructions": "",
        "tools": [],
        "tool_choice": "auto",
        "max_output_tokens": "inf",
        "tracing": None,
        "truncation": "auto",
        "prompt": None,
        "include": None,
        "audio": {
            "input": {
                "format": dict(pcm),
                "transcription": None,
                "noise_reduction": None,
                "turn_detection": {
                    "type": "server_vad",
                    "threshold": 0.5,
                    "prefix_padding_ms": 300,
                    "silence_duration_ms": 200,
                    "idle_timeout_ms": None,
                    "create_response": True,
                    "interrupt_response": True,
                },
            },
            "output": {"format": dict(pcm), "voice": "alloy", "speed": 1.0},
        },
    }


def check_session(value: object, where: str = "session") -> dict[str, Any]:
    """A caller's session object: a JSON object of at most 16 KiB, type "realtime" (or none)."""
    if not isinstance(value, dict):
        raise Problem(400, f"{where} must be a JSON object")
    try:
        check_bounds(value, where)
    except SessionConfigError as exc:
        raise Problem(exc.status, exc.reason) from None
    try:
        noise_reduction(value)  # a kind the transceiver runs, or null
    except SessionConfigError as exc:
        raise Problem(exc.status, f"{where}: {exc.reason}") from None
    kind = value.get("type", "realtime")
    if kind != "realtime":
        raise Problem(400, f'{where}.type must be "realtime" (transcription sessions: no)')
    model = value.get("model")
    if model is not None and (not isinstance(model, str) or not 0 < len(model) <= 128):
        raise Problem(400, f"{where}.model must be a string of 1..128 characters")
    return value


def refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # (Python's json takes NaN and Infinity)


def finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e999: Infinity all the same
        raise ValueError(f"{text[:32]} is out of range")
    return value


def loads_strict(text: str) -> Any:
    """JSON as RFC 8259 has it: no NaN or Infinity, not even as a number too big for a
    double (`1e999`), since each would be written back (an echo, a body sent on) as
    `Infinity`, which is not JSON. A ValueError (or RecursionError) for anything else."""
    return json.loads(text, parse_constant=refuse_constant, parse_float=finite_float)


def parse_json_object(raw: bytes, what: str) -> dict[str, Any]:
    try:  # (NaN and Infinity refused: they would be echoed back as invalid JSON)
        value = loads_strict(raw.decode("utf-8"))
    except (ValueError, RecursionError):  # (UnicodeDecodeError is a ValueError) "[[[..."
        raise Problem(400, f"{what} is not valid JSON") from None
    if not isinstance(value, dict):
        raise Problem(400, f"{what} must be a JSON object")
    return value


def secret_request(raw: bytes) -> tuple[int, dict[str, Any]]:
    """The body of POST /v1/realtime/client_secrets (empty: all defaults) ->
    (seconds until expiry, the caller's session config)."""
    body = parse_json_object(raw, "body") if raw.strip() else {}
    unknown = set(body) - {"expires_after", "session"}
    if unknown:
        raise Problem(400, f"unknown parameter {sorted(unknown)[0][:40]!r}")
    seconds = DEFAULT_EXPIRY
    expires = body.get("expires_after")
    if expires is not None:
        if not isinstance(expires, dict):
            raise Problem(400, "expires_after must be an object")
        if expires.get("anchor", "created_at") != "created_at":
            raise Problem(400, 'expires_after.anchor must be "created_at"')
        given = expires.get("seconds", DEFAULT_EXPIRY)
        if not isinstance(given, int) or isinstance(given, bool):
            raise Problem(400, "expires_after.seconds must be an integer")
        if not MIN_EXPIRY <= given <= MAX_EXPIRY:
            raise Problem(
                400, f"expires_after.seconds must be between {MIN_EXPIRY} and {MAX_EXPIRY}"
            )
        seconds = given
    session = body.get("session")
    return seconds, check_session({} if session is None else session)


def describe_session(session: Mapping[str, Any], *, expires_at: int = 0) -> dict[str, Any]:
    """OpenAI's session object for a caller's config: defaults filled, a fresh ``sess_`` id."""
    described = merge_sessions(_defaults(), session)
    described.pop("id", None)
    described.pop("object", None)
    return {
        "object": "realtime.session",
        "id": "sess_" + secrets.token_urlsafe(16),
        **described,
        "type": "realtime",
        "expires_at": expires_at,
    }


def choose_agent(
    model: str | None, query_agent: str | None, agents: Mapping[str, str], default: str | None
) -> str | None:
    """Which --agent-url NAME serves the call (None: no agent, the call is silent)."""
    if model and model in agents:
        return model
    if query_agent:
        return query_agent  # unknown: Calls.agent_url answers 400
    return default


@dataclass(frozen=True)
class Part:
    name: str
    content_type: str
    data: bytes


def _param(header: str, name: str) -> str | None:
    for item in header.split(";")[1:]:
        key, sep, value = item.strip().partition("=")
        if sep and key.strip().lower() == name:
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            return value
    return None


def boundary_of(content_type: str) -> str:
    boundary = _param(content_type, "boundary")
    if boundary is None or not BOUNDARY.match(boundary) or boundary.endswith(" "):
        raise Problem(400, "multipart/form-data without a valid boundary")
    return boundary


def parse_multipart(raw: bytes, content_type: str) -> dict[str, Part]:
    """Named parts of a multipart/form-data body (at most `MAX_PARTS`, each name once)."""
    delimiter = b"--" + boundary_of(content_type).encode()
    chunks = raw.split(delimiter)
    if len(chunks) < 3:
        raise Problem(400, "multipart body has no parts")
    if len(chunks) - 2 > MAX_PARTS:
        raise Problem(400, f"multipart body has over {MAX_PARTS} parts")
    if chunks[0] not in (b"", b"\r\n"):  # a preamble: nothing we send, nothing we take
        raise Problem(400, "multipart body does not start with its boundary")
    if not chunks[-1].startswith(b"--"):
        raise Problem(400, "multipart body is not terminated")
    parts: dict[str, Part] = {}
    for chunk in chunks[1:-1]:
        if not chunk.startswith(b"\r\n") or not chunk.endswith(b"\r\n"):
            raise Problem(400, "malformed multipart part")
        head, sep, data = chunk[2:-2].partition(b"\r\n\r\n")
        if not sep:
            raise Problem(400, "multipart part without a blank line after its headers")
        part = _part(head, data)
        if part.name in parts:
            raise Problem(400, f"multipart field {part.name[:40]!r} given twice")
        parts[part.name] = part
    return parts


def _part(head: bytes, data: bytes) -> Part:
    lines = head.split(b"\r\n") if head else []
    if len(lines) > MAX_PART_HEADERS or any(len(line) > MAX_HEADER_LINE for line in lines):
        raise Problem(400, "multipart part headers too long")
    headers: dict[str, str] = {}
    for line in lines:
        try:
            text = line.decode("ascii")
        except UnicodeDecodeError:
            raise Problem(400, "multipart part header is not ASCII") from None
        key, sep, value = text.partition(":")
        if not sep:
            raise Problem(400, "malformed multipart part header")
        headers[key.strip().lower()] = value.strip()
    disposition = headers.get("content-disposition", "")
    if disposition.split(";")[0].strip().lower() != "form-data":
        raise Problem(400, "multipart part without Content-Disposition: form-data")
    name = _param(disposition, "name")
    if not name:
        raise Problem(400, "multipart part without a name")
    content_type = headers.get("content-type", "text/plain").split(";")[0].strip().lower()
    return Part(name, content_type, data)


ERROR_TYPES = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "forbidden"),
    404: ("invalid_request_error", "not_found"),
    405: ("invalid_request_error", "method_not_allowed"),
    408: ("invalid_request_error", "timeout"),
    413: ("invalid_request_error", "request_too_large"),
    415: ("invalid_request_error", "unsupported_media_type"),
    429: ("rate_limit_exceeded", "rate_limit_exceeded"),
}


def openai_error(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error body for a status."""
    kind, code = ERROR_TYPES.get(status, ("server_error", None))
    if status in (502, 503, 504):
        kind, code = "server_error", "service_unavailable"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
