"""When a busy event loop should let its next batch gather: `Gather` (sans-IO, time passed in).

A loop that wakes for every datagram or frame pays a wake-up each time: the epoll wait, the
dispatch, a context switch and caches gone cold while it slept. At a few calls that is the
price of low latency; with many, events come spread out, one or two a wake-up, and the
wake-ups, not the events, become what a core spends. So a wake-up that carried events asks
`after` how long to sleep before the next wait: the events that come meanwhile are handled
together, each waiting at most that much longer.

The rule (the relay's data plane and the transceiver's loop, each with its own figures): the
loop counts what each wake-up handled; over windows of `window` seconds that gives a rate. A
wake-up that handled `min_batch` or more, or any while the rate is `busy_rate` or more, lets
the next batch gather for as long as `batch` events take to come at that rate, between
`floor` and `most` seconds: the busier the loop, the less latency each gather adds. One that
handled nothing, or few at a low rate, sleeps not at all; nor one that left work behind
(`more`: a read filled its whole batch, so there is no point waiting for more).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Gather:
    most: float  # seconds: the longest a gather lasts
    floor: float  # seconds: the shortest
    batch: int  # events a gather waits for, at the last window's rate
    busy_rate: float  # events/s from which any wake-up that carried one gathers
    min_batch: int  # events in one wake-up for it to gather whatever the rate
    window: float = 0.05  # seconds the rate is measured over
    rate: float = field(init=False, default=0.0)  # events/s over the last whole window
    _count: int = field(init=False, default=0)
    _since: float | None = field(init=False, default=None)

    def after(self, now: float, handled: int, more: bool = False, earlier: int = 0) -> float:
        """Seconds to sleep before the next wait, after a wake-up that handled `handled`
        events at `now` (0: wait at once). `earlier`: events of wake-ups since the last call
        that were not asked about (the relay's C loop carries those), counted in the rate."""
        if self._since is None:
            self._since = now
        if handled <= 0 and earlier <= 0:
            return 0.0
        self._count += handled + earlier
        elapsed = now - self._since
        if elapsed >= self.window:
            self.rate = self._count / elapsed
            self._count, self._since = 0, now
        if handled <= 0 or more or (handled < self.min_batch and self.rate < self.busy_rate):
            return 0.0
        return min(self.most, max(self.floor, self.batch / max(self.rate, 1.0)))
