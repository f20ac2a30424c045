"""Token-bucket rate limits, one bucket per key (a client IP, an API key fingerprint, a call);
and `Slots`, a cap on how many things may be in progress at once, in all and per key.

The buckets are `shared.ratelimit`'s; here they read an injected clock (`time.monotonic` by
default, so tests step time by hand). `check(key, cost)` either spends `cost` tokens (1 by
default) and returns 0.0, or returns how many seconds until they are available — the
``Retry-After`` of the 429. A rate of 0 turns the limiter off. When a flood of distinct keys
fills the table, the least recently used bucket makes room for each new key. Keys are what
the caller passes; `ClientLimiter`, the per-IP one, keys a client address by its
`shared.address.source_key` (an IPv6 client by its /64, as the relay counts it).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

import trio

from firsthop.shared.address import source_key
from firsthop.shared.ratelimit import KeyedLimiter


@dataclass(frozen=True)
class RateLimit:
    rate: float  # tokens per second
    burst: float  # bucket size

    @property
    def enabled(self) -> bool:
        return self.rate > 0 and self.burst >= 1


class RateLimiter:
    """A `KeyedLimiter` read with the service's clock (signaling's request paths have none
    of their own); evicting the least recently used key when its table is full."""

    def __init__(
        self,
        limit: RateLimit,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 100_000,
    ) -> None:
        self.limit = limit
        self._clock = clock
        self._limiter = KeyedLimiter(limit.rate, limit.burst, max_keys=max_keys, when_full="evict")

    def __len__(self) -> int:
        return len(self._limiter)

    def check(self, key: str, cost: float = 1.0) -> float:
        """Spend `cost` and return 0.0, or the seconds until it could be spent."""
        if not self.limit.enabled:
            return 0.0
        return self._limiter.retry_after(key, self._clock(), cost)


class ClientLimiter(RateLimiter):
    """The per-client-address budget: an IPv6 client counts by its /64 (one host may send
    from any address of it), a v4-mapped one as its IPv4 address."""

    def check(self, key: str, cost: float = 1.0) -> float:
        return super().check(source_key(key), cost)


CLOSE_GRACE = 1.0  # s a streamed body's source may take to close (`Slots.held_while`)


class Slots:
    """At most `total` holders at once, and at most `per_key` with the same key (a client IP).

    `take(key)` returns None when a slot was taken (give it back with `give_back(key)`), or
    the limit that refused it: "key" (this key holds `per_key` already) or "total". A limit
    of 0 is no limit. Memory: one entry per key that holds a slot now.
    """

    def __init__(self, total: int, per_key: int) -> None:
        self.total = total
        self.per_key = per_key
        self.in_use = 0
        self._held: dict[str, int] = {}

    def take(self, key: str) -> str | None:
        held = self._held.get(key, 0)
        if self.per_key and held >= self.per_key:
            return "key"
        if self.total and self.in_use >= self.total:
            return "total"
        self._held[key] = held + 1
        self.in_use += 1
        return None

    def give_back(self, key: str) -> None:
        held = self._held.pop(key, 0) - 1
        if held > 0:
            self._held[key] = held
        self.in_use -= 1

    def held_while(self, key: str, chunks: AsyncIterator[bytes]) -> AsyncGenerator[bytes, None]:
        """`chunks`, with the slot `key` took given back exactly once: when they end, fail or
        are closed, and also when the iterator is dropped before its first step (a client
        gone between the answer's start and its body: an async generator never started
        runs no `finally`, and the slot had been held for good)."""
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.give_back(key)

        async def body() -> AsyncGenerator[bytes, None]:
            try:
                async for chunk in chunks:
                    yield chunk
            finally:
                release()
                aclose = getattr(chunks, "aclose", None)
                if aclose is not None:  # (closed with it: its own `finally` runs now)
                    with trio.move_on_after(CLOSE_GRACE) as closing:
                        closing.shield = True
                        await aclose()

        held = body()
        weakref.finalize(held, release)
        return held
