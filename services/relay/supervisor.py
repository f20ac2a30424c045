"""`firsthop relay`: N worker processes on one SO_REUSEPORT address, plus /metrics.

Each worker is a process (`python -m firsthop.services.relay.worker INDEX`) so N of them use N cores
without sharing a GIL; the kernel spreads clients across them by 4-tuple hash. The
supervisor restarts a worker that dies (its clients' flows come back from the Redis cache, or
at their next Binding request), adds up the workers' stats snapshots for `/metrics`, and on
SIGTERM passes the signal on and gives the workers until the 5 s deadline to stop reading and
flush their cache writes.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from firsthop.services.relay.config import RelayConfig
from firsthop.services.relay.tcp_ingress import tcp_listener
from firsthop.services.relay.worker import CONFIG_ENV, udp_socket
from firsthop.shared.address import Address, format_hostport
from firsthop.shared.http import serve_simple
from firsthop.shared.lifecycle import announce
from firsthop.shared.metrics import CONTENT_TYPE, MetricFamily, render

log = logging.getLogger("firsthop.relay")

STOP_DEADLINE = 4.5  # seconds from SIGTERM to SIGKILL; the relay exits within 5 s
RESTART_DELAY = 0.5


@dataclass
class WorkerProcess:
    config: RelayConfig
    index: int
    ready: dict[str, Any] | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    process: trio.Process | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the worker, restarting it if it dies; `started` once it is first ready."""
        env = dict(os.environ)
        env[CONFIG_ENV] = self.config.to_json()
        first = True
        while True:
            ready = trio.Event()
            try:
                async with trio.open_nursery() as nursery:
                    proc = await trio.lowlevel.open_process(
                        [sys.executable, "-m", "firsthop.services.relay.worker", str(self.index)],
                        env=env,
                        stdin=subprocess.PIPE,  # never written: EOF tells the worker we died
                        stdout=subprocess.PIPE,
                    )
                    self.process = proc
                    nursery.start_soon(self._read, proc, ready)
                    await ready.wait()
                    if first:
                        first = False
                        task_status.started()
                    code = await proc.wait()
                    nursery.cancel_scope.cancel()
            finally:
                with trio.CancelScope(shield=True):
                    await self._stop()
            self.ready = None
            log.error("relay worker %d exited with %s; restarting", self.index, code)
            self.restarts += 1
            await trio.sleep(RESTART_DELAY)

    async def _read(self, proc: trio.Process, ready: trio.Event) -> None:
        assert proc.stdout is not None
        buffered = b""
        async for chunk in proc.stdout:
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("type") == "ready":
                    self.ready = msg
                    ready.set()
                elif msg.get("type") == "stats":
                    self.stats = msg["stats"]

    async def _stop(self) -> None:
        proc = self.process
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        with trio.move_on_after(STOP_DEADLINE):
            await proc.wait()
        if proc.returncode is None:
            log.warning("relay worker %d did not stop in time; killing it", self.index)
            proc.kill()
            await proc.wait()


@dataclass
class RelayHandle:
    workers: list[WorkerProcess]
    metrics: Address

    def totals(self) -> dict[str, Any]:
        out: dict[str, float] = {}
        drops: Counter[str] = Counter()
        evictions: Counter[str] = Counter()
        tcp_closed: Counter[str] = Counter()
        for w in self.workers:
            for key, value in w.stats.items():
                if key == "drops":
                    drops.update(value)
                elif key == "evictions":
                    evictions.update(value)
                elif key == "tcp_closed":
                    tcp_closed.update(value)
                elif isinstance(value, int | float):
                    out[key] = out.get(key, 0) + value
        result: dict[str, Any] = dict(out)
        result["drops"] = dict(drops)
        result["evictions"] = dict(evictions)
        result["tcp_closed"] = dict(tcp_closed)
        result["workers_ready"] = sum(1 for w in self.workers if w.ready)
        result["worker_restarts"] = sum(w.restarts for w in self.workers)
        return result


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


def relay_metrics(totals: dict[str, Any], workers: int) -> str:
    g = totals.get
    packets = MetricFamily("firsthop_relay_packets_total", "counter", "Datagrams forwarded")
    packets.add(g("upstream", 0), direction="upstream").add(
        g("downstream", 0), direction="downstream"
    )
    octets = MetricFamily("firsthop_relay_bytes_total", "counter", "Payload bytes forwarded")
    octets.add(g("upstream_bytes", 0), direction="upstream")
    octets.add(g("downstream_bytes", 0), direction="downstream")
    families = [packets, octets]
    for name, help_, key, label in BY_LABEL:
        family = MetricFamily(name, "counter", help_)
        for value, n in sorted(g(key, {}).items()):
            family.add(n, **{label: value})
        families.append(family)
    families += [
        MetricFamily(name, kind, help_).add(g(key, 0)) for name, kind, help_, key in SCALARS
    ]
    return render(families)


async def serve_relay(
    config: RelayConfig,
    *,
    task_status: trio.TaskStatus[RelayHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    # A port 0 for the public or peer socket is chosen here, once, and held by a probe
    # socket in the SO_REUSEPORT group until every worker has bound the same port.
    probes = []
    for name in ("listen", "listen_other"):
        addr = getattr(config, name)
        if addr is not None and addr[1] == 0:
            probes.append(udp_socket(addr, reuseport=True))
            bound: Any = (addr[0], probes[-1].getsockname()[1])
            config = replace(config, **{name: bound})
    if config.internal[1] == 0:
        probes.append(udp_socket(config.internal, reuseport=True))
        config = replace(config, internal=(config.internal[0], probes[-1].getsockname()[1]))
    tcp_probes = []
    for name in ("listen_tcp", "listen_tcp_other"):
        addr = getattr(config, name)
        if addr is not None and addr[1] == 0:
            tcp_probes.append(tcp_listener(addr, reuseport=True, listen=False))
            bound = (addr[0], tcp_probes[-1].getsockname()[1])
            config = replace(config, **{name: bound})
    workers = [WorkerProcess(config, i) for i in range(config.workers)]

    async def http(method: str, path: str) -> tuple[int, str, bytes]:
        handle_totals = RelayHandle(workers, config.metrics).totals()
        if path == "/metrics":
            return 200, CONTENT_TYPE, relay_metrics(handle_totals, len(workers)).encode()
        if path == "/healthz":
            ok = handle_totals["workers_ready"] == len(workers)
            body = json.dumps({"ok": ok, "workers_ready": handle_totals["workers_ready"]})
            return (200 if ok else 503), "application/json", body.encode()
        return 404, "text/plain", b"not found\n"

    async with trio.open_nursery() as nursery:
        try:
            for worker in workers:
                await nursery.start(worker.run)
        finally:
            for probe in probes:
                probe.close()
            for tcp_probe in tcp_probes:
                tcp_probe.close()
        metrics = await nursery.start(serve_simple, http, config.metrics)
        log.info(
            "relay cluster %d ready: %d worker(s) on %s, internal %s, metrics %s",
            config.cluster,
            len(workers),
            ", ".join(format_hostport(a) for a in (*config.listens, *config.listens_tcp)),
            format_hostport(config.internal),
            format_hostport(metrics),
        )
        more = {
            name: getattr(config, name)
            for name in ("listen_tcp", "listen_other", "listen_tcp_other")
            if getattr(config, name) is not None
        }
        announce(listen=config.listen, internal=config.internal, metrics=metrics, **more)
        task_status.started(RelayHandle(workers, metrics))
