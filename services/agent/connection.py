"""The reference agents' WebSocket server: one Trio task per socket, framing by
`shared/wire/websocket.py`.

Strategy: the connection's own task reads the socket when it asks for a message; there is no
reader task and no message queue between the socket and the handler (trio-websocket's design),
so a 20 ms frame in and its echo out cost one read and one write on the stream's Trio socket
(no stream layer per frame either; a read that emptied the socket waits for it before the
next, so it does not try and fail first) and no task switch (measured: that hop and wsproto's
framing took about half the agent's CPU per call). A send the socket's buffer takes whole is
written at once, without a pass of Trio's scheduler; only the rest of a larger one waits.
wsproto reads the upgrade request and writes the 101; the frames after it are the codec's.
Ping is answered, Close is answered and ends the connection, a protocol error or a message
over `max_message` closes it with the error's code (RFC 6455 §7.4.1).

Invariants: one task receives (`get_message`); sends may come from several (`send_message`
holds a lock while it waits, and never writes while another holds it); after
`ConnectionClosed` every call raises it again. A send the socket takes whole is not a Trio
checkpoint: a task that only sends must yield elsewhere (the agents pace their frames with
`trio.sleep_until`, or read between them), and `get_message` yields every `YIELD_EVERY`
messages it hands out of one read (one read can hold thousands of tiny frames, and a
handler that answers each would otherwise hold the loop for all of them), and parses a
read's frames `PARSE_EVERY` at a time, yielding between. A cancelled send
writes nothing; a send cut off after part of its frame went out closes the connection
(the next frame would land inside that one).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Awaitable, Callable

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, RejectConnection, Request
from wsproto.utilities import RemoteProtocolError

from firsthop.shared.wire.websocket import split_handshake
from firsthop.shared.wire.websocket_connection import (
    TOO_BIG,
    VIOLATION,
    ConnectionEnded,
    Ended,
    WebSocketConnection,
)

RECEIVE_SIZE = 16384  # bytes a read takes
# Frames of a read parsed between passes of Trio's scheduler (control frames count): the
# rest wait in the connection and the socket is not read before they are parsed, so a read
# of thousands of tiny frames (Pings, which hand out no message) holds the loop for 64 at
# a time, not for all of them.
PARSE_EVERY = 64
MAX_HANDSHAKE = 16384  # bytes of upgrade request
HANDSHAKE_TIMEOUT = 60.0  # seconds for a client to send its upgrade request
CLOSE_TIMEOUT = 2.0  # seconds to wait for the peer's Close after ours
YIELD_EVERY = 16  # messages handed out of one read between passes of Trio's scheduler

log = logging.getLogger("firsthop.agent")


class ConnectionClosed(Exception):
    """The WebSocket is closed (by either side, or the socket went away)."""


class AgentConnection:
    """One accepted WebSocket (see the module docstring): the I/O around the connection's
    rules, which are `WebSocketConnection`'s."""

    def __init__(self, stream: trio.SocketStream, max_message: int, early: bytes = b"") -> None:
        self._stream = stream
        self._sock = stream.socket  # the per-frame reads and writes skip the stream's layer
        self._ws = WebSocketConnection(client=False, max_message=max_message)
        self._messages: deque[str | bytes] = deque()
        self._early = early  # what came right behind the upgrade request
        self._send_lock = trio.Lock()
        self._unyielded = 0  # messages handed out since the last read
        self._drained = False  # the last read took less than it asked: wait before the next
        self.closed = False

    async def get_message(self) -> str | bytes:
        """The next whole message; `ConnectionClosed` once the WebSocket is closed."""
        ws = self._ws
        while True:
            if self._messages:
                self._unyielded += 1
                if self._unyielded >= YIELD_EVERY:
                    self._unyielded = 0
                    await trio.lowlevel.checkpoint()
                return self._messages.popleft()
            # a Pong, the answer to a Close or to a bad frame (once a read's frames are all
            # parsed: one Pong for its Pings)
            answers = ws.data_to_send() if not ws.more else b""
            if answers:
                await self._send(answers)
            if ws.ended is not None:
                if ws.ended.how in (VIOLATION, TOO_BIG):
                    await self._fail(ws.ended)
                await self._lost()
            if self.closed:
                raise ConnectionClosed
            await self._receive()

    async def _receive(self) -> None:
        if self._ws.more:  # an earlier read's frames wait: the next of them, the socket after
            await trio.lowlevel.checkpoint()
            self._messages.extend(self._ws.receive_data(b"", PARSE_EVERY))
            return
        self._unyielded = 0  # (a read yields)
        data, self._early = self._early, b""
        if not data:
            data = await self._read()
            if not data:
                self._ws.connection_lost()
                await self._lost()
        self._messages.extend(self._ws.receive_data(data, PARSE_EVERY))

    async def _read(self) -> bytes:
        """One read of the socket (b"": it is gone). A read that took less than it asked
        emptied the socket, so the next waits for it to be readable first rather than try
        and fail (Trio's `recv` tries first: at a frame every 20 ms that is a failed
        syscall and its exception each frame); one that filled its buffer tries again at
        once, yielding after."""
        fd = self._sock.fileno()
        if fd < 0:  # (closed)
            return b""
        try:
            while True:
                if self._drained:
                    await trio.lowlevel.wait_readable(fd)
                try:
                    data = os.read(fd, RECEIVE_SIZE)
                except BlockingIOError:  # (readable, yet nothing: a spurious wake-up)
                    self._drained = True
                    continue
                if not self._drained:
                    await trio.lowlevel.checkpoint()  # (a read always yields)
                self._drained = len(data) < RECEIVE_SIZE
                return data
        except (OSError, trio.ClosedResourceError):  # (a closed socket's fileno: EBADF)
            return b""

    async def _fail(self, ended: Ended) -> None:
        """RFC 6455 §7.1.7, "Fail the WebSocket Connection": the Close saying why is sent;
        what the peer sends after the bad frame cannot be read: it is discarded until the
        peer hangs up (briefly), so closing the socket does not reset it under our Close."""
        log.warning("a WebSocket peer broke the protocol (%d): %s", ended.code, ended.reason)
        with trio.move_on_after(CLOSE_TIMEOUT):
            try:
                while await self._stream.receive_some(RECEIVE_SIZE):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
        await self._lost()

    async def send_message(self, message: str | bytes) -> None:
        """Send one whole message; `ConnectionClosed` if the WebSocket is closed."""
        if self.closed:
            raise ConnectionClosed
        try:
            frame = self._ws.send(message)
        except ConnectionEnded:
            raise ConnectionClosed from None
        await self._send(frame)

    async def _send(self, data: bytes) -> None:
        sent = 0
        if not self._send_lock.locked():
            # The common case, a frame the socket's buffer takes whole: written now, not
            # through the lock's and the Trio socket's checkpoints (two passes of the
            # scheduler a frame; the task still yields in every `get_message` that reads).
            # A send already cancelled writes nothing (this does not yield unless it is).
            # Nothing awaits between the check and the write, so no other send is between.
            await trio.lowlevel.checkpoint_if_cancelled()
            try:
                sent = os.write(self._sock.fileno(), data)
            except BlockingIOError:
                pass
            except OSError:  # (a closed socket's fileno is -1: EBADF, never another's fd)
                await self._lost()
            if sent == len(data):
                return
        view = memoryview(data)[sent:]
        try:
            async with self._send_lock:  # the rest, when the socket's buffer allows
                while view:
                    view = view[await self._sock.send(view) :]
        except (OSError, trio.ClosedResourceError):
            await self._lost()
        except BaseException:  # cancelled: if part of the frame went out, nothing may follow
            if len(view) < len(data):
                self.closed = True
                self._sock.close()  # (at once: the stream's aclose would wait, and we leave)
            raise

    async def _lost(self) -> None:
        self.closed = True
        await self._stream.aclose()
        raise ConnectionClosed

    async def aclose(self, code: int = 1000, reason: str = "") -> None:
        """Close the WebSocket (Close frame, the peer's Close awaited briefly), then the socket."""
        if self.closed:
            return
        ws = self._ws
        try:
            if not ws.close_sent:
                await self._send(ws.close(code, reason))
                with trio.move_on_after(CLOSE_TIMEOUT):
                    while ws.ended is None:  # (no one reads what comes after our Close)
                        self._messages.clear()
                        await self._receive()
        except ConnectionClosed:
            return
        self.closed = True
        await self._stream.aclose()


async def _handshake(stream: trio.SocketStream, max_message: int) -> AgentConnection | None:
    """Read the upgrade request and accept it (None: it was not one, or the peer left)."""
    head = b""
    while (split := split_handshake(head)) is None:
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data or len(head) > MAX_HANDSHAKE:
            return None
        head += data
    head, early = split
    ws = WSConnection(ConnectionType.SERVER)
    try:
        ws.receive_data(head)
        for event in ws.events():
            if isinstance(event, Request):
                await stream.send_all(ws.send(AcceptConnection()))
                return AgentConnection(stream, max_message, early)
    except RemoteProtocolError as exc:
        if isinstance(exc.event_hint, RejectConnection):
            await stream.send_all(ws.send(exc.event_hint))
    return None


async def serve_websockets(
    handler: Callable[[AgentConnection], Awaitable[None]],
    host: str,
    port: int,
    *,
    max_message: int,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept WebSockets on host:port and run `handler` on each; reports the bound port."""
    listeners = await trio.open_tcp_listeners(port, host=host)

    async def serve_one(stream: trio.SocketStream) -> None:
        try:
            conn = None
            with trio.move_on_after(HANDSHAKE_TIMEOUT):
                conn = await _handshake(stream, max_message)
            if conn is not None:
                await handler(conn)
        except (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionClosed):
            pass
        except Exception:  # one connection's failure, not the server's: the others go on
            log.exception("a WebSocket handler failed")
        finally:
            await stream.aclose()

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, serve_one, listeners)
        task_status.started(listeners[0].socket.getsockname()[1])
