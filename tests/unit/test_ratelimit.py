"""The one token bucket, with the time passed in."""

from __future__ import annotations

import math

import pytest

from firsthop.shared.ratelimit import KeyedLimiter, TokenBucket


def test_a_bucket_spends_refills_and_says_how_long_to_wait() -> None:
    bucket = TokenBucket(rate=2.0, burst=3.0, now=0.0)
    assert [bucket.take(0.0) for _ in range(4)] == [True, True, True, False]
    assert bucket.wait(0.0) == pytest.approx(0.5)
    assert bucket.take(0.5) and not bucket.take(0.5)
    assert bucket.wait(10.0, cost=4) == math.inf  # more than it ever holds
    assert bucket.full_at(10.0)


def test_keys_have_their_own_buckets() -> None:
    limiter = KeyedLimiter(1.0, 2.0)
    assert limiter.take("a", 0.0) and limiter.take("a", 0.0) and not limiter.take("a", 0.0)
    assert limiter.take("b", 0.0)
    assert limiter.retry_after("a", 0.0) == pytest.approx(1.0)


def test_a_full_table_refuses_new_keys_or_forgets_them_all() -> None:
    refusing = KeyedLimiter(1.0, 1.0, max_keys=2, when_full="refuse")
    forgetting = KeyedLimiter(1.0, 1.0, max_keys=2, when_full="forget")
    for limiter in (refusing, forgetting):
        assert limiter.take("a", 0.0) and limiter.take("b", 0.0)
    assert not refusing.take("c", 0.1) and len(refusing) == 2
    assert forgetting.take("c", 0.1) and len(forgetting) == 1
    # refilled buckets are pruned first (at most once a second)
    assert refusing.take("c", 1.5) and len(refusing) == 1


def test_pruning_a_full_table_is_not_done_per_key() -> None:
    limiter = KeyedLimiter(1.0, 1.0, max_keys=1000, when_full="refuse")
    for i in range(1000):
        limiter.take(i, 0.0)
    assert not limiter.take("new", 0.5)  # pruned once: nothing had refilled
    limiter._buckets[0]._tokens = 1.0  # as if refilled
    assert not limiter.take("new2", 0.6)  # not scanned again within the second
    assert limiter.take("new3", 1.6)  # a second later: scanned, the refilled one dropped
