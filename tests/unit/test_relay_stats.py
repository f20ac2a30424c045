"""The relay's stats contract (`services/relay/stats.py`): each producer reports exactly its
keys, and every key is exported as one /metrics family."""

from __future__ import annotations

import socket

from firsthop.services.relay.dataplane import DataPlane
from firsthop.services.relay.stats import (
    DATAPLANE_KEYS,
    EXPORTED_KEYS,
    SUPERVISOR_KEYS,
    WORKER_KEYS,
    relay_metrics,
    sum_worker_stats,
)
from firsthop.services.relay.supervisor import RelayHandle
from firsthop.services.relay.worker import WorkerHandle
from tests.unit.test_flow_table import table


def test_each_producer_reports_its_keys_and_every_key_is_exported() -> None:
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(3)]
    try:
        plane = DataPlane(table(), public=socks[0], own=socks[1], peer=socks[2])
        assert set(plane.snapshot) == DATAPLANE_KEYS
        worker = WorkerHandle(0, ("127.0.0.1", 1), ("127.0.0.1", 2), ("127.0.0.1", 3), plane, None)
        assert set(worker.stats()) == DATAPLANE_KEYS | WORKER_KEYS
        totals = RelayHandle([], ("127.0.0.1", 0)).totals()
        assert SUPERVISOR_KEYS <= set(totals)
        plane.close()
    finally:
        for s in socks:
            s.close()
    assert DATAPLANE_KEYS | WORKER_KEYS | SUPERVISOR_KEYS == EXPORTED_KEYS


def test_workers_are_summed_and_labelled_counts_merged() -> None:
    a = {"upstream": 3, "drops": {"bad_token": 2}, "tcp_closed": {}}
    b = {"upstream": 4, "drops": {"bad_token": 1, "rate": 5}}
    totals = sum_worker_stats([a, b])
    assert totals["upstream"] == 7
    assert totals["drops"] == {"bad_token": 3, "rate": 5}
    text = relay_metrics(totals, 2)
    assert 'firsthop_relay_packets_total{direction="upstream"} 7' in text
    assert 'firsthop_relay_drops_total{reason="rate"} 5' in text
