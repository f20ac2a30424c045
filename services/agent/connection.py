"""The reference agents' WebSocket server: wsproto on a Trio socket stream, one task per socket.

Strategy: the connection's own task reads the socket when it asks for a message; there is no
reader task and no message queue between the socket and the handler (trio-websocket's design),
so a 20 ms frame in and its echo out cost one socket read, one socket write and no task
switch (measured: about half the agent's CPU per call went to that hop). Ping is answered,
Close is answered and ends the connection, a message over `max_message` closes it with 1009
(RFC 6455 §7.4.1), a protocol error with the code wsproto gives.

Invariants: one task receives (`get_message`); sends may come from several (`send_message`
holds a lock); after `ConnectionClosed` every call raises it again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Message,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import RemoteProtocolError

RECEIVE_SIZE = 65536
HANDSHAKE_TIMEOUT = 60.0  # seconds for a client to send its upgrade request
CLOSE_TIMEOUT = 2.0  # seconds to wait for the peer's Close after ours
MESSAGE_TOO_BIG = 1009  # RFC 6455 §7.4.1


class ConnectionClosed(Exception):
    """The WebSocket is closed (by either side, or the socket went away)."""


class AgentConnection:
    """One accepted WebSocket (see the module docstring)."""

    def __init__(self, stream: trio.SocketStream, ws: WSConnection, max_message: int) -> None:
        self._stream = stream
        self._ws = ws
        self._max_message = max_message
        self._events: deque[Event] = deque()
        self._parts: list[bytes | str] = []
        self._size = 0
        self._send_lock = trio.Lock()
        self.closed = False

    async def get_message(self) -> str | bytes:
        """The next whole message; `ConnectionClosed` once the WebSocket is closed."""
        while True:
            while self._events:
                event = self._events.popleft()
                if isinstance(event, Message):
                    message = await self._part(event)
                    if message is not None:
                        return message
                elif isinstance(event, Ping):
                    await self._send(self._ws.send(event.response()))
                elif isinstance(event, CloseConnection):
                    if self._ws.state is ConnectionState.REMOTE_CLOSING:
                        await self._send(self._ws.send(event.response()))
                    await self._lost()
            if self.closed:
                raise ConnectionClosed
            await self._receive()

    async def _part(self, event: Message) -> str | bytes | None:
        data = event.data
        self._parts.append(bytes(data) if isinstance(data, bytearray) else data)
        self._size += len(data)
        if self._size > self._max_message:
            await self.aclose(MESSAGE_TOO_BIG, "message too big")
            raise ConnectionClosed
        if not event.message_finished:
            return None
        parts, self._parts, self._size = self._parts, [], 0
        if len(parts) == 1:
            return parts[0]
        if isinstance(event, BytesMessage):
            return b"".join(p for p in parts if isinstance(p, bytes))
        return "".join(p for p in parts if isinstance(p, str))

    async def _receive(self) -> None:
        try:
            data = await self._stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            await self._lost()
        self._ws.receive_data(data)
        self._events.extend(self._ws.events())  # a protocol error comes as CloseConnection

    async def send_message(self, message: str | bytes) -> None:
        """Send one whole message; `ConnectionClosed` if the WebSocket is closed."""
        if self.closed or self._ws.state is not ConnectionState.OPEN:
            raise ConnectionClosed
        if isinstance(message, str):
            data = self._ws.send(TextMessage(data=message))
        else:
            data = self._ws.send(BytesMessage(data=message))
        await self._send(data)

    async def _send(self, data: bytes) -> None:
        try:
            async with self._send_lock:
                await self._stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await self._lost()

    async def _lost(self) -> None:
        self.closed = True
        await self._stream.aclose()
        raise ConnectionClosed

    async def aclose(self, code: int = 1000, reason: str | None = None) -> None:
        """Close the WebSocket (Close frame, the peer's Close awaited briefly), then the socket."""
        if self.closed:
            return
        try:
            if self._ws.state is ConnectionState.OPEN:
                await self._send(self._ws.send(CloseConnection(code=code, reason=reason)))
                with trio.move_on_after(CLOSE_TIMEOUT):
                    while self._ws.state is ConnectionState.LOCAL_CLOSING:
                        await self._receive()
        except ConnectionClosed:
            return
        self.closed = True
        await self._stream.aclose()


async def _handshake(stream: trio.SocketStream, max_message: int) -> AgentConnection | None:
    """Read the upgrade request and accept it (None: it was not one, or the peer left)."""
    ws = WSConnection(ConnectionType.SERVER)
    while True:
        data = await stream.receive_some(RECEIVE_SIZE)
        if not data:
            return None
        try:
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, Request):
                    await stream.send_all(ws.send(AcceptConnection()))
                    return AgentConnection(stream, ws, max_message)
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
        finally:
            await stream.aclose()

    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, serve_one, listeners)
        task_status.started(listeners[0].socket.getsockname()[1])
