"""The transceiver's agent link (wsproto on the asyncio host loop) against a real
WebSocket server from another library."""

from __future__ import annotations

import asyncio
import fcntl
import os
import select
import socket
import termios
from collections.abc import Awaitable, Callable

import pytest
from websockets.asyncio.server import Server, ServerConnection, serve

from firsthop.services.transceiver.rtc import AgentLink, AgentLinkError, run_trio_guest
from firsthop.services.transceiver.rtc.bridge import _gathering
from firsthop.shared.wire.websocket import (
    BINARY,
    PING,
    PONG,
    Close,
    WebSocketReader,
    encode_frame,
)
from tests.support import eventually


async def _serve(handler: Callable[[ServerConnection], Awaitable[None]]) -> tuple[Server, str]:
    server = await serve(handler, "127.0.0.1", 0, max_size=4 << 20)
    port = next(iter(server.sockets)).getsockname()[1]
    return server, f"ws://127.0.0.1:{port}/agent"


def settle(future: asyncio.Future[str]) -> Callable[[str], None]:
    """An `on_closed` callback that resolves `future` with the first reason given."""

    def on_closed(why: str) -> None:
        if not future.done():
            future.set_result(why)

    return on_closed


def test_messages_both_ways_and_oversize_and_close() -> None:
    async def main() -> None:
        got_bin: list[str | bytes] = []
        got_text: list[str | bytes] = []
        closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def handler(ws: ServerConnection) -> None:
            async for message in ws:
                if message == "big":
                    await ws.send(b"x" * (2 << 20))
                elif message == "bye":
                    await ws.close()
                else:
                    await ws.send(message)

        server, url = await _serve(handler)
        link = AgentLink(
            url,
            on_message=lambda m: (got_text if isinstance(m, str) else got_bin).append(m),
            on_closed=settle(closed),
        )
        await asyncio.wait_for(link.connect(), 5)
        for i in range(50):
            assert link.send(bytes([i]) * 1920)
        assert link.send('{"type": "hello"}')
        await eventually(lambda: len(got_bin) >= 50 and got_text, 5)
        assert got_bin == [bytes([i]) * 1920 for i in range(50)]
        assert got_text == ['{"type": "hello"}']
        link.send("big")
        assert "over 1 MiB" in await asyncio.wait_for(closed, 5)
        assert not link.open and not link.send(b"late")

        closed2: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        link2 = AgentLink(
            url,
            on_message=lambda m: (got_text if isinstance(m, str) else got_bin).append(m),
            on_closed=settle(closed2),
        )
        await asyncio.wait_for(link2.connect(), 5)
        link2.send("bye")
        assert "closed" in await asyncio.wait_for(closed2, 5)
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_bad_urls_and_refusals() -> None:
    with pytest.raises(AgentLinkError):
        AgentLink("http://x", on_message=print, on_closed=print)

    async def main() -> None:
        link = AgentLink("ws://127.0.0.1:1", on_message=print, on_closed=print)
        with pytest.raises(OSError):
            await asyncio.wait_for(link.connect(), 5)

    asyncio.run(main())


def test_an_opening_that_fails_the_link_is_a_connect_error_not_a_crash() -> None:
    """An opening the link cannot take (past its send backlog: the agent does not read) fails
    the connect with `AgentLinkError` and reports nothing else. It used to leave a closed
    socket behind and `add_reader(-1)` raised ValueError, which ended the whole transceiver."""

    async def main() -> None:
        release = asyncio.Event()

        async def handler(ws: ServerConnection) -> None:
            await release.wait()  # reads nothing until the test is over

        server, url = await _serve(handler)
        closed: list[str] = []
        link = AgentLink(url, on_message=print, on_closed=closed.append)
        # past the kernel buffers and the 16 messages the server library queues unread
        opening: list[str | bytes] = ["x" * (AgentLink.MAX_BACKLOG // 2)] * 40
        with pytest.raises(AgentLinkError, match="opening failed"):
            await asyncio.wait_for(link.connect(first=opening), 5)
        assert not link.open and link.sock is None and closed == []
        release.set()
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_the_agent_speaks_first_pings_and_its_close_is_answered() -> None:
    """What the agent sends right behind its 101 (maybe in the same segment) is delivered;
    its ping gets a pong; its Close is answered with one (the server sees a clean 1000)."""

    async def main() -> None:
        got: list[str | bytes] = []
        closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        server_saw: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

        async def handler(ws: ServerConnection) -> None:
            await ws.send("first")
            await ws.send(b"\x01" * 1920)
            pong = await ws.ping(b"are you there")
            await asyncio.wait_for(pong, 5)
            await ws.send("pong came")
            await ws.close(1000)
            server_saw.set_result(ws.close_code)

        server, url = await _serve(handler)
        link = AgentLink(url, on_message=got.append, on_closed=settle(closed))
        await asyncio.wait_for(link.connect(), 5)
        assert "(1000)" in await asyncio.wait_for(closed, 5)
        assert link.hung_up
        assert got == ["first", b"\x01" * 1920, "pong came"]
        assert await asyncio.wait_for(server_saw, 5) == 1000
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_a_frame_no_agent_may_send_is_answered_with_the_violations_close_code() -> None:
    """RFC 6455 §7.1.7: the link says why it fails (1002, a reserved opcode here) before it
    hangs up; the messages before the bad frame are delivered."""

    async def main() -> None:
        got: list[str | bytes] = []
        closed: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        server_saw: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()

        async def handler(ws: ServerConnection) -> None:
            await ws.send("before")
            ws.transport.write(bytes([0x80 | 0x3, 0]))  # opcode 3: reserved
            await ws.wait_closed()
            server_saw.set_result(ws.close_code)

        server, url = await _serve(handler)
        link = AgentLink(url, on_message=got.append, on_closed=settle(closed))
        await asyncio.wait_for(link.connect(), 5)
        assert "(1002)" in await asyncio.wait_for(closed, 5)
        assert got == ["before"]
        assert await asyncio.wait_for(server_saw, 5) == 1002
        server.close()
        await server.wait_closed()

    asyncio.run(main())


def test_the_goodbye_goes_behind_what_is_still_queued() -> None:
    """`close` with part of a frame still queued (the agent reads slowly) sends the rest of
    it before its Close frame, not the Close frame into the middle of it."""

    async def main() -> None:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        link = AgentLink("ws://127.0.0.1:9/", on_message=print, on_closed=print)
        link.sock, link.open = ours, True
        frame = encode_frame(BINARY, b"m" * 1000, os.urandom(4))
        ours.send(frame[:300])
        link._out += frame[300:]  # (as `_send` leaves what the socket did not take)
        link.close()
        theirs.settimeout(5)
        wire = b""
        while chunk := theirs.recv(65536):
            wire += chunk
        theirs.close()
        reader = WebSocketReader(masked=True, max_message=1 << 20)
        assert reader.feed(wire) == [b"m" * 1000, Close(1000, "")]

    asyncio.run(main())


def test_one_wake_up_handles_a_bounded_amount_of_an_agents_flood() -> None:
    """An agent's flood of tiny frames (here 64 KiB of empty ones, and Pings) is read
    READ_SIZE bytes a read and handled FRAMES_PER_WAKE frames a callback, the rest on the
    loop's next passes, in order; the socket is not read again while a read's frames wait
    (memory: one read), and a read's Pings cost one Pong."""

    async def main() -> None:
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        got: list[str | bytes] = []
        link = AgentLink("ws://127.0.0.1:9/", on_message=got.append, on_closed=print)
        link.sock, link.open = ours, True
        asyncio.get_running_loop().add_reader(ours.fileno(), link._readable)
        flood = b"".join(
            encode_frame(BINARY, i.to_bytes(2, "big")) + encode_frame(PING, b"")
            for i in range(64 * 1024 // 6)
        )
        theirs.sendall(flood)
        link._readable()
        per_wake = AgentLink.FRAMES_PER_WAKE
        assert len(got) == per_wake // 2  # (a frame and a Ping each)
        assert unread(ours) == len(flood) - AgentLink.READ_SIZE
        link._readable()  # the socket is readable, but the read's frames go first
        assert len(got) == per_wake and unread(ours) == len(flood) - AgentLink.READ_SIZE
        passes = 0
        while len(got) < len(flood) // 6:
            await asyncio.sleep(0)  # one pass of the loop: the reader and the rest
            passes += 1
            assert passes < 10_000
        assert got == [i.to_bytes(2, "big") for i in range(len(flood) // 6)]
        assert passes >= len(flood) // 3 // (2 * per_wake)  # never more than two a pass
        theirs.setblocking(False)
        pongs = theirs.recv(65536)  # a Pong a read (a client's: masked, 2 + 4 bytes)
        assert pongs[:2] == bytes((0x80 | PONG, 0x80))
        assert 1 <= len(pongs) // 6 <= len(flood) // AgentLink.READ_SIZE + 1
        link.close()
        theirs.close()

    asyncio.run(main())


def unread(sock: socket.socket) -> int:
    """Bytes waiting in `sock`'s receive buffer."""
    return int.from_bytes(fcntl.ioctl(sock, termios.FIONREAD, bytes(4)), "little")


def test_a_read_that_fills_its_size_tells_a_gathering_loop_to_come_back_at_once() -> None:
    """The agent sent more than one read takes: the loop must not gather before the next
    (`rtc/bridge.py`'s `work_left`); a read that took the rest says nothing."""

    async def main() -> tuple[bool, bool]:
        selector = _gathering[asyncio.get_running_loop()]
        ours, theirs = socket.socketpair()
        ours.setblocking(False)
        got: list[str | bytes] = []
        link = AgentLink("ws://127.0.0.1:9/", on_message=got.append, on_closed=print)
        link.sock, link.open = ours, True
        frame = encode_frame(BINARY, b"x" * 1000)
        theirs.sendall(frame * (AgentLink.READ_SIZE // len(frame) + 2))  # a read and a bit
        link._readable()
        full, selector.more = selector.more, False
        link._readable()
        assert len(got) == AgentLink.READ_SIZE // len(frame) + 2
        link.close()
        theirs.close()
        return full, selector.more

    assert run_trio_guest(main, gather=0.002) == (True, False)


def test_our_goodbye_is_a_close_and_a_fin_not_a_reset_with_the_agents_data_unread() -> None:
    """The agent sent something we did not read yet when the call ends: the link reads it
    away before closing, so the agent gets our Close and an orderly end of stream, not a
    TCP reset (which a socket closed with unread data sends)."""

    async def main() -> None:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            theirs = socket.create_connection(listener.getsockname())
            ours, _ = listener.accept()
        ours.setblocking(False)
        link = AgentLink("ws://127.0.0.1:9/", on_message=print, on_closed=print)
        link.sock, link.open = ours, True
        theirs.sendall(encode_frame(BINARY, b"unread" * 1000))
        assert select.select([ours], [], [], 5)[0]  # it is in our socket's buffer, unread
        link.close()
        theirs.settimeout(5)
        wire = b""
        while chunk := theirs.recv(65536):  # ConnectionResetError here, before the fix
            wire += chunk
        theirs.close()
        reader = WebSocketReader(masked=True, max_message=1 << 20)
        assert reader.feed(wire) == [Close(1000, "")]

    asyncio.run(main())
