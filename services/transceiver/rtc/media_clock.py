"""One timer for every call's media core, on the asyncio host loop.

Each call's core (`media/core.py`) says when it next needs the clock (`get_timer()`): its
output frame every 20 ms, its next RTCP report. A task or a timer per call would wake the
loop 50 times a second per call. Here all of them share one loop timer. When it fires,
every core that is due within `COALESCE` is handled in the same wake-up, so calls whose
slots fall close together cost one wake-up: a frame goes out up to `COALESCE` early, never
late. Each owner re-arms after every call into its core (aioquic's adapters re-read
`get_timer()` the same way). An owner has one live entry, and a replaced one is skipped
when it comes up. `before_tick` and `after_tick` run once per wake-up, around every due
owner: that is where a tick's sends can go out together.

Times are `time.monotonic()`'s, as everywhere on the media path (uvloop's `loop.time()` is
libuv's, in whole milliseconds); the loop's timer is asked for the delay.
libuv counts timers in whole milliseconds, so a wake-up itself may come up to about a
millisecond either side of its time (asking 1 ms early instead split owners that share a
wake-up now: 86 wake-ups where 50 do); coalescing only ever moves a frame earlier.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("firsthop.transceiver.media_clock")

COALESCE = 0.002  # seconds: owners due this soon are handled in the same wake-up


class ClockOwner(Protocol):
    timer_at: float | None  # the one live entry's time (set by `MediaClock.arm`)

    def on_timer(self, now: float) -> None: ...


class MediaClock:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        after_tick: Callable[[], None] | None = None,
        before_tick: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loop = loop
        self._clock = clock
        self._heap: list[tuple[float, int, ClockOwner]] = []
        self._seq = itertools.count()
        self._handle: asyncio.TimerHandle | None = None
        self.armed_at = math.inf
        self._live = 0  # owners with an entry
        self.after_tick = after_tick
        self.before_tick = before_tick
        self.wakeups = 0

    def arm(self, owner: ClockOwner, when: float | None) -> None:
        """`owner`'s next deadline is `when` (None: it needs none)."""
        if owner.timer_at == when:
            return
        if owner.timer_at is None and when is not None:
            self._live += 1
        elif owner.timer_at is not None and when is None:
            self._live -= 1
        owner.timer_at = when
        if when is None:
            return
        heapq.heappush(self._heap, (when, next(self._seq), owner))
        if len(self._heap) > 4 * self._live + 64:  # replaced entries: sweep them out
            self._heap = [e for e in self._heap if e[2].timer_at == e[0]]
            heapq.heapify(self._heap)
        if when < self.armed_at:
            self._schedule(when)

    def _schedule(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self.armed_at = when
        self._handle = self._loop.call_later(max(0.0, when - self._clock()), self._fire)

    def _fire(self) -> None:
        self._handle, self.armed_at = None, math.inf
        self.wakeups += 1
        now = self._clock()
        heap = self._heap
        due: list[tuple[float, ClockOwner]] = []
        while heap and heap[0][0] <= now + COALESCE:
            when, _, owner = heapq.heappop(heap)
            if owner.timer_at == when:  # (else replaced since)
                owner.timer_at = None
                self._live -= 1
                due.append((when, owner))
        if self.before_tick is not None:
            self.before_tick()
        try:
            for when, owner in due:
                try:
                    # An owner due a little later is told it is its time: its frame goes
                    # out up to COALESCE early (what it re-arms waits for the next wake-up).
                    owner.on_timer(max(now, when))
                except Exception:  # its own failure handling missed it: its call only
                    log.exception("a media timer raised")
        finally:
            if self.after_tick is not None:
                self.after_tick()
        while heap and heap[0][2].timer_at != heap[0][0]:
            heapq.heappop(heap)
        if heap:
            self._schedule(heap[0][0])


_clocks: dict[asyncio.AbstractEventLoop, MediaClock] = {}


def around_ticks(before: Callable[[], None], after: Callable[[], None]) -> None:
    """Run `before` and `after` around every wake-up of the running loop's media clock."""
    clock = clock_of(asyncio.get_running_loop())
    clock.before_tick, clock.after_tick = before, after


def next_tick(loop: asyncio.AbstractEventLoop) -> float:
    """When the loop's media clock next fires (`time.monotonic()`; inf: it has no clock, or
    nothing is due)."""
    clock = _clocks.get(loop)
    return math.inf if clock is None else clock.armed_at


def clock_of(loop: asyncio.AbstractEventLoop) -> MediaClock:
    """The loop's one media clock (made on first use; gone with the loop)."""
    clock = _clocks.get(loop)
    if clock is None:
        for old in [old for old in _clocks if old.is_closed()]:
            del _clocks[old]
        clock = _clocks[loop] = MediaClock(loop)
    return clock
