"""Placement: region steering (header, CIDR table, own region) and transceiver ranking."""

from __future__ import annotations

import random

import pytest

from firsthop.services.signaling.placement import RegionTable, choose_region, ingress_for, rank
from firsthop.shared.redis_store import TransceiverInfo


def tx(
    tx_id: str, region: str = "a", sessions: int = 0, capacity: int = 100, draining: bool = False
) -> TransceiverInfo:
    return TransceiverInfo(
        id=tx_id,
        api_url=f"http://{tx_id}",
        region=region,
        sessions=sessions,
        capacity=capacity,
        draining=draining,
    )


def ids(infos: list[TransceiverInfo]) -> list[str]:
    return [t.id for t in infos]


def test_least_loaded_first_by_ratio_not_count() -> None:
    fleet = [tx("busy", sessions=50, capacity=100), tx("big", sessions=60, capacity=1000)]
    fleet.append(tx("idle", sessions=0, capacity=10))
    assert ids(rank(fleet, "a", "a")) == ["idle", "big", "busy"]


def test_a_call_to_record_goes_to_a_transceiver_that_records_or_may() -> None:
    fleet = [
        TransceiverInfo(id="no", api_url="http://no", region="a", capacity=10, records=False),
        TransceiverInfo(id="yes", api_url="http://yes", region="a", capacity=10, records=True),
        TransceiverInfo(id="unknown", api_url="http://u", region="a", capacity=10),
        TransceiverInfo(id="b", api_url="http://b", region="b", capacity=10, records=False),
    ]
    assert ids(rank(fleet, "b", "a", record="webrtc")) == ["yes", "unknown"]  # known ones first
    assert ids(rank(fleet, "a", "a")) == ["no", "unknown", "yes"]  # the rest go anywhere


def test_a_phone_call_to_record_skips_a_recorder_of_a_release_that_records_webrtc_only() -> None:
    """A rolling upgrade rolls signaling first: a transceiver that records but says nothing of
    phone calls would refuse one (its release took `record` for WebRTC calls only)."""
    fields = {"api_url": "http://old", "region": "a", "capacity": "10", "records": "1"}
    old = TransceiverInfo.from_hash("old", fields)
    assert old is not None and old.can_record("webrtc") and old.can_record("rtp") is False
    new = TransceiverInfo("new", "http://new", "a", capacity=10, records=True, records_rtp=True)
    unknown = TransceiverInfo(id="unknown", api_url="http://u", region="a", capacity=10)
    fleet = [old, new, unknown]
    assert ids(rank(fleet, "a", "a", record="rtp")) == ["new", "unknown"]
    assert ids(rank(fleet, "a", "a", record="webrtc")) == ["new", "old", "unknown"]


def test_draining_and_full_are_skipped() -> None:
    fleet = [
        tx("draining", draining=True),
        tx("full", sessions=100, capacity=100),
        tx("ok", sessions=99, capacity=100),
    ]
    assert ids(rank(fleet, "a", "a")) == ["ok"]


def test_region_first_then_own_region_as_fallback() -> None:
    fleet = [tx("a1", "a", sessions=1), tx("b1", "b", sessions=90), tx("b2", "b", sessions=10)]
    assert ids(rank(fleet, "b", "a")) == ["b2", "b1", "a1"]


def test_region_with_none_falls_back_to_own() -> None:
    fleet = [tx("a1", "a"), tx("b1", "b", draining=True)]
    assert ids(rank(fleet, "b", "a")) == ["a1"]
    assert ids(rank(fleet, "nowhere", "a")) == ["a1"]


def test_none_left() -> None:
    assert rank([], "a", "a") == []
    assert rank([tx("d", draining=True), tx("c", "c")], "a", "a") == []


def test_ties_are_broken_by_the_tiebreak() -> None:
    fleet = [tx(f"t{i}") for i in range(8)]
    rng = random.Random(7)
    firsts = {rank(fleet, "a", "a", tiebreak=lambda _: rng.random())[0].id for _ in range(50)}
    assert len(firsts) > 3  # equal loads spread out
    assert ids(rank(fleet, "a", "a")) == sorted(ids(fleet))  # no tiebreak: stable by id


def test_unknown_capacity_is_never_full() -> None:
    static = TransceiverInfo(id="s", api_url="http://s", region="a", sessions=10**6)
    assert ids(rank([static], "a", "a")) == ["s"]


def test_region_from_header_then_cidr_then_own() -> None:
    table = RegionTable([("203.0.113.0/24", "eu"), ("203.0.113.128/25", "eu-west")])
    assert choose_region("us", "203.0.113.5", table, "a") == ("us", "header")
    assert choose_region(None, "203.0.113.5", table, "a") == ("eu", "cidr")
    assert choose_region(None, "203.0.113.200", table, "a") == ("eu-west", "cidr")  # longest
    assert choose_region(None, "198.51.100.1", table, "a") == ("a", "own")
    assert choose_region(None, None, table, "a") == ("a", "own")


@pytest.mark.parametrize("bad", ["", " ", "a b", "x" * 80, "../etc", "eu\r\nX: y", "é"])
def test_malformed_region_header_is_ignored(bad: str) -> None:
    table = RegionTable([("10.0.0.0/8", "lan")])
    assert choose_region(bad, "10.1.2.3", table, "a") == ("lan", "cidr")


def test_cidr_table_ipv6_and_v4_mapped() -> None:
    table = RegionTable([("2001:db8::/32", "v6"), ("192.0.2.0/24", "v4")])
    assert table.lookup("2001:db8::1") == "v6"
    assert table.lookup("::ffff:192.0.2.9") == "v4"
    assert table.lookup("not-an-ip") is None
    with pytest.raises(ValueError):
        RegionTable([("10.0.0.0/8", "bad region")])


def test_ingress_is_the_client_regions_then_the_transceivers() -> None:
    ingress = {"a": ["10.0.0.1:3478"], "b": ["10.0.0.2:3478", "10.0.0.3:3478"]}
    assert ingress_for(ingress, "b", "a") == ["10.0.0.2:3478", "10.0.0.3:3478"]
    assert ingress_for(ingress, "edge-only", "a") == ["10.0.0.1:3478"]
    assert ingress_for({}, "a", "a") == []
