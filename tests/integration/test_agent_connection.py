"""The reference agents' one-task WebSocket server (services/agent/connection.py), on loopback,
spoken to by trio-websocket and by raw wsproto where a test needs frames by hand."""

from __future__ import annotations

import os
import socket
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing
from trio_websocket import open_websocket_url
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Request,
    TextMessage,
)

from firsthop.services.agent.connection import (
    PARSE_EVERY,
    YIELD_EVERY,
    AgentConnection,
    ConnectionClosed,
    serve_websockets,
)
from firsthop.shared.wire.websocket import CLOSE, PING, encode_frame


async def _echo(ws: AgentConnection) -> None:
    try:
        while True:
            await ws.send_message(await ws.get_message())
    except ConnectionClosed:
        pass


async def _serve(
    nursery: trio.Nursery,
    max_message: int = 1 << 20,
    handler: Callable[[AgentConnection], Awaitable[None]] = _echo,
) -> int:
    port: int = await nursery.start(
        lambda task_status: serve_websockets(
            handler, "127.0.0.1", 0, max_message=max_message, task_status=task_status
        )
    )
    return port


class RawClient:
    """A WebSocket client on wsproto, frames by hand (trio-websocket's client leaves its socket
    open when the server closes first)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.events: list[object] = []

    @classmethod
    async def open(cls, port: int) -> RawClient:
        client = cls(await trio.open_tcp_stream("127.0.0.1", port))
        await client.stream.send_all(client.ws.send(Request(host="x", target="/")))
        while not any(isinstance(e, AcceptConnection) for e in client.events):
            await client.receive()
        return client

    async def receive(self) -> bool:
        data = await self.stream.receive_some(65536)
        self.ws.receive_data(data or None)
        for event in self.ws.events():
            self.events.append(event)
            if isinstance(event, CloseConnection) and data:
                await self.send(event.response())
                await self.stream.send_eof()  # (a client may hang up its half at once)
        return bool(data)

    async def send(self, event: Any) -> None:
        await self.stream.send_all(self.ws.send(event))

    async def binary_messages(self, count: int) -> list[bytes]:
        """Read until `count` whole binary messages came (their fragments joined)."""
        got: list[bytes] = []
        part = bytearray()
        while len(got) < count:
            assert await self.receive()
            for event in self.events:
                if isinstance(event, BytesMessage):
                    part += event.data
                    if event.message_finished:
                        got.append(bytes(part))
                        part.clear()
            self.events.clear()
        return got

    async def until_closed(self) -> CloseConnection:
        """Read until the server's Close (answered) and its end of the socket."""
        while await self.receive():
            pass
        await self.stream.aclose()
        return next(e for e in self.events if isinstance(e, CloseConnection))


async def test_messages_come_back_whole_and_pings_are_answered() -> None:
    async with trio.open_nursery() as nursery:
        port = await _serve(nursery)
        with trio.fail_after(10):
            async with open_websocket_url(f"ws://127.0.0.1:{port}") as ws:
                await ws.ping(b"are you there")  # returns once the pong came
                for message in (b"\x00" * 1920, "text \u00e9", b""):
                    await ws.send_message(message)
                    assert await ws.get_message() == message
        nursery.cancel_scope.cancel()


async def test_a_fragmented_message_is_put_back_together() -> None:
    async with trio.open_nursery() as nursery:
        port = await _serve(nursery)
        with trio.fail_after(10):
            client = await RawClient.open(port)
            for i, last in ((0, False), (1, False), (2, True)):
                await client.send(BytesMessage(data=bytes([i]) * 100, message_finished=last))
            got = b""
            while len(got) < 300:
                await client.receive()
                got = b"".join(bytes(e.data) for e in client.events if isinstance(e, BytesMessage))
            assert got == b"\x00" * 100 + b"\x01" * 100 + b"\x02" * 100
            await client.stream.aclose()
        nursery.cancel_scope.cancel()


async def test_a_message_over_the_bound_closes_with_1009() -> None:
    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, max_message=1000)
        with trio.fail_after(10):
            client = await RawClient.open(port)
            await client.send(BytesMessage(data=b"x" * 1000))
            await client.send(BytesMessage(data=b"x" * 1001))
            close = await client.until_closed()
            assert close.code == 1009
            echoed = [bytes(e.data) for e in client.events if isinstance(e, BytesMessage)]
            assert echoed == [b"x" * 1000]
        nursery.cancel_scope.cancel()


async def test_a_plain_http_request_is_refused() -> None:
    async with trio.open_nursery() as nursery:
        port = await _serve(nursery)
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while chunk := await stream.receive_some(4096):
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 400")
            await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_the_server_closing_says_so_to_the_client() -> None:
    closed = trio.Event()

    async def close_at_once(ws: AgentConnection) -> None:
        await ws.send_message("bye")
        await ws.aclose(4000, "done")
        closed.set()

    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, 1000, close_at_once)
        with trio.fail_after(10):
            client = await RawClient.open(port)
            close = await client.until_closed()
            assert (close.code, close.reason) == (4000, "done")
            texts = [e.data for e in client.events if isinstance(e, TextMessage)]
            assert texts == ["bye"]
            await closed.wait()
        nursery.cancel_scope.cancel()


async def test_a_close_code_no_client_may_send_is_answered_1002_not_echoed() -> None:
    """1006 is never sent in a Close frame (RFC 6455 §7.4.1): echoing it would send it."""
    async with trio.open_nursery() as nursery:
        port = await _serve(nursery)
        with trio.fail_after(10):
            client = await RawClient.open(port)
            await client.stream.send_all(encode_frame(CLOSE, b"\x03\xee", os.urandom(4)))
            wire = b""
            while chunk := await client.stream.receive_some(65536):
                wire += chunk
            await client.stream.aclose()
            assert wire[:1] == bytes([0x80 | CLOSE]) and wire[2:4] == (1002).to_bytes(2, "big")
        nursery.cancel_scope.cancel()


async def test_a_handler_that_raises_ends_its_connection_alone() -> None:
    async def fails(ws: AgentConnection) -> None:
        if await ws.get_message() == "fail":
            raise RuntimeError("a bug in one session")
        await ws.send_message("fine")

    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, 1000, fails)
        with trio.fail_after(10):
            client = await RawClient.open(port)
            await client.send(TextMessage(data="fail"))
            while await client.receive():  # its socket closes
                pass
            await client.stream.aclose()
            async with open_websocket_url(f"ws://127.0.0.1:{port}") as ws:
                await ws.send_message("ok")
                assert await ws.get_message() == "fine"
        nursery.cancel_scope.cancel()


async def test_what_comes_after_our_close_is_not_kept() -> None:
    """While `aclose` waits for the peer's Close, the messages the peer sends instead are
    dropped as they come, not held until the wait ends."""
    held: list[int] = []
    done = trio.Event()

    async def close_under_a_flood(ws: AgentConnection) -> None:
        await ws.get_message()  # the flood has begun
        await ws.aclose()
        held.append(len(ws._messages))
        done.set()

    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, 1 << 20, close_under_a_flood)
        with trio.fail_after(20):
            client = await RawClient.open(port)
            frame = client.ws.send(BytesMessage(data=b"x" * 1000))
            try:
                for _ in range(20_000):  # never answering the server's Close
                    await client.stream.send_all(frame)
            except trio.BrokenResourceError:
                pass  # the server gave up waiting and hung up
            await done.wait()
            await client.stream.aclose()
        assert held[0] < 100, held
        nursery.cancel_scope.cancel()


async def test_sends_behind_one_the_socket_could_not_take_wait_their_turn() -> None:
    """A message larger than the socket's buffers is written in part at once and the rest
    as the peer reads; the messages sent meanwhile (from another task) go after it, whole,
    never inside it."""
    big = os.urandom(40 << 20)  # more than loopback's send and receive buffers hold (36 MiB)
    small = [b"after %d" % i for i in range(5)]
    big_sent, read = trio.Event(), trio.Event()

    async def send_big_then_more(ws: AgentConnection) -> None:
        await ws.get_message()

        async def send_big() -> None:
            await ws.send_message(big)
            big_sent.set()

        async def send_small() -> None:
            for message in small:
                await ws.send_message(message)

        async with trio.open_nursery() as tasks:
            tasks.start_soon(send_big)
            await trio.testing.wait_all_tasks_blocked()
            assert not big_sent.is_set()  # the peer reads nothing yet: the socket is full
            tasks.start_soon(send_small)
            await trio.testing.wait_all_tasks_blocked()
            read.set()  # now the peer reads
        await ws.get_message()

    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, 1 << 20, send_big_then_more)
        with trio.fail_after(30):
            client = await RawClient.open(port)
            await client.send(BytesMessage(data=b"go"))
            await read.wait()
            got = await client.binary_messages(1 + len(small))
            assert got[0] == big
            assert got[1:] == small
            await client.send(BytesMessage(data=b"bye"))
            await client.stream.aclose()
        nursery.cancel_scope.cancel()


async def test_a_send_writes_nothing_while_another_holds_the_socket() -> None:
    """A send the socket could take at once still waits while another send has not finished
    writing (it holds the send lock): its frame would land inside the other's."""
    held, checked = trio.Event(), trio.Event()

    async def hold_then_send(ws: AgentConnection) -> None:
        await ws.get_message()
        async with trio.open_nursery() as tasks:
            async with ws._send_lock:  # as a send still writing its rest holds it
                tasks.start_soon(ws.send_message, b"second")
                await trio.testing.wait_all_tasks_blocked()
                held.set()
                await checked.wait()
        await ws.get_message()

    async with trio.open_nursery() as nursery:
        port = await _serve(nursery, 1 << 20, hold_then_send)
        with trio.fail_after(10):
            client = await RawClient.open(port)
            await client.send(BytesMessage(data=b"go"))
            await held.wait()
            try:
                early = os.read(client.stream.socket.fileno(), 100)  # (non-blocking)
            except BlockingIOError:
                early = b""
            checked.set()
            assert early == b""
            assert await client.binary_messages(1) == [b"second"]
            await client.send(BytesMessage(data=b"bye"))
            await client.stream.aclose()
        nursery.cancel_scope.cancel()


@contextmanager
def _pair(buffer: int = 4096) -> Iterator[tuple[AgentConnection, trio.socket.SocketType]]:
    """An agent connection on one end of a socket pair with small buffers, and its peer."""
    ours, peer = trio.socket.socketpair()
    with ours, peer:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
        yield AgentConnection(trio.SocketStream(ours), 1 << 20), peer


def _read_all(peer: trio.socket.SocketType) -> tuple[bytes, bool]:
    """What the peer can read now, and whether the other end is gone (EOF)."""
    got = bytearray()
    while True:
        try:
            chunk = os.read(peer.fileno(), 65536)
        except BlockingIOError:
            return bytes(got), False
        if not chunk:
            return bytes(got), True
        got += chunk


async def test_a_cancelled_send_writes_nothing_and_one_cut_off_ends_the_connection() -> None:
    """A send cancelled before it writes leaves the socket as it was (the Close after it is
    whole); one cancelled after part of its frame went out closes the socket, so no later
    frame lands inside it."""
    with _pair() as (ws, peer):
        await _cancelled_sends(ws, peer)


async def _cancelled_sends(ws: AgentConnection, peer: trio.socket.SocketType) -> None:
    with trio.CancelScope() as scope:
        scope.cancel()
        await ws.send_message(b"x" * 1_000_000)
    assert not ws.closed and _read_all(peer) == (b"", False)
    await ws.send_message(b"after")
    assert _read_all(peer) == (
        encode_frame(
            2,
            b"after",
        ),
        False,
    )

    big = b"y" * 1_000_000  # more than the pair's buffers: part goes out, the rest waits
    with trio.move_on_after(1):  # (the peer never reads: the rest never goes)
        await ws.send_message(big)
    assert ws.closed
    with pytest.raises(ConnectionClosed):
        await ws.send_message(b"never")
    await ws.aclose()  # (nothing to say: it is closed)
    got, eof = _read_all(peer)
    frame = encode_frame(
        2,
        big,
    )
    assert eof and 0 < len(got) < len(frame) and frame.startswith(got)


async def test_one_read_of_many_small_frames_does_not_hold_the_loop() -> None:
    """A client's one write of a thousand tiny messages, each answered: the handler yields
    every YIELD_EVERY messages, so the other tasks run meanwhile."""
    with _pair(1 << 20) as (ws, peer):
        await _many_small_frames(ws, peer)


async def test_a_read_of_pings_is_parsed_a_batch_at_a_time_yielding_between() -> None:
    """A client's one write of thousands of Pings (no message to hand out, so no
    `YIELD_EVERY`) and then one message: the read's frames are parsed PARSE_EVERY at a
    time with a pass of the scheduler between, and a read's Pings cost one Pong."""
    with _pair(1 << 20) as (ws, peer):
        pings = encode_frame(PING, b"", os.urandom(4)) * (16384 // 6)
        await peer.send(pings + encode_frame(2, b"last", os.urandom(4)))
        done = False
        turns = 0

        async def other_task() -> None:
            nonlocal turns
            while not done:
                await trio.lowlevel.checkpoint()
                turns += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_task)
            with trio.fail_after(10):
                assert await ws.get_message() == b"last"
            done = True
        batches = len(pings) // 6 // PARSE_EVERY
        assert turns >= batches // 2, turns  # (Trio may run the two in either order)
        pongs, _ = _read_all(peer)
        assert 1 <= len(pongs) // 2 <= 2  # one a read (two reads; a server's Pong: 2 bytes)


async def _many_small_frames(ws: AgentConnection, peer: trio.socket.SocketType) -> None:
    frames = b"".join(encode_frame(2, b"%d" % i, os.urandom(4)) for i in range(1000))
    await peer.send(frames)
    handled = 0
    seen_at: list[int] = []

    async def other_task() -> None:
        while handled < 1000:
            await trio.lowlevel.checkpoint()
            seen_at.append(handled)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(other_task)
        with trio.fail_after(10):
            for _ in range(1000):
                await ws.send_message(await ws.get_message())
                handled += 1
    # (Trio may run the two in either order after each yield: a step may span two yields)
    steps = [b - a for a, b in zip([0, *seen_at], seen_at, strict=False)]
    assert max(steps) <= 2 * YIELD_EVERY and len(seen_at) >= 1000 // (2 * YIELD_EVERY), steps
    echoed, _ = _read_all(peer)
    assert echoed == b"".join(
        encode_frame(
            2,
            b"%d" % i,
        )
        for i in range(1000)
    )


async def test_reads_that_fill_the_buffer_and_reads_that_empty_it_both_come_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A message longer than a read (its reads fill the buffer: the next is tried at once),
    then frames one at a time (each read empties the socket: the next waits for it first,
    so no read comes back empty-handed)."""
    from firsthop.services.agent import connection

    results: list[str] = []
    real_read = os.read

    def read(fd: int, n: int) -> bytes:
        try:
            data = real_read(fd, n)
        except BlockingIOError:
            results.append("would block")
            raise
        results.append("full" if len(data) == n else "some")
        return data

    monkeypatch.setattr(os, "read", read)  # (what connection.py reads with)
    async with trio.open_nursery() as nursery:
        port = await _serve(nursery)
        with trio.fail_after(10):
            async with open_websocket_url(f"ws://127.0.0.1:{port}") as ws:
                big = os.urandom(5 * connection.RECEIVE_SIZE)
                await ws.send_message(big)
                assert await ws.get_message() == big
                assert "full" in results
                results.clear()
                for i in range(50):
                    await ws.send_message(bytes([i]) * 1920)
                    assert await ws.get_message() == bytes([i]) * 1920
        nursery.cancel_scope.cancel()
    assert results.count("some") >= 50 and "would block" not in results
