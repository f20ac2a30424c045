"""Request bodies, read under a deadline and a cap on how many are in progress (docs/security.md).

Why: a request holds its connection, a task and a Quart request for as long as its body takes
to arrive, and Quart waits up to 60 s for each read: 1000 authenticated POSTs sending a byte
every 2 s were all held for a minute, from one client.

Strategy: a request's body must be complete within `--body-timeout` of its arrival (5 s; an
SDP offer is at most 64 KiB) — past it, 408 and the connection closes. Reading a body (for the
route, or the drain after an early answer) takes an upload slot first: `--max-uploads` in all
(beyond: 503) and `--max-uploads-per-ip` per client address (beyond: 429); a request refused a
slot is answered at once and its connection closes, nothing of its body is read. A body that
is already there (the usual case: it came with the headers) holds its slot for no time.
"""

from __future__ import annotations

from collections import Counter

import trio
from quart import Request
from werkzeug.exceptions import HTTPException

from firsthop.services.signaling.errors import Problem
from firsthop.services.signaling.ratelimit import Slots
from firsthop.shared.metrics import MetricFamily

SLOT_RETRY_AFTER = 1.0


DRAINS, DRAINS_PER_IP = 64, 4  # bodies an early answer skipped, read to keep the connection


class Bodies:
    """Request bodies, read within `timeout`, each holding an upload slot (`slots`) while it
    comes. What is left of a body an early answer skipped (401, 404, 429, ...) is drained in
    slots of its own (`drains`): a request with no credential never holds one of the uploads'
    (16 addresses of slow unauthenticated POSTs had held all 256, and every key's uploads
    were refused); past them the connection just closes."""

    def __init__(
        self,
        slots: Slots,
        timeout: float,
        counters: Counter[str],
        drains: Slots | None = None,
    ) -> None:
        self.slots = slots
        self.drains = drains or Slots(DRAINS, DRAINS_PER_IP)
        self.timeout = timeout
        self._counters = counters

    def deadline(self) -> float:
        """When a body arriving now must be complete (trio time)."""
        return trio.current_time() + self.timeout

    async def read(self, request: Request, ip: str, deadline: float) -> bytes:
        """The whole body, or Problem 408 / 429 / 503 (and HTTPException 413 past the size)."""
        self._take(ip)
        try:
            with trio.move_on_at(deadline) as scope:
                data = await request.get_data()
        finally:
            self.slots.give_back(ip)
        if scope.cancelled_caught:
            self._counters["body_timeouts"] += 1
            raise Problem(408, f"request body not complete within {self.timeout:g} s")
        return data if isinstance(data, bytes) else data.encode()

    async def drain(self, request: Request, ip: str, deadline: float) -> bool:
        """Read and drop what is left of a body an early answer skipped; False when it could
        not be (no slot, too big, too slow): the connection must close."""
        if self.drains.take(ip) is not None:
            return False
        try:
            with trio.move_on_at(deadline) as scope:
                await request.get_data()
        except HTTPException:  # 413 while reading
            return False
        finally:
            self.drains.give_back(ip)
        return not scope.cancelled_caught

    def _take(self, ip: str) -> None:
        take_slot(
            self.slots,
            ip,
            self._counters,
            ("uploads_refused_ip", "uploads_refused_total"),
            (
                "too many requests from this address are still sending their body "
                f"(at most {self.slots.per_key})",
                "too many requests are still sending their body; try again",
            ),
            SLOT_RETRY_AFTER,
        )

    def metric(self) -> MetricFamily:
        gauge = MetricFamily(
            "firsthop_signaling_uploads", "gauge", "Requests still sending their body"
        )
        return gauge.add(self.slots.in_use)


def take_slot(
    slots: Slots,
    key: str,
    counters: Counter[str],
    events: tuple[str, str],
    reasons: tuple[str, str],
    retry_after: float,
) -> None:
    """A slot of `slots` for `key`, or Problem: 429 when the key holds its most, 503 when
    all are held (counted as `events`' first or second, answered with `reasons`')."""
    refused = slots.take(key)
    if refused is not None:
        which = 0 if refused == "key" else 1
        counters[events[which]] += 1
        raise Problem((429, 503)[which], reasons[which], retry_after=retry_after)
