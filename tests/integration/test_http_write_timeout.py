"""Every service's HTTP server (hypercorn, `shared/hypercorn_bounds.py`) in-process on
loopback: a peer that takes nothing of what it is sent loses its connection."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from functools import partial

import hypercorn.trio.tcp_server
import pytest
import trio
from hypercorn.trio import serve
from quart import Response
from quart_trio import QuartTrio

from firsthop.shared import hypercorn_bounds
from firsthop.shared.http import bound_address, hypercorn_config


async def test_a_peer_that_takes_nothing_is_closed_after_the_write_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """hypercorn shields each write (no partial frames), so a peer that read nothing held
    the write, the app's task and all it had queued for as long as it kept the connection
    (a WebSocket peer need only answer a ping now and then): a sideband's queue of a call
    long over stayed, call after call (a helper's read, stop 42). Now a write that gets no
    room for `WRITE_TIMEOUT` closes the connection, and the app's task ends."""
    monkeypatch.setattr(hypercorn_bounds, "WRITE_TIMEOUT", 0.5)
    app = QuartTrio(__name__)
    ended = trio.Event()

    @app.get("/endless")
    async def endless() -> Response:
        async def body() -> AsyncIterator[bytes]:
            try:
                while True:
                    yield bytes(65536)
            finally:
                ended.set()

        return Response(body())

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, app, hypercorn_config(("127.0.0.1", 0))))
        peer = socket.socket()
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        peer.connect(bound_address(binds))
        with peer:
            peer.sendall(b"GET /endless HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads
            with trio.fail_after(10):
                await ended.wait()
            peer.setblocking(False)
            got, closed = 0, False
            with trio.fail_after(10):
                while not closed:  # what was in flight, then the close
                    await trio.lowlevel.wait_readable(peer)
                    try:
                        chunk = peer.recv(1 << 20)
                    except ConnectionResetError:
                        chunk = b""
                    got += len(chunk)
                    closed = not chunk
        nursery.cancel_scope.cancel()
    assert got > 0


def test_install_refuses_a_hypercorn_whose_write_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """`bounded_protocol_send` replaces hypercorn's `TCPServer.protocol_send` and uses what it
    used (its lock, its stream, its protocol): a hypercorn whose write is another shape is
    refused at start, with nothing installed, rather than replaced by a write that breaks
    on the first answer."""
    hypercorn_bounds.install()  # this hypercorn: the shape holds (and install is idempotent)

    async def other_send(self: object, event: object) -> None:  # (a write of another shape)
        await trio.lowlevel.checkpoint()

    tcp = hypercorn.trio.tcp_server.TCPServer
    monkeypatch.setattr(hypercorn_bounds, "_unbounded_send", other_send)
    monkeypatch.setattr(tcp, "protocol_send", other_send)
    with pytest.raises(RuntimeError, match="TCPServer's write"):
        hypercorn_bounds.install()
    assert tcp.protocol_send is other_send  # nothing was installed
