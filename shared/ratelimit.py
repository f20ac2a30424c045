"""Token buckets, the project's one implementation; pure: the time is passed in.

* `TokenBucket`: `rate` tokens per second, at most `burst` banked. `take(now, cost)` spends
  and says whether it could; `wait(now, cost)` says how long until it could (0: now).
* `KeyedLimiter`: one bucket per key (a source IP, an API key, a call), with a bounded table.
  A bucket that has refilled completely is the same as no bucket, so when the table reaches
  `max_keys` those are dropped first. If that is not enough, `when_full` decides: "refuse"
  unknown keys (the relay: a flood of spoofed sources must not grow memory, and per-token
  caps protect calls anyway), or "evict" the least recently used bucket (signaling: a new
  client is served, and a flood of new addresses takes the budgets of the quietest keys one
  at a time, never everyone's at once — forgetting the whole table handed every client,
  the flooder too, a full budget). `retry_after(key, now, cost)` spends `cost` and returns
  0.0, or returns how many seconds until it could — the ``Retry-After`` of a 429.

A slowly refilling bucket is a cap: 100 tokens refilled over 4 hours is "at most 100" for
anything that lasts less.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Literal

PRUNE_INTERVAL = 1.0  # a full table is scanned for refilled buckets at most this often (s)


class TokenBucket:
    __slots__ = ("rate", "burst", "_tokens", "_at")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = now

    def _refill(self, now: float) -> None:
        elapsed = now - self._at
        if elapsed > 0:
            self._tokens = min(self.burst, self._tokens + elapsed * self.rate)
            self._at = now

    def take(self, now: float, cost: float = 1.0) -> bool:
        """Spend `cost` tokens if there are enough. (`wait`'s answer of 0.0, in one call:
        the media path takes two or three a packet.)"""
        elapsed = now - self._at
        if elapsed > 0:
            tokens = self._tokens + elapsed * self.rate
            self._tokens = tokens if tokens < self.burst else self.burst
            self._at = now
        if self._tokens >= cost:
            self._tokens -= cost
            return True
        return False

    def wait(self, now: float, cost: float = 1.0) -> float:
        """Spend `cost` tokens and return 0.0; or, without spending, the seconds until
        there will be enough (infinite if `cost` is more than the bucket holds)."""
        self._refill(now)
        if self._tokens >= cost:
            self._tokens -= cost
            return 0.0
        if cost > self.burst or self.rate <= 0:
            return math.inf
        return (cost - self._tokens) / self.rate

    def full_at(self, now: float) -> bool:
        return self._tokens + (now - self._at) * self.rate >= self.burst


class KeyedLimiter:
    __slots__ = ("rate", "burst", "max_keys", "when_full", "_buckets", "_pruned_at")

    def __init__(
        self,
        rate: float,
        burst: float,
        *,
        max_keys: int = 100_000,
        when_full: Literal["refuse", "evict"] = "refuse",
    ) -> None:
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self.when_full = when_full
        self._buckets: dict[Hashable, TokenBucket] = {}
        self._pruned_at = -math.inf

    def take(self, key: Hashable, now: float, cost: float = 1.0) -> bool:
        return self.retry_after(key, now, cost) == 0.0

    def retry_after(self, key: Hashable, now: float, cost: float = 1.0) -> float:
        buckets = self._buckets
        bucket = buckets.get(key)
        if bucket is None:
            if len(buckets) >= self.max_keys:
                if now - self._pruned_at >= PRUNE_INTERVAL:  # a scan, not one per packet
                    self.prune(now)
                if len(buckets) >= self.max_keys:
                    if self.when_full == "refuse":
                        return self.burst / self.rate if self.rate > 0 else math.inf
                    del buckets[next(iter(buckets))]  # the least recently used
            bucket = buckets[key] = TokenBucket(self.rate, self.burst, now)
        elif self.when_full == "evict":  # kept in the order of use: the oldest goes first
            del buckets[key]
            buckets[key] = bucket
        return bucket.wait(now, cost)

    def prune(self, now: float) -> None:
        """Forget the buckets that have refilled (they are the same as none)."""
        self._pruned_at = now
        full = [k for k, b in self._buckets.items() if b.full_at(now)]
        for key in full:
            del self._buckets[key]

    def __len__(self) -> int:
        return len(self._buckets)
