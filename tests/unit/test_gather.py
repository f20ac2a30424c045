"""A busy loop's gather: the rule (`shared/gather.py`), the transceiver's loop that follows it
(`rtc/bridge.py`), and its flag."""

from __future__ import annotations

import argparse
import asyncio
import math
import socket
import time
from collections.abc import Callable
from functools import partial
from typing import cast

import pytest
import trio

from firsthop.services.transceiver.main import config_from_args, register
from firsthop.services.transceiver.rtc.bridge import (
    GATHER_BATCH,
    LoopGather,
    _gathering,
    call_asyncio,
    run_trio_guest,
    watch_readable,
    work_left,
)
from firsthop.services.transceiver.rtc.media_clock import clock_of
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
    """The gather's sleep: each one recorded, and a fake clock moved by it."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 1000.0

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


class Soon(list[Callable[[], None]]):
    """A loop's `call_soon`, recorded (the gather asks it for the end of each wake-up)."""

    def call_soon(self, callback: Callable[[], None]) -> None:
        self.append(callback)

    def time(self) -> float:
        return 0.0


def wake_up(gathering: LoopGather, soon: Soon, events: int, *, asked: bool = True) -> None:
    """A wake-up whose readers ran `events` times, then the loop's pass of its callbacks."""
    for _ in range(events):
        gathering.event()
    assert len(soon) == (1 if events and asked else 0)  # its end is asked for once, if busy
    for callback in soon:
        callback()
    soon.clear()


def test_the_loop_gathers_after_a_busy_wake_up_and_never_past_the_media_clocks_tick() -> None:
    sleeps, soon = Sleeps(), Soon()
    tick = [math.inf]  # the media clock's next tick: none
    gathering = LoopGather(
        cast(asyncio.AbstractEventLoop, soon),
        0.002,
        sleep=sleeps,
        clock=sleeps.clock,
        next_deadline=lambda: tick[0],
    )
    gathering.gather.window = 1e9  # the rate is what the test sets, however slow the machine
    gathering.gather.rate = 1e6  # as busy as can be: a wake-up with an event gathers
    wake_up(gathering, soon, 1)
    assert sleeps == [0.0002]  # the floor at this rate
    tick[0] = sleeps.now + 0.0001  # the clock's tick is sooner: the gather ends by it
    wake_up(gathering, soon, 1)
    assert sleeps == pytest.approx([0.0002, 0.0001])
    tick[0] = sleeps.now  # the tick is due: no sleep at all
    wake_up(gathering, soon, 1)
    assert sleeps == pytest.approx([0.0002, 0.0001]) and gathering.slept == 2
    tick[0] = math.inf
    gathering.gather.rate = 10.0  # quiet: no wake-up is asked about, however many it had
    wake_up(gathering, soon, 1, asked=False)
    wake_up(gathering, soon, 4, asked=False)
    assert len(sleeps) == 2
    gathering.gather.rate = 1e6  # however busy, a batch's worth in one wake-up is batching
    wake_up(gathering, soon, GATHER_BATCH)  # already: no gather
    assert len(sleeps) == 2
    wake_up(gathering, soon, 0)  # (a wake-up for nothing counted: no end asked)
    gathering.work_left()  # a reader left work behind: no gather...
    assert len(soon) == 1  # (its wake-up asked about)
    gathering.event()
    soon.pop()()
    assert len(sleeps) == 2 and not gathering.more and gathering.left == 1
    wake_up(gathering, soon, 1)  # ... for that wake-up only
    assert len(sleeps) == 3 and gathering.slept == 3
    gathering.gather.rate = 10.0
    gathering.work_left()  # quiet, it is asked about all the same (for `left`)
    assert len(soon) == 1
    soon.pop()()
    assert gathering.left == 2 and len(sleeps) == 3


def test_a_quiet_loops_events_count_in_its_rate_a_window_at_a_time() -> None:
    sleeps, soon = Sleeps(), Soon()
    gathering = LoopGather(cast(asyncio.AbstractEventLoop, soon), 0.002, clock=sleeps.clock)
    events = 0
    while not gathering.gather.rate:  # 2,000 events a second, one a wake-up, from quiet
        sleeps.now += 0.0005
        gathering.event()
        events += 1
    assert not soon  # (none asked about while it was quiet)
    assert events <= 101 and gathering.gather.rate == pytest.approx(2000, rel=0.05)
    gathering.event()  # busy now: the next wake-up is asked about
    assert len(soon) == 1


def test_a_real_loop_counts_its_readers_and_gathers_by_the_media_clock() -> None:
    """On the transceiver's own loop (uvloop, Trio its guest): each ready socket watched is
    one event of its wake-up; a wake-up with enough of them gathers before the next wait,
    bounded by the media clock's next tick."""

    class Owner:
        timer_at: float | None = None

        def on_timer(self, now: float) -> None:
            pass

    async def main() -> tuple[list[float], int, bool]:
        loop = asyncio.get_running_loop()
        gathering = _gathering[loop]
        gathering.gather.window = 1e9
        gathering.gather.rate = 1e6  # busy: each wake-up is asked about
        sleeps: list[float] = []
        gathering._sleep = sleeps.append  # (recorded, not slept)
        pairs = [socket.socketpair() for _ in range(4)]
        read = trio.Event()
        token = trio.lowlevel.current_trio_token()
        got: list[bytes] = []

        def reader(sock: socket.socket) -> Callable[[], None]:
            def readable() -> None:
                got.append(sock.recv(10))
                if len(got) == 4:
                    token.run_sync_soon(read.set)

            return readable

        stops = [watch_readable(b, reader(b)) for _, b in pairs]
        owner = Owner()
        tick = time.monotonic() + 0.05
        clock_of(loop).arm(owner, tick)
        bounded = gathering._next_deadline() == tick  # what a gather may not go past
        for a, _ in pairs:
            a.send(b"x")
        with trio.fail_after(5):
            await read.wait()
        clock_of(loop).arm(owner, None)
        for stop in stops:
            stop()
        for a, b in pairs:
            a.close()
            b.close()
        return sleeps, gathering.slept, bounded

    sleeps, slept, bounded = run_trio_guest(main, gather=0.002)
    assert slept == len(sleeps) >= 1  # the four's wake-up gathered
    assert 0 < sleeps[0] <= 0.002 and bounded  # the most, and never past the clock's tick


def test_a_gathers_sleep_does_not_make_the_media_clocks_tick_late() -> None:
    """libuv reckons its next wait from the clock it read before `call_soon` callbacks ran:
    a gather's sleep there must not push the media clock's tick back by as long (it did,
    found by a helper's read). Here a 30 ms gather, 5 ms into a 40 ms wait for a tick, with
    nothing else to wake the loop meanwhile."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        gathering = _gathering[loop] = LoopGather(loop, 0.03)
        gathering.gather.window, gathering.gather.rate = 1e9, 1e6  # busy
        gathering.gather.floor = 0.03  # (a long gather, so a late tick shows plainly)
        fired: asyncio.Future[float] = loop.create_future()

        class Owner:
            timer_at: float | None = None

            def on_timer(self, now: float) -> None:
                fired.set_result(time.monotonic())

        a, b = socket.socketpair()

        def readable() -> None:
            b.recv(10)

        stop = watch_readable(b, readable)
        due = time.monotonic() + 0.04
        clock_of(loop).arm(Owner(), due)
        await trio.sleep(0.005)
        a.send(b"x")  # a wake-up that gathers for 30 ms, 5 ms into the wait

        async def tick() -> float:
            return await fired

        with trio.fail_after(5):
            at = await call_asyncio(tick())
        stop()
        a.close()
        b.close()
        return at - due

    late = run_trio_guest(main, gather=0.002)
    assert late < 0.015  # 30 ms late without the fix


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
