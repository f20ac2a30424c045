"""The relay's write-behind queue for its flow cache: latest wins, bounded, retried later."""

from __future__ import annotations

from firsthop.services.relay.write_behind import WriteBehind

A, B, C = ("203.0.113.1", 1), ("203.0.113.2", 2), ("203.0.113.3", 3)


def test_the_latest_entry_per_client_is_written_once() -> None:
    q = WriteBehind()
    q.add([(A, b"t1", None), (B, b"t2", None), (A, b"t3", None)])
    assert q.due(0.0) and len(q) == 2
    assert sorted(q.take()) == [(A, b"t3", None), (B, b"t2", None)]
    assert not q.due(0.0) and q.next_attempt() is None


def test_a_failed_write_is_kept_unless_rewritten_and_retried_later() -> None:
    q = WriteBehind(retry=0.2)
    q.add([(A, b"old", None), (B, b"b", None)])
    batch = q.take()
    q.add([(A, b"new", None)])  # the flow changed while the write was in flight
    q.failed(batch, now=10.0)
    assert sorted(q.take()) == [(A, b"new", None), (B, b"b", None)]
    q.failed([(C, b"c", None)], now=10.0)
    assert not q.due(10.1) and q.next_attempt() == 10.2 and q.due(10.2)


def test_the_queue_is_bounded_but_waiting_clients_still_update() -> None:
    q = WriteBehind(max_pending=2)
    q.add([(A, b"a", None), (B, b"b", None), (C, b"c", None)])
    assert len(q) == 2 and q.dropped == 1
    q.add([(A, b"a2", None)])
    assert (A, b"a2", None) in q.take()
