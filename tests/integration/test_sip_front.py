"""Signaling's SIP front (`signaling/sip.py`) in-process, on real loopback sockets: what the
TCP reader does with one read of many messages, and its UDP and TCP on one port."""

from __future__ import annotations

import socket

import httpx
import pytest
import trio

from firsthop.services.signaling.calls import Stats
from firsthop.services.signaling.main import build_context
from firsthop.services.signaling.sip import (
    STREAM_BATCH,
    SipConfig,
    SipFront,
    bind_udp_and_tcp,
)
from firsthop.services.sip.uas import Trunk
from tests.unit.test_signaling_app import make_config
from tests.unit.test_sip_uas import request

MESSAGES = 40 * STREAM_BATCH


async def test_a_read_of_many_messages_lets_others_run_between_batches() -> None:
    """A trunk's one TCP write of 640 OPTIONS is handled 16 at a time, the loop running
    others in between (signaling's HTTP, the other calls' timers): another task sees the
    count of answered requests grow in steps of at most a batch, not at once. And every one
    is answered: the writer sent one message a pass of the loop while the reader queued 16,
    so past the connection's queue (64) the answers were dropped (556 of these 640)."""
    async with httpx.AsyncClient() as http:
        context = build_context(make_config(), http, None, Stats())
        front = SipFront(
            context.calls, SipConfig(("127.0.0.1", 0), [Trunk.of("local", ["127.0.0.1/32"])])
        )
        counters = context.stats.counters
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(front.serve)
            seen: list[int] = []

            async def watch() -> None:  # runnable at every pass of the loop
                while True:
                    seen.append(counters["sip_requests_options"])
                    await trio.lowlevel.checkpoint()

            nursery.start_soon(watch)
            burst = b"".join(
                request("OPTIONS", branch=f"z9hG4bKo{i}", via_host="127.0.0.1:5062")
                for i in range(MESSAGES)
            )
            async with await trio.open_tcp_stream(host, port) as stream:
                await stream.send_all(burst + b"\r\n\r\n")
                answers = b""
                with trio.fail_after(10):
                    while answers.count(b"SIP/2.0 200 ") < MESSAGES:
                        answers += await stream.receive_some(1 << 20)
            nursery.cancel_scope.cancel()
    # its TCP listener is closed with it (explicitly: trio.serve_listeners does not)
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=2).close()
    assert counters["sip_requests_options"] == MESSAGES and not counters["sip_tcp_dropped"]
    steps = [b - a for a, b in zip(seen, seen[1:], strict=False) if b > a]
    # (Trio may run the reader late in one pass and early in the next: two batches between
    # two looks; without the yield, all 640 in one step.)
    assert max(steps) <= 2 * STREAM_BATCH, steps
    assert len(steps) >= MESSAGES // STREAM_BATCH // 2, steps


async def test_port_0_takes_a_port_free_for_tcp_too() -> None:
    """Port 0: the kernel picks the UDP port, and some TCP socket may hold that number (two
    test processes at once met it: signaling's SIP could not start). The next UDP ports the
    kernel gives are held for TCP here too, until one is free for both; a port given is
    refused as it is."""
    held: list[socket.socket] = []
    with trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        trio_socket = type(probe)  # (trio's concrete class)
    real_bind = trio_socket.bind
    tries = 0

    async def bind_then_hold_its_tcp(sock: trio.socket.SocketType, address: object) -> None:
        nonlocal tries
        await real_bind(sock, address)
        if sock.type != socket.SOCK_DGRAM:
            return
        tries += 1
        if tries <= 3:  # the first three picks: a TCP socket has that number already
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                tcp.bind(("127.0.0.1", sock.getsockname()[1]))
            except OSError:  # another process's has it (parallel tests): as good, and not ours
                tcp.close()  # (left open, it failed whichever test collected it)
            else:
                held.append(tcp)

    mp = pytest.MonkeyPatch()
    mp.setattr(trio_socket, "bind", bind_then_hold_its_tcp)
    try:
        sock, listeners = await bind_udp_and_tcp(("127.0.0.1", 0))
        mp.undo()
        with sock:
            port = sock.getsockname()[1]
            assert tries == 4 and port not in {s.getsockname()[1] for s in held}
            assert listeners[0].socket.getsockname()[1] == port
            for listener in listeners:
                await listener.aclose()
        with pytest.raises(OSError):  # a port given that TCP holds: refused, not moved
            await bind_udp_and_tcp(("127.0.0.1", held[0].getsockname()[1]))
    finally:
        mp.undo()
        for tcp in held:
            tcp.close()
