"""The signaling limiters, pure: token buckets with a hand-stepped clock, and Slots."""

from __future__ import annotations

from services.signaling.ratelimit import RateLimit, RateLimiter, Slots


def test_slots_cap_in_all_and_per_key() -> None:
    slots = Slots(total=3, per_key=2)
    assert [slots.take("a"), slots.take("a"), slots.take("a")] == [None, None, "key"]
    assert slots.take("b") is None
    assert slots.take("c") == "total" and slots.in_use == 3
    slots.give_back("a")
    assert slots.take("c") is None  # a freed slot serves anyone
    assert slots.take("a") == "total"
    for key in ("a", "b", "c"):
        slots.give_back(key)
    assert slots.in_use == 0 and slots.take("a") is None


def test_slots_of_zero_are_no_limit() -> None:
    slots = Slots(total=0, per_key=0)
    assert all(slots.take("a") is None for _ in range(1000))


def test_a_check_can_cost_several_tokens() -> None:
    now = [0.0]
    limiter = RateLimiter(RateLimit(1.0, 10), clock=lambda: now[0])
    assert limiter.check("a", 7) == 0.0
    assert limiter.check("a", 4) == 1.0  # 3 left: one more second for the 4th
    now[0] += 1.0
    assert limiter.check("a", 4) == 0.0
