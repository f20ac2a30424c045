"""Hypercorn, bounded: HTTP/1.1 only, and WebSocket streams that cannot grow past their limit.

Why (hypercorn 0.18, wsproto 1.3): what hypercorn does before an app sees a byte
let one connection cost a service without bound.

* A too-big WebSocket message: hypercorn checks `websocket_max_message_size` only after it
  has appended a chunk to its message buffer, and after the 1009 close it neither empties
  that buffer nor closes the connection, so every further chunk of the frame (whatever length
  the header announced) is still decoded and appended. Twenty unauthenticated 15 MB frames
  took signaling from 127 to 696 MB, and the memory stayed.
* permessage-deflate: hypercorn accepts it whenever a client offers it, and wsproto inflates
  a frame's data with no bound: a 200 KB compressed frame became 200 MB.
* HTTP/2 in clear text (prior knowledge, ``PRI * HTTP/2.0``, or ``Upgrade: h2c``): DATA on a
  stream the app has already answered raises KeyError out of hypercorn's connection handler,
  which ends `serve` and the whole process — one unauthenticated connection.
* An early answer: a request answered (with ``Connection: close``) before its body had
  arrived kept its connection open for as long as the client kept sending, because the
  close ran in a task Quart-Trio had just cancelled.
* A request with both Content-Length and Transfer-Encoding (stop 42): h11 frames it by the
  chunked coding and keeps the connection, so a proxy in front that goes by Content-Length
  would read what we take for its body as a request of its own (smuggling).
* A WebSocket upgrade with one more byte in the same write (stop 41, found by a helper):
  hypercorn answered 400 while the app's answer was on its way; h11's error state raised
  `LocalProtocolError` out of the connection's task group, which ended `serve` and the
  process. Any path, no credential, every service (signaling, the transceiver's API, the
  agents', the relay's metrics).

Strategy: the services speak HTTP/1.1 and WebSocket (TLS, and HTTP/2 with it, end at the
ingress), so `Http11Only` never switches a connection to HTTP/2, and closes a connection for
sure once it has said it would, and refuses a request framed two ways (400, then closed).
`BoundedWSStream` negotiates no extension, checks a message's
size before it appends to it, and on a too-big message sends the 1009 close and closes the
connection at once (RFC 6455 §7.1.7, *Fail the WebSocket Connection*), dropping what it had
buffered. A WebSocket connection then holds at most one message
(`websocket_max_message_size`), one socket read (64 KiB) and the queues between hypercorn
and the app (`max_app_queue_size` messages, and Quart's own 10).

And whatever else one connection makes raise, it ends that connection alone: `guarded_run`
wraps hypercorn's per-connection `TCPServer.run`, logs what escaped it and closes the socket
(cancellation still goes through).

`install()` puts the two classes where hypercorn's protocol code looks them up (module
globals: hypercorn has no setting for either), and the guard on `TCPServer`;
`shared.http.hypercorn_config` calls it, so every service gets them. It checks that
hypercorn still has the shape they were written for.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import h11
import hypercorn.protocol
import hypercorn.protocol.h11
import hypercorn.trio.tcp_server
import trio
from hypercorn.events import Closed, RawData
from hypercorn.events import Event as HypercornEvent
from hypercorn.protocol.events import Event, Request, StreamClosed
from hypercorn.protocol.ws_stream import FrameTooLargeError, WebsocketBuffer, WSStream
from wsproto.connection import ConnectionState
from wsproto.events import CloseConnection, Message, Ping
from wsproto.frame_protocol import CloseReason

log = logging.getLogger("firsthop.http")

EXTENSIONS_HEADER = b"sec-websocket-extensions"
CLOSE_GRACE = 1.0  # seconds a connection's close may take, whatever cancels its task
EVENTS_PER_PASS = 64  # WebSocket events of one read handled between passes of the loop
WRITE_TIMEOUT = 30.0  # seconds one write may wait for a peer to take anything (as READ_TIMEOUT)


class BoundedBuffer(WebsocketBuffer):
    """A message buffer that refuses a chunk before it would pass `max_length`."""

    overflowed = False

    def extend(self, event: Message[Any]) -> None:
        if self.overflowed or self.length + len(event.data) > self.max_length:
            self.overflowed = True
            self.clear()
            raise FrameTooLargeError
        super().extend(event)


class BoundedWSStream(WSStream):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.buffer = self.bounded = BoundedBuffer(self.config.websocket_max_message_size)

    async def handle(self, event: Event) -> None:
        if isinstance(event, Request):  # no permessage-deflate (nor any other extension)
            headers = [(k, v) for k, v in event.headers if k.lower() != EXTENSIONS_HEADER]
            event = dataclasses.replace(event, headers=headers)
        await super().handle(event)

    async def _handle_events(self) -> None:
        """hypercorn's, but a read's Pings get one Pong, the latest's (RFC 6455 §5.5.3; it
        wrote one each: 64 KiB of empty Pings, unauthenticated, cost about a second of CPU),
        and the loop gets a pass every EVENTS_PER_PASS events."""
        pong: Ping | None = None
        for n, event in enumerate(self.connection.events(), 1):
            if isinstance(event, Message):
                try:
                    self.buffer.extend(event)
                except FrameTooLargeError:
                    await self._send_wsproto_event(
                        CloseConnection(code=CloseReason.MESSAGE_TOO_BIG)
                    )
                    break
                if event.message_finished:
                    assert self.app_put is not None  # (an accepted stream's: it has an app)
                    await self.app_put(self.buffer.to_message())
                    self.buffer.clear()
            elif isinstance(event, Ping):
                pong = event
            elif isinstance(event, CloseConnection):
                if pong is not None:
                    await self._send_wsproto_event(pong.response())
                    pong = None
                if self.connection.state == ConnectionState.REMOTE_CLOSING:
                    await self._send_wsproto_event(event.response())
                await self.send(StreamClosed(stream_id=self.stream_id))
            if n % EVENTS_PER_PASS == 0:
                await trio.lowlevel.checkpoint()
        if pong is not None:
            await self._send_wsproto_event(pong.response())
        if self.bounded.overflowed and not self.closed:  # after the 1009 close: closes TCP
            await self.send(StreamClosed(stream_id=self.stream_id))


class Http11Only(hypercorn.protocol.h11.H11Protocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        send = self.send

        async def send_closing_for_sure(event: HypercornEvent) -> None:
            if not isinstance(event, Closed):
                return await send(event)
            # Closing the connection (shutdown, close: never blocks) after an answer with
            # "Connection: close" runs in the app's task, and Quart-Trio cancels that task as
            # soon as the stream reports the disconnect, before the close is done: a request
            # answered before its body came (401, 408, 429, ...) kept its connection for as
            # long as the client kept sending.
            with trio.CancelScope(deadline=trio.current_time() + CLOSE_GRACE, shield=True):
                await send(event)

        self.send = send_closing_for_sure

    async def _check_protocol(self, event: h11.Request) -> None:
        """Hypercorn switches to HTTP/2 here (h2c upgrade, or prior knowledge); we never do:
        an upgrade request is served as HTTP/1.1, and ``PRI * HTTP/2.0`` gets an error."""

    async def _create_stream(self, request: h11.Request) -> None:
        """A request framed two ways (Content-Length and Transfer-Encoding) is refused, 400,
        and its connection closed: a proxy in front that frames it by the other header
        would read our next request where we read this one's body (request smuggling;
        RFC 9112 §6.1 lets a server refuse it, and requires the close in any case)."""
        names = {name for name, _ in request.headers}  # (h11 gives them lowercased)
        if b"content-length" in names and b"transfer-encoding" in names:
            await self._send_error_response(400)
            await self.send(Closed())
            return
        await super()._create_stream(request)


_unguarded_run = hypercorn.trio.tcp_server.TCPServer.run


async def guarded_run(self: hypercorn.trio.tcp_server.TCPServer) -> None:
    """One connection's whole life; what it raises ends it alone, never `serve`."""
    try:
        await _unguarded_run(self)
    except* Exception as group:
        log.warning(
            "a connection ended on an error in the HTTP server: %s",
            "; ".join(f"{type(e).__name__}: {e}"[:200] for e in group.exceptions),
        )
        with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_GRACE):
            try:
                await self.stream.aclose()
            except Exception:  # (already gone)
                pass


_unbounded_send = hypercorn.trio.tcp_server.TCPServer.protocol_send


async def bounded_protocol_send(self: hypercorn.trio.tcp_server.TCPServer, event: Any) -> None:
    """hypercorn's, whose write is shielded (no partial frames) and so waited for ever on a
    peer that reads nothing but keeps sending (a Pong every 29 s beats the read timeout): the
    app's task, and what it holds, stayed. Now a write that gets no room for WRITE_TIMEOUT
    closes the connection, as a broken one."""
    if not isinstance(event, RawData):
        return await _unbounded_send(self, event)
    async with self.send_lock:
        try:
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + WRITE_TIMEOUT
                await self.stream.send_all(event.data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await self.protocol.handle(Closed())
            return
        if scope.cancelled_caught:
            log.info("closing a connection whose peer took nothing for %.0f s", WRITE_TIMEOUT)
            with trio.CancelScope(shield=True, deadline=trio.current_time() + CLOSE_GRACE):
                await self.stream.aclose()
            await self.protocol.handle(Closed())


def _uses(function: Any, *names: str) -> bool:
    """`function`'s code names all of `names` (attributes it reads or sets, globals)."""
    return set(names) <= set(function.__code__.co_names)


def install() -> None:
    """Make every hypercorn server in this process use the classes above (idempotent). It
    first checks that what they replace is still the shape they were written for, and
    refuses to start otherwise (nothing is installed then)."""
    tcp = hypercorn.trio.tcp_server.TCPServer
    if not _uses(tcp.__init__, "send_lock", "stream") or not _uses(
        _unbounded_send, "RawData", "send_lock", "shield", "send_all", "protocol", "Closed"
    ):
        raise RuntimeError(
            "hypercorn changed: TCPServer's write is not the one bounded_protocol_send replaces"
        )
    h11_module = hypercorn.protocol.h11
    for module, name in ((h11_module, "WSStream"), (hypercorn.protocol, "H11Protocol")):
        if not isinstance(getattr(module, name, None), type):
            raise RuntimeError(f"hypercorn changed: {module.__name__}.{name} is gone")
    hooks = ("_check_protocol", "_create_stream", "_send_error_response")
    if not all(hasattr(h11_module.H11Protocol, hook) for hook in hooks) or not hasattr(
        WSStream, "_handle_events"
    ):
        raise RuntimeError("hypercorn changed: the hooks shared.hypercorn_bounds uses are gone")
    tcp.run = guarded_run  # type: ignore[method-assign]
    tcp.protocol_send = bounded_protocol_send  # type: ignore[method-assign]
    h11_module.WSStream = BoundedWSStream  # type: ignore[attr-defined]
    hypercorn.protocol.H11Protocol = Http11Only  # type: ignore[attr-defined]
