"""A WebSocket connection's rules after the opening handshake (RFC 6455 §5.5, §7), for
either end: sans-IO, one owner for what the agents' server (`services/agent/connection.py`,
Trio) and the transceiver's agent link (`services/transceiver/rtc/agent_link.py`, asyncio)
both do.

    conn = WebSocketConnection(client=True, max_message=1 << 20)
    messages = conn.receive_data(data)   # whole messages, in order
    out = conn.data_to_send()            # the Pong and the Close these frames called for
    frame = conn.send(message)           # one frame to write (ConnectionEnded once closing)
    frame = conn.close(1000)             # our Close (b"": one was sent already)
    conn.ended                           # None while open; then why it is over

The rules: Pings are answered with one Pong carrying the payload of the latest not yet
answered (§5.5.3: a burst of them costs one frame back); a Close is answered once,
echoing its code (§5.5.1), and ends the connection: nothing after it is read; a frame that
breaks the protocol, or a message over `max_message`, ends it too, after the messages that
came before it, and is answered with a Close carrying the violation's code (§7.1.7, §7.4.1);
once our Close is sent no message may be (§5.5.1). A client masks every frame it sends
with a fresh key (§5.3), a server none. The I/O layers keep what is theirs: sockets, TLS,
backlogs, and how long to wait for the peer's Close.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from firsthop.shared.wire.websocket import (
    BINARY,
    CLOSE,
    PONG,
    TEXT,
    Close,
    MessageTooBig,
    Ping,
    WebSocketError,
    WebSocketReader,
    close_payload,
    encode_frame,
)

# Why a connection ended (`Ended.how`)
PEER_CLOSED = "peer_closed"  # the peer's Close frame
VIOLATION = "violation"  # the peer broke the protocol (a bad frame, invalid text)
TOO_BIG = "too_big"  # a message over the bound
LOST = "lost"  # the socket went away without a Close


class ConnectionEnded(Exception):
    """The connection is closing or closed: no message may be sent."""


@dataclass(frozen=True, slots=True)
class Ended:
    how: str  # PEER_CLOSED, VIOLATION, TOO_BIG or LOST
    code: int  # the Close code received (PEER_CLOSED) or answered with (VIOLATION, TOO_BIG)
    reason: str = ""


class MaskKeys:
    """A client's masking keys (RFC 6455 §5.3: 4 bytes each, unpredictable, from a strong
    source), drawn from `os.urandom` `batch` at a time: one getrandom(2) per `batch` frames
    instead of one per frame (at 8 echo calls that was 4,079 of the transceiver's 25,696
    syscalls in 10 s, stop 51). Each key is handed out once."""

    def __init__(self, batch: int = 1024, source: Callable[[int], bytes] = os.urandom) -> None:
        self._batch, self._source = batch, source
        self._pool, self._at = b"", 0

    def __call__(self) -> bytes:
        at = self._at
        if at >= len(self._pool):
            self._pool, at = self._source(4 * self._batch), 0
        self._at = at + 4
        return self._pool[at : at + 4]


mask_keys = MaskKeys()  # (the process's: every connection on the loop thread draws from it)


class WebSocketConnection:
    """One open WebSocket's state (see the module docstring)."""

    def __init__(
        self,
        *,
        client: bool,
        max_message: int,
        mask_key: Callable[[], bytes] = mask_keys,
    ) -> None:
        self._key = mask_key if client else None
        self._reader = WebSocketReader(masked=not client, max_message=max_message)
        self._pong: bytes | None = None  # the latest Ping's payload, not yet answered
        self._close: tuple[int, str] | None = None  # a Close to answer with, not yet taken
        self.close_sent = False
        self.ended: Ended | None = None

    def _frame(self, opcode: int, payload: bytes) -> bytes:
        return encode_frame(opcode, payload, self._key() if self._key is not None else None)

    def receive_data(self, data: bytes, limit: int | None = None) -> list[str | bytes]:
        """The whole messages `data` completes, in order; control frames are dealt with
        (their answers wait in `data_to_send`). Nothing is read once the connection ended.
        `limit`: read at most that many frames now (`more` then says whether some wait)."""
        if self.ended is not None:
            return []
        failure: WebSocketError | None = None
        try:
            events = self._reader.feed(data, limit)
        except WebSocketError as exc:
            events, failure = exc.events, exc  # (the frames before the bad one stand)
        messages: list[str | bytes] = []
        for event in events:
            if isinstance(event, (str, bytes)):
                messages.append(event)
            elif isinstance(event, Ping):
                # RFC 6455 §5.5.3: only the most recent Ping not yet answered is: a peer's
                # burst of Pings costs one Pong, not one each (and no more than it sent)
                self._pong = event.payload
            elif isinstance(event, Close):
                self._answer_close(event.code, "")
                self.ended = Ended(PEER_CLOSED, event.code, event.reason)
                return messages
            # (a Pong needs nothing)
        if failure is not None:
            self._answer_close(failure.code, failure.reason)
            how = TOO_BIG if isinstance(failure, MessageTooBig) else VIOLATION
            self.ended = Ended(how, failure.code, failure.reason)
        return messages

    @property
    def more(self) -> bool:
        """Whether frames a limited `receive_data` did not read wait (read them with b"")."""
        return self.ended is None and self._reader.more

    def _answer_close(self, code: int, reason: str) -> None:
        # framed when taken (`data_to_send`): until then the messages that came before it
        # may still be answered (§5.5.1: a Close may wait for the current message)
        if self._close is None and not self.close_sent:
            self._close = (code, reason)

    def data_to_send(self) -> bytes:
        """What the frames received so far call for (a Pong, then a Close), to write now."""
        if self._pong is None and self._close is None:
            return b""  # (the common case: asked after every read, on the media path)
        out = b""
        if self._pong is not None:
            out, self._pong = self._frame(PONG, self._pong), None
        if self._close is not None:
            code, reason = self._close
            self._close, self.close_sent = None, True
            out += self._frame(CLOSE, close_payload(code, reason))
        return out

    def send(self, message: str | bytes) -> bytes:
        """The frame for one whole message; `ConnectionEnded` once our Close is sent."""
        if self.close_sent:
            raise ConnectionEnded
        if isinstance(message, str):
            return self._frame(TEXT, message.encode())
        return self._frame(BINARY, message)

    def close(self, code: int = 1000, reason: str = "") -> bytes:
        """Our Close frame, behind the answers still queued (b"": nothing, our Close went
        already; the answer to a peer's Close, when one is due, is the Close)."""
        self._answer_close(code, reason)
        return self.data_to_send()

    def connection_lost(self) -> None:
        """The socket went away (EOF, an error): the connection ended without a Close."""
        if self.ended is None:
            self.ended = Ended(LOST, 1006)
