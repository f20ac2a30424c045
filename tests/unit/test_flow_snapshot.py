"""The standby's copy of the flow cache: asked only when Redis cannot be, aged like Redis."""

from __future__ import annotations

from firsthop.services.relay.flow_cache import FlowSnapshot
from firsthop.shared.redis_store import FLOW_TTL

CLIENT = ("203.0.113.5", 4000)


def test_a_copy_answers_what_it_holds_and_counts_its_hits() -> None:
    snap = FlowSnapshot()
    assert snap.get(CLIENT, 0.0) is None  # never taken
    snap.replace({CLIENT: b"token"}, now=100.0)
    assert len(snap) == 1
    assert snap.get(CLIENT, 101.0) == b"token"
    assert snap.get(("203.0.113.5", 4001), 101.0) is None
    assert snap.hits == 1


def test_a_copy_is_forgotten_when_redis_would_have_forgotten_its_entries() -> None:
    snap = FlowSnapshot()
    snap.replace({CLIENT: b"token"}, now=100.0)
    assert snap.get(CLIENT, 100.0 + FLOW_TTL) == b"token"
    assert snap.get(CLIENT, 100.0 + FLOW_TTL + 0.1) is None
    assert len(snap) == 0  # and its memory with it
