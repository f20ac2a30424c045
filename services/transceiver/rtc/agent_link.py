"""The WebSocket to a session's agent, driven on the asyncio host loop (wsproto, no framework).

What goes over it is the agent protocol's business (`services/transceiver/agents/`): this is
the I/O loop only — connect, send text or binary messages, deliver the agent's messages whole,
report why it closed.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)


class AgentLinkError(Exception):
    pass


class AgentLink:
    """One session's WebSocket to its agent (§8), driven on the asyncio host loop.

    Frames flow every 20 ms each way for the whole call, so the link runs where the media
    does: wsproto on a non-blocking socket with a loop reader, no task switch per frame
    (measured: trio-websocket in Trio's guest run cost ~200 µs a message, about a fifth of
    the transceiver's main thread). Trio still owns the link's lifecycle in `session.py`:
    it connects it, waits for `closed`, reconnects with backoff and closes it.
    """

    MAX_MESSAGE = 1 << 20
    MAX_BACKLOG = 1 << 20  # bytes waiting for a slow agent before the link is dropped

    def __init__(
        self,
        url: str,
        *,
        on_message: Callable[[str | bytes], None],
        on_closed: Callable[[str], None],
    ) -> None:
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        if parts.scheme != "ws" or not parts.hostname:
            raise AgentLinkError(f"agent URL must be ws://host:port[/path], got {url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.on_message, self.on_closed = on_message, on_closed
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock: socket.socket | None = None
        self.open = False
        self._out = bytearray()
        self._partial: list[bytes | str] = []
        self._partial_size = 0

    async def connect(self) -> None:
        """Open the socket and do the WebSocket handshake (wrap in a timeout)."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await loop.sock_connect(sock, addr)
            host = f"{self.host}:{self.port}"
            await loop.sock_sendall(sock, self.ws.send(Request(host=host, target=self.target)))
            while not self.open:
                data = await loop.sock_recv(sock, 65536)
                if not data:
                    raise AgentLinkError("agent closed during the handshake")
                self.ws.receive_data(data)
                for event in self.ws.events():
                    if isinstance(event, AcceptConnection):
                        self.open = True
                    elif isinstance(event, RejectConnection):
                        raise AgentLinkError(f"agent refused the WebSocket ({event.status_code})")
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        loop.add_reader(sock.fileno(), self._readable)

    def send(self, message: str | bytes) -> bool:
        """Queue one whole message (text or binary); False if the link is not open."""
        if not self.open:
            return False
        if isinstance(message, str):
            return self._send(self.ws.send(TextMessage(data=message)))
        return self._send(self.ws.send(BytesMessage(data=message)))

    def _send(self, data: bytes) -> bool:
        sock = self.sock
        assert sock is not None
        if self._out:
            self._out += data
        else:
            try:
                sent = sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                self._fail(f"send failed: {exc}")
                return False
            if sent < len(data):
                self._out += data[sent:]
                asyncio.get_running_loop().add_writer(sock.fileno(), self._writable)
        if len(self._out) > self.MAX_BACKLOG:
            self._fail("agent too slow: send backlog over 1 MiB")
            return False
        return True

    def _writable(self) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            sent = sock.send(self._out)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(f"send failed: {exc}")
            return
        del self._out[:sent]
        if not self._out:
            asyncio.get_running_loop().remove_writer(sock.fileno())

    def _readable(self) -> None:
        sock = self.sock
        if sock is None:
            return
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(f"receive failed: {exc}")
            return
        if not data:
            self._fail("agent closed the connection")
            return
        try:
            self.ws.receive_data(data)
            events = list(self.ws.events())
        except Exception as exc:  # wsproto raises on protocol violations
            self._fail(f"bad WebSocket data: {exc}")
            return
        for event in events:
            if isinstance(event, (BytesMessage, TextMessage)):
                chunk = bytes(event.data) if isinstance(event.data, bytearray) else event.data
                self._partial.append(chunk)
                self._partial_size += len(event.data)
                if self._partial_size > self.MAX_MESSAGE:
                    self._fail("agent message over 1 MiB")
                    return
                if event.message_finished:
                    parts, self._partial, self._partial_size = self._partial, [], 0
                    if isinstance(event, BytesMessage):
                        self.on_message(b"".join(p for p in parts if isinstance(p, bytes)))
                    else:
                        self.on_message("".join(p for p in parts if isinstance(p, str)))
            elif isinstance(event, Ping):
                self._send(self.ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                if self.ws.state is ConnectionState.REMOTE_CLOSING:
                    self._send(self.ws.send(event.response()))
                self._fail(f"agent closed the WebSocket ({event.code})")
                return

    def _fail(self, reason: str) -> None:
        if self.sock is not None:
            self._teardown()
            self.on_closed(reason)

    def _teardown(self) -> None:
        sock, self.sock, self.open = self.sock, None, False
        if sock is None:
            return
        loop = asyncio.get_running_loop()
        loop.remove_reader(sock.fileno())
        loop.remove_writer(sock.fileno())
        sock.close()

    def close(self) -> None:
        """Say goodbye (a close frame, best effort) and drop the connection; no callback."""
        if self.sock is not None and self.open:
            try:
                self.sock.send(self.ws.send(CloseConnection(code=1000)))
            except (OSError, Exception):
                pass
        self._teardown()
