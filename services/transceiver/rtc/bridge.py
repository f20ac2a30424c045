"""Trio and asyncio on one thread: the process runs an asyncio host loop with Trio as a guest.

Measured, then chosen: aiortc is asyncio code, and the transceiver's per-packet paths (the
media socket, the agent link) run as asyncio readers, so the host loop is asyncio; Trio owns
every task and the lifecycle as a guest run (`trio.lowlevel.start_guest_run`). Trio code calls
into aiortc synchronously (same thread), awaits an asyncio coroutine with `call_asyncio`, and
asyncio callbacks reach Trio through its token.

The host loop is uvloop's (libuv, in C): the stock selector loop ran each wake-up's
`_run_once` and selector in Python. Measured at 8 echo calls in interleaved pairs (stop 51):
the transceiver's CPU 0.83-0.99x asyncio's, about 7 % less against its own agent's and
relay's in the same runs.

A busy loop lets its next batch gather (`LoopGather`, the rule in `shared/gather.py`): with
many calls the media socket, the agent links and the media clock each wake the loop for one
or two events at a time, and those wake-ups cost more than the events (measured at 24 echo
calls: the transceiver's CPU 24.8-26.1 % of a core without, 22.1-23.8 % with). A gather
never delays the media clock: it ends by the clock's next tick; what Trio schedules (its
deadlines, its wake-ups from other threads) and other asyncio callbacks wait at most one
gather.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import trio
import uvloop

from firsthop.services.transceiver.rtc.media_clock import next_tick
from firsthop.shared.gather import Gather

T = TypeVar("T")

# The transceiver loop's gather (`shared/gather.py`): events are the readers that ran of
# sockets watched through `watch_readable` (the media socket, one per batch of datagrams;
# an agent link).
# Below ~1,000 a second (some 10 calls) a gather only adds a sleep (measured at 4 and 8
# calls: no gain); at 24 calls, gathering after every wake-up that carried any, 1 ms saved
# 3 % of the transceiver's CPU, 2 ms 11-13 %, 4 ms 17 %, for that much more latency at
# most on a datagram or an agent frame. Near saturation that latency, added at every hop
# of the whole path on one core, cost its knee 10 calls: hence no gather after a wake-up
# that found GATHER_BATCH ready.
GATHER_BATCH = 8
GATHER_FLOOR = 0.0002
GATHER_BUSY_RATE = 1000.0
_gathering: dict[asyncio.AbstractEventLoop, LoopGather] = {}  # loops that gather


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

        def soon(fn: Callable[[], Any]) -> None:
            def run() -> None:
                fn()
                loop.time()  # (libuv's now, refreshed: see `LoopGather.end_of_wake_up`)

            loop.call_soon_threadsafe(run)

        trio.lowlevel.start_guest_run(
            trio_main,
            run_sync_soon_threadsafe=soon,
            done_callback=done,
            host_uses_signal_set_wakeup_fd=True,
        )
        outcome = await finished
        return outcome.unwrap()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        loop = runner.get_loop()
        if gather > 0:
            _gathering[loop] = LoopGather(loop, gather)
        try:
            return runner.run(host())
        finally:
            _gathering.pop(loop, None)


def work_left() -> None:
    """A reader left work behind (its read filled a whole batch, or it comes back to the rest
    with `call_soon`): the loop's next wait must not gather (under a flood a sleep there
    would only let the socket's buffer overflow)."""
    gathering = _gathering.get(asyncio.get_running_loop())
    if gathering is not None:
        gathering.work_left()


def gather_counts() -> dict[str, int]:
    """The running loop's gathers (`loop_gathers`) and wake-ups whose readers left work
    behind (`loop_work_left`), for /metrics; nothing if it does not gather."""
    try:
        gathering = _gathering.get(asyncio.get_running_loop())
    except RuntimeError:  # (no asyncio loop: a service run by Trio alone, in tests)
        return {}
    if gathering is None:
        return {}
    return {"loop_gathers": gathering.slept, "loop_work_left": gathering.left}


class LoopGather:
    """After a busy wake-up, a sleep before the loop's next wait (as long as `gather.after`
    says, and never past the media clock's next tick), so the events of that time come
    back together.

    The readers that count (`watch_readable`'s) call `event` as they run. While the loop is
    busy (the last window's rate at `GATHER_BUSY_RATE` or more), the first event of a
    wake-up queues `end_of_wake_up` with `call_soon`, which the loop runs after the
    wake-up's readers, just before it waits again: where a selector's gather sleeps. While
    it is quiet, no wake-up gathers and none is asked about (a queued callback costs the
    loop another pass: 4 % of the transceiver's Python time at 8 calls, measured): events
    only count in the rate, a window at a time. A reader that left work behind
    (`work_left`) has its wake-up asked about either way, for `left`."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        most: float,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        next_deadline: Callable[[], float] | None = None,
    ) -> None:
        # (`min_batch`, the relay's rule for a quiet loop's full wake-up, has no part here: a
        # quiet loop asks nothing of its wake-ups, so the rule is given the batch itself)
        self.gather = Gather(most, GATHER_FLOOR, GATHER_BATCH, GATHER_BUSY_RATE, GATHER_BATCH)
        self._loop = loop
        self._sleep, self._clock = sleep, clock
        self._next_deadline = next_deadline or (lambda: next_tick(loop))
        self.more = False  # a reader left work behind in this wake-up (`work_left`)
        self.left = 0  # wake-ups that did
        self.slept = 0  # gathers: sleeps before a wait
        self._asked = False  # `end_of_wake_up` is queued for this wake-up
        self._handled = 0  # this wake-up's events since it was asked about
        self._unasked = 0  # events not asked about, for the rate
        self._since = clock()  # when those last went into the rate
        self.gather.after(self._since, 0)  # (its first window starts now)

    def event(self) -> None:
        """A counted reader ran (one ready file descriptor)."""
        if self._asked:
            self._handled += 1
        elif self.gather.rate >= GATHER_BUSY_RATE:
            self._ask()
            self._handled += 1
        else:
            self._unasked += 1
            now = self._clock()
            if now - self._since >= self.gather.window:
                self.gather.after(now, 0, earlier=self._unasked)
                self._unasked, self._since = 0, now

    def work_left(self) -> None:
        self.more = True
        if not self._asked:
            self._ask()

    def _ask(self) -> None:
        self._asked = True
        self._loop.call_soon(self.end_of_wake_up)

    def end_of_wake_up(self) -> None:
        handled, more, earlier = self._handled, self.more, self._unasked
        self._handled, self.more, self._unasked, self._asked = 0, False, 0, False
        self.left += more
        now = self._since = self._clock()
        # A wake-up that found a batch's worth ready is batching already (near saturation a
        # sleep after it only adds its latency to every hop of a call).
        wait = self.gather.after(now, handled, more or handled >= GATHER_BATCH, earlier)
        if wait:
            wait = min(wait, self._next_deadline() - now)
            if wait > 0:
                self._sleep(wait)
                self.slept += 1
        # libuv reads its clock once a pass, before its timers: callbacks queued with
        # `call_soon` (this one, Trio's batches) run after that, and the next wait's timeout
        # is reckoned from it, so whatever they take (a gather's sleep above all) would make
        # the media clock's tick that much late. uvloop's `time()` reads the clock anew.
        # (A helper measured it, 20 ticks with a datagram 1.5 ms before each: late by 1.15-
        # 1.20 ms in the median after a gather, -0.03-0.02 ms with this.)
        self._loop.time()


def watch_readable(sock: socket.socket, callback: Callable[[], None]) -> Callable[[], None]:
    """Call `callback` on the asyncio host loop whenever `sock` is readable, each call an
    event of the loop's gather; returns the function that stops it. (Called from Trio in
    guest mode, or from asyncio: same thread, same loop.)"""
    loop = asyncio.get_running_loop()
    fd = sock.fileno()
    gathering = _gathering.get(loop)
    if gathering is None:
        loop.add_reader(fd, callback)
    else:
        event = gathering.event

        def counted() -> None:
            event()
            callback()

        loop.add_reader(fd, counted)

    def stop() -> None:
        loop.remove_reader(fd)

    return stop
