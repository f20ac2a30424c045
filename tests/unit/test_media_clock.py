"""The one media clock (rtc/media_clock.py) on a fake loop: one timer for every owner, owners
due close together handled in one wake-up (early by at most COALESCE, told it is their
time), replaced entries skipped, a raising owner not stopping the others."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, cast

import pytest

from firsthop.services.transceiver.rtc.media_clock import COALESCE, MediaClock


class FakeLoop:
    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[tuple[float, Callable[[], None], bool]] = []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback: Callable[[], None]) -> Any:
        loop = self
        when = self.now + delay

        class Handle:
            def cancel(self) -> None:
                loop.timers = [t for t in loop.timers if t[1] is not callback or t[0] != when]

        self.timers.append((when, callback, True))
        return Handle()

    def run_until(self, until: float) -> int:
        """Fire due timers in order, the clock jumping to each; how many fired."""
        fired = 0
        while self.timers:
            self.timers.sort(key=lambda t: t[0])
            when, callback, _ = self.timers[0]
            if when > until:
                break
            self.timers.pop(0)
            self.now = max(self.now, when)
            callback()
            fired += 1
        self.now = until
        return fired


class Ticker:
    """An owner with a 20 ms period starting at `phase`."""

    def __init__(self, clock: MediaClock, phase: float, fail: bool = False) -> None:
        self.clock = clock
        self.timer_at: float | None = None
        self.next = phase
        self.seen: list[float] = []
        self.fail = fail
        clock.arm(self, phase)

    def on_timer(self, now: float) -> None:
        self.seen.append(now)
        if self.fail:
            raise RuntimeError("boom")
        while self.next <= now:
            self.next = round(self.next + 0.02, 9)
        self.clock.arm(self, self.next)


def make() -> tuple[FakeLoop, MediaClock]:
    loop = FakeLoop()
    return loop, MediaClock(cast(asyncio.AbstractEventLoop, loop), clock=loop.time)


def test_owners_due_close_together_share_a_wake_up_and_none_is_late() -> None:
    loop, clock = make()
    owners = [Ticker(clock, 0.02 + 0.0005 * i) for i in range(4)]  # within 1.5 ms
    fired = loop.run_until(1.0)
    assert fired == clock.wakeups == 50  # one wake-up per 20 ms for all four
    for i, owner in enumerate(owners):
        assert len(owner.seen) == 50
        phase = 0.02 + 0.0005 * i
        for k, t in enumerate(owner.seen):  # told its own time, up to COALESCE early
            due = phase + 0.02 * k
            assert t == pytest.approx(due) or due - COALESCE <= t <= due


def test_owners_far_apart_get_their_own_wake_ups() -> None:
    loop, clock = make()
    Ticker(clock, 0.0)
    Ticker(clock, 0.01)
    assert loop.run_until(0.1) == 11  # 0, 10, 20, ... 100 ms


def test_a_replaced_entry_is_skipped_and_none_disarms() -> None:
    loop, clock = make()
    owner = Ticker(clock, 0.5)
    clock.arm(owner, 0.1)  # earlier: the timer moves
    loop.run_until(0.12)
    assert owner.seen == [0.1]
    clock.arm(owner, None)
    loop.run_until(2.0)
    assert owner.seen == [0.1]  # the stale 0.5 and 0.12 entries never fired it


def test_the_heap_stays_bounded_however_often_an_owner_re_arms() -> None:
    loop, clock = make()
    owner = Ticker(clock, 1.0)
    for i in range(10_000):
        clock.arm(owner, 1.0 + (i % 7) * 0.001)
    assert len(clock._heap) <= 4 * 1 + 64 + 1


def test_a_raising_owner_does_not_stop_the_others() -> None:
    loop, clock = make()
    bad = Ticker(clock, 0.02, fail=True)
    good = Ticker(clock, 0.02)
    loop.run_until(0.2)
    assert len(bad.seen) == 1 and len(good.seen) == 10
