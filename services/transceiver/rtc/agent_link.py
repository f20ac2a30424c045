"""The WebSocket to a session's agent, driven on the asyncio host loop (wsproto, no framework).

What goes over it is the agent protocol's business (`services/transceiver/agents/`): this is
the I/O loop only — connect, send text or binary messages, deliver the agent's messages whole,
report why it closed. `wss://` runs TLS through an `ssl.SSLObject` on memory BIOs (the same
non-blocking socket and loop reader; the context's CAs verify the agent's certificate and its
host name, sent as SNI); extra request headers (a Realtime backend's `Authorization`) go in
the handshake.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable

from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, RejectConnection, Request

from firsthop.services.transceiver.rtc.bridge import watch_readable, work_left
from firsthop.shared.wire.websocket import split_handshake
from firsthop.shared.wire.websocket_connection import (
    PEER_CLOSED,
    TOO_BIG,
    ConnectionEnded,
    WebSocketConnection,
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
    # Bytes one wake-up reads: every frame in them is handled before the loop runs anything
    # else (a 20 ms frame of audio is 2-4 KB). 16 KiB bounds what an agent's flood of tiny
    # frames holds every call on this loop up for: about a quarter of what 64 KiB did.
    READ_SIZE = 16384
    # Frames one callback handles (control frames and fragments count). A read's frames past
    # it wait in the connection, for the loop's next pass, and the socket is not read again
    # before they are handled: an agent's flood of tiny frames (16 KiB of empty ones is
    # 8,192) holds the other calls up for 64 frames' work at a time, and costs no memory
    # past one read's plaintext (wss: up to about 32 KiB with a part record; the
    # handshake's early bytes up to 64 KiB). A 20 ms frame of audio, or a Realtime delta,
    # is one frame.
    FRAMES_PER_WAKE = 64
    CLOSE_DRAIN_READS = 8  # READ_SIZE reads of unread data dropped before a close

    def __init__(
        self,
        url: str,
        *,
        on_message: Callable[[str | bytes], None],
        on_closed: Callable[[str], None],
        headers: list[tuple[str, str]] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise AgentLinkError(f"bad agent URL {url[:80]!r}: {exc}") from exc
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise AgentLinkError(f"agent URL must be ws(s)://host:port[/path], got {url!r}")
        self.host = parts.hostname
        self.port = port or (443 if parts.scheme == "wss" else 80)
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        self.headers = [(k.encode(), v.encode()) for k, v in headers or []]
        self.tls_context = (tls or ssl.create_default_context()) if parts.scheme == "wss" else None
        self.on_message, self.on_closed = on_message, on_closed
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.sock: socket.socket | None = None
        self._tls: ssl.SSLObject | None = None
        self._tls_in = ssl.MemoryBIO()
        self._tls_out = ssl.MemoryBIO()
        self.open = False
        self.hung_up = False  # it closed because the agent closed it (not a failure)
        self._out = bytearray()
        self.conn = WebSocketConnection(client=True, max_message=self.MAX_MESSAGE)
        self._resuming = False  # a pass of the loop is asked for, for frames left unread
        self._stop_reading: Callable[[], None] | None = None  # (`watch_readable`'s)

    async def connect(self, first: list[str | bytes] | None = None) -> None:
        """Open the socket and do the WebSocket handshake (wrap in a timeout); `first` are
        sent the moment it is open, before anything the agent sends is delivered."""
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await loop.sock_connect(sock, addr)
            if self.tls_context is not None:
                await self._tls_handshake(loop, sock)
            host = f"{self.host}:{self.port}"
            request = Request(host=host, target=self.target, extra_headers=self.headers)
            await loop.sock_sendall(sock, self._wrap(self.ws.send(request)))
            head = b""
            while (split := split_handshake(head)) is None:
                data = await loop.sock_recv(sock, 65536)
                if not data:
                    raise AgentLinkError("agent closed during the handshake")
                head += self._unwrap(data)  # (TLS: maybe nothing yet, a session ticket)
                if len(head) > self.MAX_MESSAGE:
                    raise AgentLinkError("bad WebSocket handshake: answer too long")
            head, early = split  # wsproto reads the answer; frames right behind it are ours
            try:
                self.ws.receive_data(head)
                handshake = list(self.ws.events())
            except Exception as exc:  # wsproto raises on a bad handshake answer
                raise AgentLinkError(f"bad WebSocket handshake: {exc}") from exc
            for event in handshake:
                if isinstance(event, RejectConnection):
                    raise AgentLinkError(f"agent refused the WebSocket ({event.status_code})")
                self.open = self.open or isinstance(event, AcceptConnection)
            if not self.open:
                raise AgentLinkError("bad WebSocket handshake: no answer to the upgrade")
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        failed: list[str] = []
        on_closed, self.on_closed = self.on_closed, failed.append
        try:
            for message in first or []:
                self.send(message)
        finally:
            self.on_closed = on_closed
        if self.sock is None:  # the opening itself failed the link (too big, too slow, ...)
            raise AgentLinkError(f"the opening failed: {failed[0] if failed else 'closed'}")
        self._stop_reading = watch_readable(sock, self._readable)
        if early:
            self._received(early)

    async def _tls_handshake(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        assert self.tls_context is not None
        tls = self.tls_context.wrap_bio(self._tls_in, self._tls_out, server_hostname=self.host)
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError as exc:
                raise AgentLinkError(f"TLS handshake with the agent failed: {exc}") from exc
            if self._tls_out.pending:
                await loop.sock_sendall(sock, self._tls_out.read())
            data = await loop.sock_recv(sock, 65536)
            if not data:
                raise AgentLinkError("agent closed during the TLS handshake")
            self._tls_in.write(data)
        if self._tls_out.pending:
            await loop.sock_sendall(sock, self._tls_out.read())
        self._tls = tls

    def _wrap(self, data: bytes) -> bytes:
        """What goes on the socket for `data` (TLS records, with wss://)."""
        if self._tls is None:
            return data
        if data:
            self._tls.write(data)
        return self._tls_out.read()

    def _unwrap(self, data: bytes) -> bytes:
        """The plaintext in what came off the socket (wss://: maybe none yet)."""
        tls = self._tls
        if tls is None:
            return data
        self._tls_in.write(data)
        plain = bytearray()
        try:
            while True:
                chunk = tls.read(65536)
                if not chunk:
                    break
                plain += chunk
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:
            pass
        return bytes(plain)

    def send(self, message: str | bytes) -> bool:
        """Queue one whole message (text or binary); False if the link is not open."""
        if not self.open:
            return False
        try:
            frame = self.conn.send(message)
        except ConnectionEnded:
            return False
        return self._send(frame)

    def _send(self, data: bytes) -> bool:
        sock = self.sock
        assert sock is not None
        try:
            data = self._wrap(data)
        except ssl.SSLError as exc:
            self._fail(f"TLS failed: {exc}")
            return False
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
        if self.conn.more:  # an earlier read's frames wait: they go first, the socket after
            self._received(b"")
            return
        try:
            data = sock.recv(self.READ_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            self._fail(f"receive failed: {exc}")
            return
        if not data:
            self.hung_up = True
            self._fail("agent closed the connection")
            return
        if len(data) == self.READ_SIZE:  # more may be waiting: the loop comes back at once
            work_left()
        try:
            plain = self._unwrap(data)
            if self._tls is not None and self._tls_out.pending:  # TLS wants to answer
                self._send(b"")
        except ssl.SSLError as exc:
            self._fail(f"TLS failed: {exc}")
            return
        if plain:
            self._received(plain)

    def _received(self, data: bytes) -> None:
        conn = self.conn
        for message in conn.receive_data(data, self.FRAMES_PER_WAKE):
            if self.sock is None:
                return  # a message before this one ended the link
            self.on_message(message)
        if conn.more:
            if self.sock is not None and not self._resuming:
                self._resuming = True  # the rest on the loop's next pass, after the others
                asyncio.get_running_loop().call_soon(self._resume)
                work_left()  # (so the loop won't gather before it)
            return  # (answers wait for the read's last batch: one Pong for its Pings)
        answers = conn.data_to_send()  # a Pong, the answer to a Close or to a bad frame
        if answers and self.sock is not None:
            self._send(answers)
        ended = conn.ended
        if ended is None or self.sock is None:
            return
        if ended.how == TOO_BIG:
            self._fail("agent message over 1 MiB")
            return
        self.hung_up = True  # the agent ended it: its Close, or its violation of the protocol
        if ended.how == PEER_CLOSED:
            self._fail(f"agent closed the WebSocket ({ended.code})")
        else:
            self._fail(f"agent closed the WebSocket ({ended.code}): {ended.reason}")

    def _resume(self) -> None:
        self._resuming = False
        if self.sock is not None and self.conn.more:
            self._received(b"")

    def _fail(self, reason: str) -> None:
        if self.sock is not None:
            self._teardown()
            self.on_closed(reason)

    def _teardown(self) -> None:
        sock, self.sock, self.open = self.sock, None, False
        if sock is None:
            return
        stop, self._stop_reading = self._stop_reading, None
        if stop is not None:
            stop()
        asyncio.get_running_loop().remove_writer(sock.fileno())
        sock.close()

    def close(self) -> None:
        """Say goodbye (a close frame, best effort) and drop the connection; no callback."""
        if self.sock is not None and self.open and not self.conn.close_sent:
            try:  # behind what is still queued (a frame may be part sent)
                close = self._wrap(self.conn.close(1000))
                self.sock.send(bytes(self._out) + close)
            except (OSError, ssl.SSLError):
                pass
        if self.sock is not None:
            # What the agent sent that we did not read yet is read and dropped first: a
            # socket closed with unread data sends a reset, not a FIN, and the agent could
            # lose our last messages and Close behind it (a few reads at most: no waiting).
            for _ in range(self.CLOSE_DRAIN_READS):
                try:
                    if not self.sock.recv(self.READ_SIZE):
                        break
                except OSError:  # (nothing more to read now, or the socket is gone)
                    break
        self._teardown()
