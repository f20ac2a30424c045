"""Trio and asyncio on one thread: the process runs an asyncio host loop with Trio as a guest.

Measured, then chosen: aiortc is asyncio code, and the transceiver's per-packet paths (the
media socket, the agent link) run as asyncio readers, so the host loop is asyncio; Trio owns
every task and the lifecycle as a guest run (`trio.lowlevel.start_guest_run`). Trio code calls
into aiortc synchronously (same thread), awaits an asyncio coroutine with `call_asyncio`, and
asyncio callbacks reach Trio through its token.

The host loop's selector lets a busy loop's next batch gather (`GatheringSelector`, the rule
in `shared/gather.py`): with many calls the media socket, the agent links and the media clock
each wake the loop for one or two events at a time, and those wake-ups cost more than the
events (measured at 24 echo calls: the transceiver's CPU 24.8-26.1 % of a core without,
22.1-23.8 % with). A gather never delays an asyncio timer (the media clock's): it ends by
the loop's next one; what Trio schedules (its deadlines, its wake-ups from other threads)
waits at most one gather.
"""

from __future__ import annotations

import asyncio
import selectors
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import trio

from firsthop.shared.gather import Gather

T = TypeVar("T")

# The transceiver loop's gather (`shared/gather.py`): events are ready file descriptors (the
# media socket, one per batch of datagrams; an agent link; Trio's and asyncio's wake-ups).
# Below ~1,000 a second (some 10 calls) a gather only adds a sleep (measured at 4 and 8
# calls: no gain); at 24 calls, gathering after every wake-up that carried any, 1 ms saved
# 3 % of the transceiver's CPU, 2 ms 11-13 %, 4 ms 17 %, for that much more latency at
# most on a datagram or an agent frame. Near saturation that latency, added at every hop
# of the whole path on one core, cost its knee 10 calls: hence no gather after a wake-up
# that found GATHER_BATCH ready.
GATHER_BATCH = 8
GATHER_FLOOR = 0.0002
GATHER_BUSY_RATE = 1000.0
GATHER_MIN = 4
_gathering: dict[asyncio.AbstractEventLoop, GatheringSelector] = {}  # loops that gather


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


def run_trio_guest(trio_main: Callable[[], Awaitable[Any]], gather: float = 0.0) -> Any:
    """Run `trio_main` in Trio guest mode on a fresh asyncio host loop; return its result.
    `gather`: the longest, in seconds, a busy loop lets its next batch gather (0: never)."""

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

    if gather <= 0:
        return asyncio.run(host())

    def gathering_loop() -> asyncio.AbstractEventLoop:
        selector = GatheringSelector(gather)
        loop = asyncio.SelectorEventLoop(selector)
        _gathering[loop] = selector
        return loop

    with asyncio.Runner(loop_factory=gathering_loop) as runner:
        loop = runner.get_loop()
        try:
            return runner.run(host())
        finally:
            _gathering.pop(loop, None)


def work_left() -> None:
    """A reader left work behind (its read filled a whole batch): the loop's next wait must
    not gather (under a flood a sleep there would only let the socket's buffer overflow)."""
    selector = _gathering.get(asyncio.get_running_loop())
    if selector is not None:
        selector.more = True


def gather_counts() -> dict[str, int]:
    """The running loop's gathers (`loop_gathers`) and wake-ups whose readers left work
    behind (`loop_work_left`), for /metrics; nothing if it does not gather."""
    try:
        selector = _gathering.get(asyncio.get_running_loop())
    except RuntimeError:  # (no asyncio loop: a service run by Trio alone, in tests)
        return {}
    if selector is None:
        return {}
    return {"loop_gathers": selector.slept, "loop_work_left": selector.left}


class GatheringSelector(selectors.EpollSelector):
    """An epoll selector that, after a busy wake-up, sleeps before the next wait (as long
    as `gather.after` says, and never past the wait's own timeout: the loop's next timer),
    so the events of that time come back together."""

    def __init__(
        self,
        most: float,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.gather = Gather(most, GATHER_FLOOR, GATHER_BATCH, GATHER_BUSY_RATE, GATHER_MIN)
        self._sleep, self._clock = sleep, clock
        self.more = False  # a reader left work behind in this wake-up (`work_left`)
        self.left = 0  # wake-ups that did
        self.slept = 0  # gathers: sleeps before a wait
        self._handled, self._at = 0, clock()  # the last wake-up's ready, and when

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        # Asked now, not at the end of the last select: its events' readers have run since,
        # and one may have left work behind. A wake-up that found a batch's worth ready is
        # batching already (near saturation a sleep after it only adds its latency to every
        # hop of a call).
        handled, more, self.more = self._handled, self.more, False
        self.left += more
        wait = self.gather.after(self._at, handled, more or handled >= GATHER_BATCH)
        if wait and (timeout is None or timeout > 0):
            deadline = None if timeout is None else self._clock() + timeout
            self._sleep(wait if timeout is None else min(wait, timeout))
            self.slept += 1
            if deadline is not None:  # what the sleep took, overshoot and all
                timeout = max(0.0, deadline - self._clock())
        ready = self._poll(timeout)
        self._handled, self._at = len(ready), self._clock()
        return ready

    def _poll(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        return super().select(timeout)


def watch_readable(sock: socket.socket, callback: Callable[[], None]) -> Callable[[], None]:
    """Call `callback` on the asyncio host loop whenever `sock` is readable; returns the
    function that stops it. (Called from Trio in guest mode: same thread, same loop.)"""
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    loop.add_reader(fd, callback)

    def stop() -> None:
        loop.remove_reader(fd)

    return stop
