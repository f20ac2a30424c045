"""Twilio Media Streams' message vocabulary as data, and the bookkeeping of marks: pure.

What Twilio sends a bot (its "Media Streams: WebSocket messages" page), text frames of JSON:
`connected` {protocol "Call", version "1.0.0"}; `start` (sequenceNumber "1", the stream's
`streamSid` "MZ...", `start`: accountSid "AC...", callSid "CA...", tracks ["inbound"],
customParameters, mediaFormat audio/x-mulaw 8000 Hz mono); `media` (20 ms of base64 μ-law:
track "inbound", chunk, timestamp in ms from the stream's start); `mark` (a bot's mark, echoed
once the audio before it was played); `stop`. Counters are decimal strings, as Twilio sends.

What a bot sends: `media` (base64 μ-law 8 kHz, any length), `mark` {name}, `clear`. Parsing
one gives a `BotMedia`, `BotMark`, `BotClear`, or a `BadInput` naming the counter it goes to
(`twilio_*`): never an exception.

`MarkLedger` decides when a mark is echoed: each mark waits for the frames queued before it
to leave the output queue (played, or dropped at its bound); one with nothing queued before
it is due at once; a clear makes every pending mark due at once (as Twilio does).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets
from collections import deque
from dataclasses import dataclass
from typing import Any

PROTOCOL, VERSION = "Call", "1.0.0"
ENCODING, RATE, CHANNELS = "audio/x-mulaw", 8000, 1
TRACK = "inbound"
# Characters of one message from the bot: 64 KiB of base64 is 6 s of μ-law. Bots send a
# frame or a sentence at a time; a bigger message cost the shared loop its decoding before
# the queue (30 s) dropped most of it.
MAX_MESSAGE = 64 * 1024
MAX_MARK_NAME = 256  # characters: a mark's name is held until its audio plays, then echoed
MAX_MARKS = 256  # marks waiting for their audio to be played
ACCOUNT_SID = "AC" + "0" * 32  # no Twilio account is involved: a well-formed placeholder


def sid(prefix: str, seed: str | None = None) -> str:
    """A Twilio-shaped id: two letters and 32 hex digits (from `seed`, or random)."""
    digits = hashlib.sha256(seed.encode()).hexdigest() if seed is not None else secrets.token_hex()
    return prefix + digits[:32]


def connected() -> str:
    return json.dumps({"event": "connected", "protocol": PROTOCOL, "version": VERSION})


def start(seq: int, stream_sid: str, call_sid: str, custom: dict[str, str]) -> str:
    body = {
        "accountSid": ACCOUNT_SID,
        "streamSid": stream_sid,
        "callSid": call_sid,
        "tracks": [TRACK],
        "customParameters": custom,
        "mediaFormat": {"encoding": ENCODING, "sampleRate": RATE, "channels": CHANNELS},
    }
    msg = {"event": "start", "sequenceNumber": str(seq), "start": body, "streamSid": stream_sid}
    return json.dumps(msg)


def media(seq: int, stream_sid: str, chunk: int, timestamp_ms: int, ulaw: bytes) -> str:
    body = {
        "track": TRACK,
        "chunk": str(chunk),
        "timestamp": str(timestamp_ms),
        "payload": base64.b64encode(ulaw).decode(),
    }
    msg = {"event": "media", "sequenceNumber": str(seq), "media": body, "streamSid": stream_sid}
    return json.dumps(msg)


def mark(seq: int, stream_sid: str, name: str) -> str:
    msg = {"event": "mark", "sequenceNumber": str(seq), "streamSid": stream_sid}
    return json.dumps({**msg, "mark": {"name": name}})


def dtmf(seq: int, stream_sid: str, digit: str) -> str:
    """A key the caller pressed (Twilio sends these for `<Connect><Stream>` calls)."""
    body = {"track": "inbound_track", "digit": digit}
    return json.dumps(
        {"event": "dtmf", "sequenceNumber": str(seq), "streamSid": stream_sid, "dtmf": body}
    )


def stop(seq: int, stream_sid: str, call_sid: str) -> str:
    body = {"accountSid": ACCOUNT_SID, "callSid": call_sid}
    msg = {"event": "stop", "sequenceNumber": str(seq), "streamSid": stream_sid, "stop": body}
    return json.dumps(msg)


# -- what the bot sends ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BotMedia:
    ulaw: bytes


@dataclass(frozen=True, slots=True)
class BotMark:
    name: str


@dataclass(frozen=True, slots=True)
class BotClear:
    pass


@dataclass(frozen=True, slots=True)
class BadInput:
    reason: str  # the counter


BotMessage = BotMedia | BotMark | BotClear | BadInput


def parse(message: str | bytes, stream_sid: str) -> BotMessage:
    """One message from the bot. A `streamSid` other than the call's is refused; one left out
    is taken as the call's (home-made bots often omit it)."""
    if isinstance(message, bytes):
        return BadInput("twilio_binary")
    if len(message) > MAX_MESSAGE:
        return BadInput("twilio_oversize")
    try:
        msg: Any = json.loads(message)
    except (ValueError, RecursionError):
        return BadInput("twilio_not_json")
    if not isinstance(msg, dict) or not isinstance(msg.get("event"), str):
        return BadInput("twilio_unknown_event")
    if msg.get("streamSid", stream_sid) != stream_sid:
        return BadInput("twilio_wrong_stream")
    kind = msg["event"]
    if kind == "media":
        body = msg.get("media")
        payload = body.get("payload") if isinstance(body, dict) else None
        if not isinstance(payload, str):
            return BadInput("twilio_missing_fields")
        try:
            return BotMedia(base64.b64decode(payload, validate=True))
        except (binascii.Error, ValueError):
            return BadInput("twilio_bad_base64")
    if kind == "mark":
        body = msg.get("mark")
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str):
            return BadInput("twilio_missing_fields")
        if len(name) > MAX_MARK_NAME:
            return BadInput("twilio_mark_name_too_long")
        return BotMark(name)
    if kind == "clear":
        return BotClear()
    return BadInput("twilio_unknown_event")


# -- marks ---------------------------------------------------------------------------------------


class MarkLedger:
    """Frames queued and frames gone from the output queue, counted since the stream began;
    each pending mark is due once `left` reaches the count queued before it (FIFO queue)."""

    def __init__(self) -> None:
        self.queued = 0  # frames handed to the output queue
        self.left = 0  # of those, frames played or dropped
        self.pending: deque[tuple[int, str]] = deque()  # (frames before it, name)

    @property
    def idle(self) -> bool:
        """Nothing of the bot's is waiting to be played."""
        return self.left >= self.queued

    def add_frames(self, n: int) -> None:
        self.queued += n

    def add(self, name: str, position: int) -> list[str] | None:
        """A mark behind `position` frames: the marks due now (this one, if nothing it waits
        for is still queued); None if too many marks wait (it is dropped)."""
        if position <= self.left and not self.pending:
            return [name]
        if len(self.pending) >= MAX_MARKS:
            return None
        self.pending.append((position, name))
        return []

    def frame_left(self) -> list[str]:
        """One frame left the queue (played or dropped): the marks due now, in order."""
        self.left = min(self.queued, self.left + 1)
        due: list[str] = []
        while self.pending and self.pending[0][0] <= self.left:
            due.append(self.pending.popleft()[1])
        return due

    def clear(self) -> list[str]:
        """The queue was emptied: every pending mark is due, in order."""
        self.left = self.queued
        due = [name for _, name in self.pending]
        self.pending.clear()
        return due
