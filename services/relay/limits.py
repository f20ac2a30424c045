"""Rate limits for the relay's slow paths (new flows, Redis lookups). Pure: time passed in."""

from __future__ import annotations

from collections.abc import Hashable


class TokenBucket:
    """`rate` tokens per second, at most `burst` banked."""

    __slots__ = ("rate", "burst", "_tokens", "_at")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = now

    def take(self, now: float, cost: float = 1.0) -> bool:
        elapsed = now - self._at
        if elapsed > 0:
            self._tokens = min(self.burst, self._tokens + elapsed * self.rate)
            self._at = now
        if self._tokens >= cost:
            self._tokens -= cost
            return True
        return False

    def full_at(self, now: float) -> bool:
        return self._tokens + (now - self._at) * self.rate >= self.burst


class KeyedLimiter:
    """One token bucket per key (a source IP), bounded in size.

    Buckets that have refilled are pruned by `prune`; when the table is full, unknown keys
    are refused outright (a flood of spoofed sources cannot grow memory without bound).
    """

    __slots__ = ("rate", "burst", "max_keys", "_buckets")

    def __init__(self, rate: float, burst: float, max_keys: int = 100_000) -> None:
        self.rate = rate
        self.burst = burst
        self.max_keys = max_keys
        self._buckets: dict[Hashable, TokenBucket] = {}

    def take(self, key: Hashable, now: float) -> bool:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                return False
            bucket = self._buckets[key] = TokenBucket(self.rate, self.burst, now)
        return bucket.take(now)

    def prune(self, now: float) -> None:
        full = [k for k, b in self._buckets.items() if b.full_at(now)]
        for key in full:
            del self._buckets[key]

    def __len__(self) -> int:
        return len(self._buckets)
