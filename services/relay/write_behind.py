"""What the relay's flow cache should learn next: a sans-IO write-behind queue.

The data plane reports flows to store (new ones at once, live ones every `store_refresh`);
the worker writes them to Redis in batches off the packet path. This class is the policy:

* the latest entry per client wins (a flow re-pointed since is written once, as it is now);
* at most `max_pending` clients wait: beyond that, new clients are dropped (counted), while
  clients already waiting are still updated — a flood cannot grow memory;
* `take()` hands the caller everything pending; if the write fails, `failed(batch, now)`
  puts back what was not rewritten meanwhile and says not to try before `retry` seconds.

Time is passed in; nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

from firsthop.shared.address import Address

Entry = tuple[Address, bytes, Address | None]  # client, route token, first-hop relay

MAX_PENDING = 100_000
RETRY = 0.2  # seconds after a failed write (the cache's own backoff may refuse sooner)


class WriteBehind:
    def __init__(self, max_pending: int = MAX_PENDING, retry: float = RETRY) -> None:
        self.max_pending = max_pending
        self.retry = retry
        self.dropped = 0
        self._pending: dict[Address, Entry] = {}
        self._not_before = float("-inf")

    def add(self, entries: Iterable[Entry]) -> None:
        pending = self._pending
        for entry in entries:
            if len(pending) < self.max_pending or entry[0] in pending:
                pending[entry[0]] = entry
            else:
                self.dropped += 1

    def due(self, now: float) -> bool:
        """Whether there is something to write and it may be tried now."""
        return bool(self._pending) and now >= self._not_before

    def next_attempt(self) -> float | None:
        """When to try again (None: nothing waits)."""
        return self._not_before if self._pending else None

    def take(self) -> list[Entry]:
        batch = list(self._pending.values())
        self._pending.clear()
        return batch

    def failed(self, batch: list[Entry], now: float) -> None:
        for entry in batch:  # unless the flow was reported again meanwhile
            self._pending.setdefault(entry[0], entry)
        self._not_before = now + self.retry

    def __len__(self) -> int:
        return len(self._pending)
