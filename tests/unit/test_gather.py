"""A busy loop's gather: the rule (`shared/gather.py`), the transceiver's selector that follows
it (`rtc/bridge.py`), and its flag."""

from __future__ import annotations

import argparse
import asyncio
import selectors
import socket
from functools import partial

import pytest

from firsthop.services.transceiver.main import config_from_args, register
from firsthop.services.transceiver.rtc.bridge import (
    GATHER_BATCH,
    GatheringSelector,
    _gathering,
    run_trio_guest,
    work_left,
)
from firsthop.shared.gather import Gather


def relay_rule() -> Gather:  # the relay's figures (`services/relay/dataplane.py`)
    return Gather(most=0.0007, floor=0.0002, batch=32, busy_rate=5000.0, min_batch=4)


def test_a_quiet_loop_never_gathers() -> None:
    g = relay_rule()
    now = 0.0
    for _ in range(200):  # a datagram every 10 ms: a call's rate
        now += 0.01
        assert g.after(now, 1) == 0.0
    assert g.after(now, 0) == 0.0  # a wake-up that carried nothing
    assert g.rate == pytest.approx(100, rel=0.1)


def test_wake_ups_carried_elsewhere_count_in_the_rate_only() -> None:
    """The relay's C loop handles wake-ups of a few datagrams without asking: their count
    comes with the next question (`earlier`), for the rate, never as that wake-up's."""
    g = relay_rule()
    now = 0.0
    for _ in range(20):  # 50 ms at a time, 300 datagrams in 100 small wake-ups each
        now += 0.05
        assert g.after(now, 0, earlier=300) == 0.0  # (the window ended: no wake-up now)
    assert g.rate == pytest.approx(6000, rel=0.01)
    assert g.after(now + 0.001, 1) > 0  # busy by that rate: one datagram gathers
    quiet = relay_rule()
    assert quiet.after(0.0, 0, earlier=3) == 0.0 and quiet.after(0.05, 1, earlier=3) == 0.0
    assert quiet.rate == pytest.approx(140, rel=0.01)


def test_a_full_wake_up_gathers_at_once_and_a_busy_loop_after_every_wake_up() -> None:
    g = relay_rule()
    assert g.after(0.0, 4) == 0.0007  # min_batch in one wake-up: no rate known yet, the most
    assert g.after(0.0001, 1) == 0.0  # one, the rate not yet known: not busy
    g = relay_rule()
    now = 0.0
    for _ in range(2000):  # 40,000/s, two a wake-up (0.1 s): the most
        now += 0.00005
        wait = g.after(now, 2)
    assert g.rate == pytest.approx(40_000, rel=0.05) and wait == 0.0007
    for _ in range(4000):  # 80,000/s
        now += 0.000025
        wait = g.after(now, 2)
    assert wait == pytest.approx(32 / g.rate) and wait < 0.0007  # as long as `batch` take
    for _ in range(10_000):  # 400,000/s: the floor
        now += 0.00001
        wait = g.after(now, 4)
    assert wait == 0.0002
    assert g.after(now, 5, more=True) == 0.0  # a read left work behind: no waiting


def test_the_rate_is_measured_over_whole_windows() -> None:
    g = relay_rule()
    g.after(0.0, 0)
    g.after(0.049, 100)
    assert g.rate == 0.0  # the window is not over
    g.after(0.05, 150)
    assert g.rate == pytest.approx(250 / 0.05)


class Sleeps(list[float]):
    """The selector's sleep: each one recorded, and a fake clock moved by it (and by
    `overshoot` more, as a real sleep overshoots)."""

    def __init__(self, overshoot: float = 0.0) -> None:
        super().__init__()
        self.now, self.overshoot = 1000.0, overshoot

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
        self.now += seconds + self.overshoot

    def clock(self) -> float:
        return self.now


class Recording(GatheringSelector):
    """Records the timeout each wait was given after its gather."""

    polled: list[float | None]

    def _poll(self, timeout: float | None) -> list[tuple[selectors.SelectorKey, int]]:
        self.polled.append(timeout)
        return super()._poll(timeout)


def test_the_selector_gathers_after_a_busy_wake_up_and_never_past_the_timeout() -> None:
    pairs = [socket.socketpair() for _ in range(GATHER_BATCH)]
    sleeps = Sleeps()
    selector = GatheringSelector(0.002, sleep=sleeps, clock=sleeps.clock)
    selector.gather.window = 1e9  # the rate is what the test sets, however slow the machine
    try:
        a, b = pairs[0]
        selector.register(b, selectors.EVENT_READ)
        a.send(b"x")  # readable until read: every select returns it at once
        selector.gather.rate = 1e6  # as busy as can be: a wake-up with an event gathers
        assert len(selector.select(1.0)) == 1 and sleeps == []  # no busy wake-up before it
        # that one was busy: the next wait first lets a batch gather (the floor at this rate)
        assert len(selector.select(1.0)) == 1 and sleeps == [0.0002]
        selector.select(0.0001)  # the loop's next timer is sooner: the gather ends by it
        assert sleeps == [0.0002, 0.0001]
        selector.select(0)  # the loop has callbacks ready: no sleep at all
        assert sleeps == [0.0002, 0.0001]
        # Each wait asks about the wake-up before it (its readers have run since): at this
        # rate, one event a wake-up is quiet and does not gather
        selector.gather.rate = 10.0
        selector.select(1.0)
        selector.select(1.0)
        assert sleeps == [0.0002, 0.0001]
        for a, b in pairs[1:4]:  # four events in one wake-up gather whatever the rate
            selector.register(b, selectors.EVENT_READ)
            a.send(b"x")
        assert len(selector.select(1.0)) == 4
        selector.select(1.0)
        assert sleeps == [0.0002, 0.0001, min(0.002, GATHER_BATCH / 10.0)]  # the most
        for a, b in pairs[4:]:  # a batch's worth in one wake-up: batching already, no gather
            selector.register(b, selectors.EVENT_READ)
            a.send(b"x")
        selector.gather.rate = 1e6  # however busy
        assert len(selector.select(1.0)) == GATHER_BATCH and len(sleeps) == 4  # (the four's)
        selector.select(1.0)
        assert len(sleeps) == 4
        for _, b in pairs[1:]:  # one ready again, the loop busy: it gathers...
            selector.unregister(b)
        selector.select(1.0)
        selector.select(1.0)
        assert len(sleeps) == 5
        selector.more = True  # ... unless a reader left work behind (`work_left`)
        selector.select(1.0)
        assert len(sleeps) == 5 and not selector.more  # (for that wake-up only)
        selector.select(1.0)
        assert len(sleeps) == 6
    finally:
        selector.close()
        for a, b in pairs:
            a.close()
            b.close()


def test_a_gather_ends_by_the_loops_next_timer_whatever_the_sleep_took() -> None:
    a, b = socket.socketpair()
    sleeps = Sleeps(overshoot=0.0003)
    selector = Recording(0.002, sleep=sleeps, clock=sleeps.clock)
    selector.polled = []
    selector.gather.window = 1e9
    selector.gather.rate = 1e6  # busy: each wake-up with an event gathers 0.2 ms
    try:
        selector.register(b, selectors.EVENT_READ)
        a.send(b"x")
        selector.select(1.0)  # (busy: the next wait gathers)
        selector.select(0.05)  # the timer in 50 ms: the wait gets what the sleep left of it
        assert selector.polled[-1] == pytest.approx(0.05 - 0.0002 - 0.0003)
        selector.select(0.0001)  # sooner than the gather: cut to it; the overshoot: no wait
        assert sleeps[-1] == 0.0001 and selector.polled[-1] == 0.0
        selector.select(None)  # no timer: it sleeps, then waits as long as it takes
        assert selector.polled[-1] is None and len(sleeps) == 3
        selector.select(0)  # callbacks are ready: neither a sleep nor a gather counted
        assert len(sleeps) == 3 and selector.slept == 3 and selector.polled[-1] == 0
    finally:
        selector.close()
        a.close()
        b.close()


def test_a_reader_that_left_work_behind_stops_the_gathering_loops_next_gather() -> None:
    async def main(gathering: bool) -> bool:
        loop = asyncio.get_running_loop()
        assert (loop in _gathering) is gathering
        work_left()  # (on a loop that does not gather: nothing to do)
        return gathering and _gathering[loop].more

    assert run_trio_guest(partial(main, True), gather=0.002)
    assert not run_trio_guest(partial(main, False), gather=0.0)
    assert not _gathering  # the loop is forgotten with its run


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(), "transceiver")
    keys = ("--route-keys", "1=" + "A" * 43 + "=", "--internal-token", "t")
    return parser.parse_args(["transceiver", *keys, "--media", "127.0.0.1:0", *argv])


def test_the_gather_flag_defaults_to_2_ms_and_is_bounded_by_a_frame() -> None:
    assert config_from_args(args()).gather == 0.002
    assert config_from_args(args("--gather-ms", "0")).gather == 0.0
    assert config_from_args(args("--gather-ms", "20")).gather == 0.02
    for bad in ("-1", "21", "nan"):
        with pytest.raises(SystemExit, match="--gather-ms must be 0-20"):
            config_from_args(args("--gather-ms", bad))
