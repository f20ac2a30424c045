"""Trio and asyncio on one thread: the process runs an asyncio host loop with Trio as a guest.

Measured, then chosen: aiortc is asyncio code, and the transceiver's per-packet paths (the
media socket, the agent link) run as asyncio readers, so the host loop is asyncio; Trio owns
every task and the lifecycle as a guest run (`trio.lowlevel.start_guest_run`). Trio code calls
into aiortc synchronously (same thread), awaits an asyncio coroutine with `call_asyncio`, and
asyncio callbacks reach Trio through its token.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import trio

T = TypeVar("T")


async def call_asyncio(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro` on the asyncio host loop and await it from Trio (guest mode)."""
    token = trio.lowlevel.current_trio_token()
    done = trio.Event()
    future = asyncio.ensure_future(coro)
    future.add_done_callback(lambda _: token.run_sync_soon(done.set))
    try:
        await done.wait()
    except trio.Cancelled:
        future.cancel()
        raise
    return future.result()


def run_trio_guest(
    trio_main: Callable[[], Awaitable[Any]],
) -> Any:
    """Run `trio_main` in Trio guest mode on a fresh asyncio host loop; return its result."""

    async def host() -> Any:
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[Any] = loop.create_future()

        def done(outcome: Any) -> None:
            if not finished.done():
                finished.set_result(outcome)

        trio.lowlevel.start_guest_run(
            trio_main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=done,
            host_uses_signal_set_wakeup_fd=True,
        )
        outcome = await finished
        return outcome.unwrap()

    return asyncio.run(host())


def watch_readable(sock: socket.socket, callback: Callable[[], None]) -> Callable[[], None]:
    """Call `callback` on the asyncio host loop whenever `sock` is readable; returns the
    function that stops it. (Called from Trio in guest mode: same thread, same loop.)"""
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    loop.add_reader(fd, callback)

    def stop() -> None:
        loop.remove_reader(fd)

    return stop
