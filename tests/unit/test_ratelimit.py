"""The one token bucket, with the time passed in."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


def test_a_full_table_refuses_new_keys_or_evicts_the_least_recently_used() -> None:
    refusing = KeyedLimiter(1.0, 1.0, max_keys=2, when_full="refuse")
    evicting = KeyedLimiter(1.0, 1.0, max_keys=2, when_full="evict")
    for limiter in (refusing, evicting):
        assert limiter.take("a", 0.0) and limiter.take("b", 0.0)
    assert not refusing.take("c", 0.1) and len(refusing) == 2
    assert not evicting.take("a", 0.1)  # "a" used again: "b" is now the oldest
    assert evicting.take("c", 0.1) and len(evicting) == 2
    assert not evicting.take("a", 0.2)  # "a" kept its spent bucket: "b" made room
    assert evicting.take("b", 0.2)  # (a fresh bucket: it was evicted)
    # refilled buckets are pruned first (at most once a second)
    assert refusing.take("c", 1.5) and len(refusing) == 1


def test_a_flood_of_new_keys_never_resets_an_active_keys_budget() -> None:
    """It used to clear the whole table when full: 100,000 new addresses gave the limited
    client (the flooder itself, as often as not) a full bucket again."""
    limiter = KeyedLimiter(1.0, 3.0, max_keys=1000, when_full="evict")
    while limiter.take("limited", 0.0):
        pass
    now = 0.0
    for i in range(20_000):
        now += 1e-5  # 0.2 s in all: the limited key refills by a fifth of a token
        limiter.take(("flood", i), now)
        if i % 100 == 0:
            assert not limiter.take("limited", now)  # still asking, still limited
    assert len(limiter) == 1000


def test_pruning_a_full_table_is_not_done_per_key() -> None:
    limiter = KeyedLimiter(1.0, 1.0, max_keys=1000, when_full="refuse")
    for i in range(1000):
        limiter.take(i, 0.0)
    assert not limiter.take("new", 0.5)  # pruned once: nothing had refilled
    limiter._buckets[0]._tokens = 1.0  # as if refilled
    assert not limiter.take("new2", 0.6)  # not scanned again within the second
    assert limiter.take("new3", 1.6)  # a second later: scanned, the refilled one dropped


@given(
    st.lists(
        st.tuples(
            st.floats(min_value=-0.01, max_value=2.0, allow_nan=False),  # time moved (or not)
            st.sampled_from([0.5, 1.0, 3.0, 20.0]),  # cost (20: more than the bucket holds)
        ),
        max_size=200,
    )
)
def test_take_answers_as_wait_does_in_one_call(steps: list[tuple[float, float]]) -> None:
    """`take` is `wait(...) == 0.0` written out (the media path's two or three a packet):
    the same answers and the same tokens left, step after step, time going back included."""
    inline, by_wait = TokenBucket(250.0, 10.0, 0.0), TokenBucket(250.0, 10.0, 0.0)
    now = 0.0
    for moved, cost in steps:
        now += moved
        assert inline.take(now, cost) == (by_wait.wait(now, cost) == 0.0)
        assert inline.full_at(now) == by_wait.full_at(now)
        assert inline._tokens == by_wait._tokens and inline._at == by_wait._at
