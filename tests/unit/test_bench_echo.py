"""`firsthop bench echo`'s own arithmetic: the tap's bursts matched in and out, and each
caller onset matched to the tap's burst nearest it."""

from __future__ import annotations

from firsthop.services.bench.echo import BIG, burst_of, residence, residences

MS = 1_000_000  # ns


def test_each_burst_in_is_matched_with_the_first_burst_out_after_it() -> None:
    small, big = BIG - 80, BIG + 180
    records = []
    for start in (1000 * MS, 1600 * MS):
        records += [(start - 20 * MS, "up", "c:1", small), (start, "up", "c:1", big)]
        records += [(start - 15 * MS, "down", "c:1", small), (start + 7 * MS, "down", "c:1", big)]
    records.sort()
    found = residence(records, period_s=0.6)
    assert found["matched"] == [(1000 * MS, 7.0), (1600 * MS, 7.0)]
    assert found["packet_bytes_median"]["up_big"] == big


def test_an_onset_takes_the_nearest_burst_within_half_a_period_either_side() -> None:
    matched = [(1000 * MS, 1.5), (1600 * MS, 9.0)]
    assert burst_of(matched, 999 * MS, 0.6) == 1.5  # the tap's clock 1 ms behind the caller's
    assert burst_of(matched, 1001 * MS, 0.6) == 1.5
    assert burst_of(matched, 1590 * MS, 0.6) == 9.0
    assert burst_of(matched, 2000 * MS, 0.6) is None  # 400 ms from the nearest: not it
    assert burst_of([], 1000 * MS, 0.6) is None


def test_as_many_bursts_as_onsets_are_matched_in_order_whatever_the_clocks_say() -> None:
    """The tap stamps in CLOCK_REALTIME: a time step mid-call moved every onset past half a
    period from its burst, and a row had no residence at all (seen in one CI run)."""
    matched = [(1600 * MS, 9.0), (1000 * MS, 1.5)]
    stepped = [at + 3_000 * MS for at in (1000 * MS, 1600 * MS)]  # the wall clock 3 s ahead
    assert residences(matched, stepped, 0.6) == [1.5, 9.0]
    assert residences(matched[:1], stepped, 0.6) == [None, None]  # fewer: by time, as before
    assert residences(matched[1:], [1001 * MS, 1601 * MS], 0.6) == [1.5, None]
