"""The relay's statistics: every key its workers and supervisor report, how the workers'
are summed, and the /metrics family each one is exported as (docs/architecture.md §10).

This module owns the contract; the producers fill it: a worker's data plane (`DATAPLANE_KEYS`,
`DataPlane._make_snapshot`), the worker around it (`WORKER_KEYS`, its Redis cache and
snapshot: `WorkerHandle.stats`), and the supervisor (`SUPERVISOR_KEYS`: its processes and the
warm standby, `RelayHandle.totals`). A test holds each producer to its keys, and every key
to one exported family.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from firsthop.shared.metrics import MetricFamily, render

# Forwarded traffic: (name, help, ((direction label, key), ...)).
TRAFFIC = [
    (
        "firsthop_relay_packets_total",
        "Datagrams forwarded",
        (("upstream", "upstream"), ("downstream", "downstream")),
    ),
    (
        "firsthop_relay_bytes_total",
        "Payload bytes forwarded",
        (("upstream", "upstream_bytes"), ("downstream", "downstream_bytes")),
    ),
]

# One-number families: (name, type, help, key in the workers' summed stats).
SCALARS = [
    (
        "firsthop_relay_revocations_total",
        "counter",
        "Route tokens revoked by their transceiver (session gone)",
        "revocations",
    ),
    ("firsthop_relay_revoked_tokens", "gauge", "Revoked route tokens remembered", "revoked"),
    ("firsthop_relay_flows", "gauge", "Established flows", "flows"),
    ("firsthop_relay_pending_flows", "gauge", "Flows awaiting their first answer", "pending"),
    (
        "firsthop_relay_recoveries_total",
        "counter",
        "Flows rebuilt from the Redis cache",
        "recoveries",
    ),
    ("firsthop_relay_redis_errors_total", "counter", "Failed Redis calls", "redis_errors"),
    ("firsthop_relay_redis_writes_total", "counter", "Flows written to Redis", "redis_writes"),
    (
        "firsthop_relay_redis_lookups_total",
        "counter",
        "Unknown clients looked up in Redis",
        "redis_lookups",
    ),
    (
        "firsthop_relay_redis_hits_total",
        "counter",
        "Lookups the flow cache answered",
        "redis_hits",
    ),
    (
        "firsthop_relay_redis_dropped_writes_total",
        "counter",
        "Flow writes dropped: too many waiting while Redis was down",
        "redis_dropped_writes",
    ),
    (
        "firsthop_relay_redis_pending_writes",
        "gauge",
        "Flow writes waiting for Redis",
        "redis_pending_writes",
    ),
    ("firsthop_relay_tcp_connections", "gauge", "Open ICE-TCP connections", "tcp_connections"),
    (
        "firsthop_relay_tcp_accepted_total",
        "counter",
        "ICE-TCP connections accepted",
        "tcp_accepted",
    ),
    (
        "firsthop_relay_tcp_queued_bytes",
        "gauge",
        "Bytes waiting for slow ICE-TCP readers",
        "tcp_queued_bytes",
    ),
    ("firsthop_relay_workers", "gauge", "Worker processes ready", "workers_ready"),
    ("firsthop_relay_worker_restarts_total", "counter", "Worker restarts", "worker_restarts"),
    (
        "firsthop_relay_takeovers_total",
        "counter",
        "Dead workers replaced by the warm standby",
        "takeovers",
    ),
    (
        "firsthop_relay_standby_workers",
        "gauge",
        "Warm standby workers ready to take a dead worker's place",
        "standby_ready",
    ),
    (
        "firsthop_relay_standby_flows",
        "gauge",
        "Flows in the standby's copy of the flow cache",
        "standby_flows",
    ),
    (
        "firsthop_relay_standby_copy_age_seconds",
        "gauge",
        "Age of the standby's copy of the flow cache (-1: none)",
        "standby_copy_age",
    ),
    (
        "firsthop_relay_snapshot_hits_total",
        "counter",
        "Look-ups Redis could not answer, answered from the standby's copy of the flow cache",
        "snapshot_hits",
    ),
]
# Families by one label: (name, help, key of a reason -> count dict, label).
BY_LABEL = [
    ("firsthop_relay_drops_total", "Datagrams dropped, by reason", "drops", "reason"),
    ("firsthop_relay_evictions_total", "Flows that yielded their slot, by cap", "evictions", "cap"),
    (
        "firsthop_relay_tcp_closed_total",
        "ICE-TCP connections closed or refused, by reason",
        "tcp_closed",
        "reason",
    ),
]


def sum_worker_stats(stats: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The relay's totals from its workers' stats: numbers added, `BY_LABEL` dicts merged,
    and the supervisor's own keys (`SUPERVISOR_KEYS`) added by the caller."""
    out: dict[str, Any] = {}
    labelled: dict[str, Counter[str]] = {key: Counter() for _, _, key, _ in BY_LABEL}
    for worker in stats:
        for key, value in worker.items():
            if key in labelled:
                labelled[key].update(value)
            elif isinstance(value, int | float):
                out[key] = out.get(key, 0) + value
    out.update({key: dict(counts) for key, counts in labelled.items()})
    return out


def relay_metrics(totals: dict[str, Any], workers: int) -> str:
    g = totals.get
    families = []
    for name, help_, by_direction in TRAFFIC:
        family = MetricFamily(name, "counter", help_)
        for direction, key in by_direction:
            family.add(g(key, 0), direction=direction)
        families.append(family)
    for name, help_, key, label in BY_LABEL:
        family = MetricFamily(name, "counter", help_)
        for value, n in sorted(g(key, {}).items()):
            family.add(n, **{label: value})
        families.append(family)
    families += [
        MetricFamily(name, kind, help_).add(g(key, 0)) for name, kind, help_, key in SCALARS
    ]
    return render(families)


DATAPLANE_KEYS = frozenset(
    {"upstream", "downstream", "upstream_bytes", "downstream_bytes", "flows", "pending"}
    | {"recoveries", "revocations", "revoked", "drops", "evictions"}
    | {"tcp_connections", "tcp_queued_bytes", "tcp_accepted", "tcp_closed"}
)
WORKER_KEYS = frozenset(
    {"redis_errors", "redis_writes", "redis_lookups", "redis_hits", "redis_pending_writes"}
    | {"redis_dropped_writes", "snapshot_hits"}
)
SUPERVISOR_KEYS = frozenset(
    {"workers_ready", "worker_restarts", "takeovers", "standby_ready", "standby_flows"}
    | {"standby_copy_age"}
)
EXPORTED_KEYS = frozenset(
    {key for _, _, by_direction in TRAFFIC for _, key in by_direction}
    | {key for _, _, key, _ in BY_LABEL}
    | {key for _, _, _, key in SCALARS}
)
