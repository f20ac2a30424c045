"""WebSocket framing (RFC 6455 §5), both ends, after the opening handshake: pure, no I/O.

The agent link carries a 20 ms frame every 20 ms each way for every call, so the framing is
on the media path. This codec frames a whole message in one step (the client's masking one
pass over the payload: `shared/speedups.py`) and parses what arrives into whole messages,
pings, pongs and closes, where wsproto walks a generator chain per frame (measured: about 13
us to send and 13 us to receive a 1920-byte frame with wsproto, 2 us each here). The
handshake stays wsproto's; `split_handshake` cuts what follows it off for this reader.

Strategy: `encode_frame` builds one frame; `WebSocketReader.feed` buffers bytes and returns
the events the complete frames in them make. No extension is ever negotiated, so RSV bits
are errors; a message is bounded (`max_message`) before its payload is buffered.

Errors (each carries the close code to answer with, §7.4.1):

    WebSocketError
    ├── ProtocolViolation   1002: a frame no peer may send (bad opcode, RSV, masking, ...)
    ├── InvalidText         1007: a text message or close reason that is not UTF-8
    └── MessageTooBig       1009: a message over the reader's bound
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from firsthop.shared.speedups import mask as mask  # (the codec's: RFC 6455 §5.3)

# RFC 6455 §5.2 opcodes
CONTINUATION = 0x0
TEXT = 0x1
BINARY = 0x2
CLOSE = 0x8
PING = 0x9
PONG = 0xA
DATA_OPCODES = (TEXT, BINARY)
CONTROL_OPCODES = (CLOSE, PING, PONG)
MAX_CONTROL_PAYLOAD = 125  # §5.5
FIN = 0x80
MASK = 0x80
RSV = 0x70
NO_STATUS = 1005  # §7.4.1: a Close with no code (never sent in a Close frame)
# §7.4.1-7.4.2: the codes a Close frame may carry: the RFC's own (not 1004, reserved, nor
# 1005, 1006 and 1015, never sent), 1012-1014 from the IANA registry (§11.7), and 3000-4999
# (registered and private use); 1016-2999 are reserved for this RFC's successors.
CLOSE_CODES = frozenset((*range(1000, 1004), *range(1007, 1015), *range(3000, 5000)))
HEADER_END = b"\r\n\r\n"  # the handshake's HTTP head ends here (RFC 9112 §2.1)


class WebSocketError(Exception):
    code = 1002

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.events: list[Event] = []  # what the frames before the bad one made (still good)


class ProtocolViolation(WebSocketError):
    code = 1002


class InvalidText(WebSocketError):
    code = 1007


class MessageTooBig(WebSocketError):
    code = 1009


@dataclass(frozen=True, slots=True)
class Ping:
    payload: bytes


@dataclass(frozen=True, slots=True)
class Pong:
    payload: bytes


@dataclass(frozen=True, slots=True)
class Close:
    code: int  # NO_STATUS if the frame had none
    reason: str


Event = str | bytes | Ping | Pong | Close  # a whole text or binary message, or a control frame


def encode_frame(opcode: int, payload: bytes, key: bytes | None = None) -> bytes:
    """One final frame: a client masks with `key` (4 unpredictable bytes), a server does not."""
    n = len(payload)
    bit = MASK if key is not None else 0
    if n < 126:
        head = bytes((FIN | opcode, bit | n))
    elif n < 1 << 16:
        head = struct.pack("!BBH", FIN | opcode, bit | 126, n)
    else:
        head = struct.pack("!BBQ", FIN | opcode, bit | 127, n)
    if key is None:
        return head + payload
    return head + key + mask(payload, key)


def close_payload(code: int, reason: str = "") -> bytes:
    """A Close frame's payload (§5.5.1): none for NO_STATUS, else the code and the reason
    (cut to fit the frame, at a character boundary: §5.5.1 has it UTF-8)."""
    if code == NO_STATUS:
        return b""
    data = reason.encode()
    if len(data) > MAX_CONTROL_PAYLOAD - 2:
        data = data[: MAX_CONTROL_PAYLOAD - 2].decode(errors="ignore").encode()
    return struct.pack("!H", code) + data


def split_handshake(data: bytes) -> tuple[bytes, bytes] | None:
    """The handshake's HTTP head (with its blank line) and what came after it; None if the
    head is not complete yet. Neither the upgrade request nor the 101 has a body."""
    end = data.find(HEADER_END)
    if end < 0:
        return None
    end += len(HEADER_END)
    return data[:end], data[end:]


class WebSocketReader:
    """Frames in, events out. `masked`: whether the peer must mask (it is a client).

    A frame that has not all arrived waits as the pieces it came in, joined once the bytes
    its header asks for are there: a frame trickled in a byte at a time costs one copy, not
    one per piece. A fragmented message gathers in one buffer, never more than `max_message`
    (its fragments' count costs nothing: empty ones add nothing)."""

    def __init__(self, *, masked: bool, max_message: int) -> None:
        self.masked = masked
        self.max_message = max_message
        self._pending: list[bytes] = []  # the start of a frame not complete yet, as it came
        self._have = 0  # bytes in `_pending`
        self._want = 0  # bytes that frame needs before it can be read further
        self._opcode: int | None = None  # the data message being reassembled
        self._message = bytearray()  # its fragments so far

    def feed(self, data: bytes, limit: int | None = None) -> list[Event]:
        """The events the complete frames buffered so far make (`WebSocketError` if the
        peer broke the protocol: the connection is then over; the error carries the events
        of the frames before the bad one). With `limit`, at most that many frames are read
        (control frames and fragments count): the rest stay buffered, `more` says so, and
        the next `feed` (of b"" if nothing new came) goes on from there."""
        if limit is not None and limit < 1:
            raise ValueError(f"a frame limit must be 1 or more, not {limit}")
        data = data if type(data) is bytes else bytes(data)  # (messages are bytes)
        if self._pending:
            if data:
                self._pending.append(data)
                self._have += len(data)
            if self._have < self._want:
                return []
            buffer = b"".join(self._pending) if len(self._pending) > 1 else self._pending[0]
        else:
            buffer = data
        events: list[Event] = []
        offset = 0
        left = -1 if limit is None else limit
        try:
            while left:
                frame = self._frame(buffer, offset)
                if frame is None:
                    break
                left -= 1
                offset, fin, opcode, payload = frame
                event = self._event(fin, opcode, payload)
                if event is not None:
                    events.append(event)
            else:
                self._want = 0  # (stopped at the limit: what is left may be whole frames)
        except WebSocketError as exc:
            exc.events = events
            self._pending, self._have = [], 0
            raise
        self._have = len(buffer) - offset
        self._pending = [buffer[offset:]] if self._have else []
        return events

    @property
    def more(self) -> bool:
        """Whether a `feed` limited by its `limit` left frames buffered that may be whole."""
        return self._have > 0 and self._want == 0

    def _frame(self, buf: bytes, at: int) -> tuple[int, bool, int, bytes] | None:
        """The frame at `at` (its end, FIN, opcode, unmasked payload); None if incomplete
        (`_want` then says how many bytes from `at` it takes to read it further)."""
        if len(buf) - at < 2:
            self._want = 2
            return None
        first, second = buf[at], buf[at + 1]
        if first & RSV:
            raise ProtocolViolation("RSV bits set with no extension negotiated")
        opcode = first & 0x0F
        fin = bool(first & FIN)
        if opcode in CONTROL_OPCODES:
            if not fin:
                raise ProtocolViolation("fragmented control frame")
        elif opcode not in DATA_OPCODES and opcode != CONTINUATION:
            raise ProtocolViolation(f"unknown opcode {opcode}")
        if bool(second & MASK) != self.masked:
            raise ProtocolViolation("client frame unmasked" if self.masked else "server masked")
        n = second & 0x7F
        pos = at + 2
        if n == 126:
            if len(buf) - pos < 2:
                self._want = 4
                return None
            (n,) = struct.unpack_from("!H", buf, pos)
            if n < 126:  # §5.2: "the minimal number of bytes MUST be used"
                raise ProtocolViolation("payload length not in its shortest form")
            pos += 2
        elif n == 127:
            if len(buf) - pos < 8:
                self._want = 10
                return None
            (n,) = struct.unpack_from("!Q", buf, pos)
            if n >> 63:
                raise ProtocolViolation("payload length with its top bit set")
            if n < 1 << 16:
                raise ProtocolViolation("payload length not in its shortest form")
            pos += 8
        if opcode in CONTROL_OPCODES:
            if n > MAX_CONTROL_PAYLOAD:
                raise ProtocolViolation("control frame over 125 bytes")
        elif len(self._message) + n > self.max_message:
            raise MessageTooBig(f"message over {self.max_message} bytes")
        key = b""
        if self.masked:
            if len(buf) - pos < 4:
                self._want = pos + 4 - at
                return None
            key = buf[pos : pos + 4]
            pos += 4
        if len(buf) - pos < n:
            self._want = pos + n - at
            return None
        payload = buf[pos : pos + n]
        return pos + n, fin, opcode, mask(payload, key) if key else payload

    def _event(self, fin: bool, opcode: int, payload: bytes) -> Event | None:
        if opcode == PING:
            return Ping(payload)
        if opcode == PONG:
            return Pong(payload)
        if opcode == CLOSE:
            return _close(payload)
        if opcode == CONTINUATION:
            if self._opcode is None:
                raise ProtocolViolation("continuation frame with no message started")
        elif self._opcode is not None:
            raise ProtocolViolation("new message before the last one finished")
        else:
            self._opcode = opcode
        if not fin:
            self._message += payload
            return None
        if self._message:
            self._message += payload
            payload = bytes(self._message)
            self._message.clear()
        opcode, self._opcode = self._opcode, None
        if opcode == BINARY:
            return payload
        try:
            return payload.decode()
        except UnicodeDecodeError as exc:
            raise InvalidText("text message not UTF-8") from exc


def _close(payload: bytes) -> Close:
    if not payload:
        return Close(NO_STATUS, "")
    if len(payload) == 1:
        raise ProtocolViolation("Close payload of one byte")
    (code,) = struct.unpack_from("!H", payload)
    if code not in CLOSE_CODES:
        raise ProtocolViolation(f"Close code {code}, which no peer may send")
    try:
        return Close(code, payload[2:].decode())
    except UnicodeDecodeError as exc:
        raise InvalidText("Close reason not UTF-8") from exc
