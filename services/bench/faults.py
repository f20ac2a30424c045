"""`firsthop bench faults`: how long a caller goes without audio when a part fails mid-call.

One aiortc caller sends a steady tone through a userspace UDP proxy (`impair.py`, no
impairment) to firsthop's echo through the relay (with its Redis flow cache), and to a stock
aiortc echo where the fault means something there too; one call per fault and target. The
caller notes when each 20 ms frame that carries the tone comes back (`SlotCaller`: the
transceiver's jitter buffer and decoder, no concealment); the audio gap of a fault is the
longest time between two such frames from just before the fault to the end of the call,
less the 20 ms of a frame. A call with no fault (`none`) gives the floor.

Faults (firsthop; stock aiortc has no relay, Redis or agent process: '-'):

* `worker_kill`: SIGKILL the relay worker that serves the call (a child of the supervisor);
* `relay_restart`: stop the whole relay, start it again 1 s later on the same ports;
* `redis_down_worker_kill`: stop Redis, then SIGKILL the worker (Redis comes back after);
* `agent_restart`: stop the echo agent's process and start it again on the same port;
* `tx_sigstop`: SIGSTOP the transceiver (stock: the answerer) for 1 s, then SIGCONT;
* `nat_rebind`: the proxy gives the caller a new source port (a NAT rebinding on
  loopback; the network-namespace tests do it in a real NAT). The far side answers the new
  port after the caller's next authenticated check from it (aiortc: consent every 4-6 s).

The relay faults run again with the same relay restarted with `--no-standby` (a dead worker
cold-started, as before the warm standby): the reference for them, in the same run. With
`--workers N` the worker killed is the first of N (the kernel then rehashes the clients).

Setup time over ICE-TCP against UDP is `firsthop bench setup` (Chromium callers).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from firsthop.services.bench.impair import ImpairedPath
from firsthop.services.bench.loss import SlotCaller, signal_through
from firsthop.services.bench.measure import BenchError, report
from firsthop.services.bench.procs import Stack
from firsthop.services.launch import Child, Spec, free_port, redis_command
from firsthop.shared.metrics import parse_text

FRAME = 0.020
TARGET_WORKER_KILL = 0.200  # seconds of audio a worker kill may cost (issue #12)
FAULTS = [
    "none",
    "worker_kill",
    "relay_restart",
    "redis_down_worker_kill",
    "agent_restart",
    "tx_sigstop",
    "nat_rebind",
]
STOCK_FAULTS = {"none", "tx_sigstop", "nat_rebind"}
RELAY_FAULTS = {"worker_kill", "relay_restart", "redis_down_worker_kill"}  # also: --no-standby
QUICK_FAULTS = ["none", "worker_kill", "tx_sigstop"]
BEFORE = 2.0  # seconds of steady call before the fault
COPY_MARGIN = 0.5  # s: a flow is in Redis this long after its call connected
AFTER = {"nat_rebind": 9.0, "relay_restart": 4.0, "agent_restart": 4.0}  # default: 3 s


def audio_gap(arrivals: list[float], start: float, end: float) -> float | None:
    """The longest time without a tone frame in [start, end], less one frame's own 20 ms
    (None: no tone at all there)."""
    inside = [t for t in arrivals if start <= t <= end]
    if not inside:
        return None
    edges = [start, *inside, end]
    return max(0.0, max(b - a for a, b in zip(edges, edges[1:], strict=False)) - FRAME)


def worker_pids(metrics_port: int) -> list[int]:
    """The relay's serving workers (its /healthz says; the standby is left alone)."""
    url = f"http://127.0.0.1:{metrics_port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            health = json.loads(resp.read())
    except urllib.error.HTTPError as exc:  # 503 while a worker is down: the body says the same
        health = json.loads(exc.read())
    return [int(pid) for pid in health["worker_pids"] if pid]


def relay_metric(metrics_port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as resp:
        return parse_text(resp.read().decode()).get((name, frozenset()), 0.0)


def _until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise BenchError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.05)


class Faults:
    """The stack, its Redis, and how to break each part."""

    def __init__(self, *, workers: int = 1, quiet: bool = True) -> None:
        port = free_port(socket.SOCK_STREAM)
        self.redis = Child(Spec("redis", redis_command(port), ready_tcp=port), quiet=True)
        self.redis.start()
        self.workers = workers
        self.standby = True
        self.stack = Stack(
            quiet=quiet,
            relay_redis=f"redis://127.0.0.1:{port}/0",
            relay_extra=("--workers", str(workers)),
        )
        try:
            self.stack.start(stock=True)
        except BaseException:
            self.redis.kill()
            raise

    def close(self) -> None:
        self.stack.stop()
        self.redis.kill()

    def relay_mode(self, *, standby: bool) -> None:
        """Restart the relay (same ports) with or without its warm standby, if it differs."""
        if standby != self.standby:
            self.standby = standby
            extra = ("--workers", str(self.workers))
            self.stack.relay_extra = extra if standby else (*extra, "--no-standby")
            self.stack.restart_relay(down=0.0)

    def ready_for(self, fault: str, connected: float) -> None:
        """Before a fault: the standby that should take over is ready (and, for a fault that
        takes Redis away, holds a copy of the flow cache taken since the call connected at
        `connected`, monotonic)."""
        if not self.standby or fault not in RELAY_FAULTS:
            return
        port = self.stack.relay_metrics
        _until(lambda: relay_metric(port, "firsthop_relay_standby_workers") >= 1, "standby")
        if fault == "redis_down_worker_kill":

            def fresh() -> bool:
                age = relay_metric(port, "firsthop_relay_standby_copy_age_seconds")
                return 0 <= age < time.monotonic() - connected - COPY_MARGIN

            _until(fresh, "a copy of the flow cache with the call")

    def break_(self, fault: str, target: str, path: ImpairedPath) -> None:
        stack = self.stack
        if fault == "worker_kill":
            self._kill_worker()
        elif fault == "relay_restart":
            stack.restart_relay(down=1.0)
        elif fault == "redis_down_worker_kill":
            self.redis.kill()
            time.sleep(0.5)  # the relay has noticed nothing: no Redis call is on the packet path
            self._kill_worker()
        elif fault == "agent_restart":
            stack.restart_agent()
        elif fault == "tx_sigstop":
            pid = stack.tx_pid if target == "firsthop" else stack.stock_pid
            os.kill(pid, signal.SIGSTOP)
            time.sleep(1.0)
            os.kill(pid, signal.SIGCONT)
        elif fault == "nat_rebind":
            path.rebind()
        elif fault != "none":
            raise ValueError(f"unknown fault {fault!r}")

    def repair(self, fault: str) -> None:
        """Undo what outlives a fault (Redis stays down until here)."""
        if fault == "redis_down_worker_kill":
            self.redis.start()

    def _kill_worker(self) -> None:
        """SIGKILL the first serving worker (with one worker: the call's)."""
        pids = worker_pids(self.stack.relay_metrics)
        if not pids:
            raise BenchError("no relay worker process found")
        os.kill(pids[0], signal.SIGKILL)


async def one_call(faults: Faults, fault: str, target: str, after: float) -> dict[str, Any]:
    path = ImpairedPath(("127.0.0.1", 0)).start()
    signal_ = signal_through(faults.stack, "stock" if target == "stock" else "firsthop", path)
    caller = SlotCaller()
    try:
        await caller.start(lambda offer: asyncio.to_thread(signal_, offer))
        await asyncio.wait_for(caller.wait_connected(), 15)
        connected = time.monotonic()
        await asyncio.sleep(BEFORE)
        await asyncio.to_thread(faults.ready_for, fault, connected)
        at = time.monotonic()
        await asyncio.to_thread(faults.break_, fault, target, path)
        await asyncio.sleep(after)
        end = time.monotonic()
        await caller.close()
    finally:
        path.stop()
        await asyncio.to_thread(faults.repair, fault)
    gap = audio_gap(caller.loud_at, at - 0.2, end)
    row = {
        "fault": fault,
        "target": target,
        "gap_ms": None if gap is None else round(gap * 1e3),
        # the tone came back before the call ended (else the gap is only a lower bound)
        "recovered": any(t > at for t in caller.loud_at),
    }
    if target != "stock":  # how the relay recovered (since it started: a restart resets)
        port = faults.stack.relay_metrics
        for key in ("takeovers", "worker_restarts", "recoveries", "snapshot_hits"):
            row[key] = int(relay_metric(port, f"firsthop_relay_{key}_total"))
    return row


def run(
    *, faults: list[str], stock: bool, reference: bool, workers: int, after: float | None
) -> dict[str, Any]:
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")
    rig = Faults(workers=workers)
    rows: list[dict[str, Any]] = []
    try:
        for n, fault in enumerate(faults):
            wait = after if after is not None else AFTER.get(fault, 3.0)
            targets = ["firsthop"]
            if reference and fault in RELAY_FAULTS:
                targets.append("no-standby")  # the relay as it was: a dead worker cold-started
            if stock and fault in STOCK_FAULTS:
                targets.append("stock")
            for target in targets:
                rig.relay_mode(standby=target != "no-standby")
                rows.append({"n": n, **asyncio.run(one_call(rig, fault, target, wait))})
    finally:
        rig.close()
    return {"rows": rows, "workers": workers, "target_worker_kill_ms": TARGET_WORKER_KILL * 1e3}


def _cell(rows: list[dict[str, Any]], n: int, target: str) -> str:
    for row in rows:
        if row["n"] == n and row["target"] == target:
            if row["gap_ms"] is None or not row["recovered"]:
                return "no audio"
            return f"{row['gap_ms']} ms"
    return "-"


def render(result: dict[str, Any]) -> str:
    rows = result["rows"]
    lines = [
        "audio gap at the caller (longest time without the echoed tone, from the fault on)",
        f"relay: {result['workers']} worker(s) and Redis; 'no standby': the same relay with "
        "--no-standby (a dead worker is cold-started)",
        f"  {'fault':<24}{'firsthop':>10}{'no standby':>12}{'stock':>10}",
    ]
    for n, fault in dict.fromkeys((r["n"], r["fault"]) for r in rows):
        cells = [_cell(rows, n, t) for t in ("firsthop", "no-standby", "stock")]
        lines.append(f"  {fault:<24}{cells[0]:>10}{cells[1]:>12}{cells[2]:>10}")
    lines.append(
        f"target: worker_kill <= {result['target_worker_kill_ms']:.0f} ms; nat_rebind is "
        "bounded by the caller's consent interval (aiortc 4-6 s); 'no audio': not back by the "
        "call's end; setup over ICE-TCP vs UDP: `firsthop bench setup`"
    )
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    if args.faults:
        chosen = [f.strip() for f in args.faults.split(",") if f.strip()]
    else:
        chosen = QUICK_FAULTS if args.quick else FAULTS
    measure: Callable[[], dict[str, Any]] = lambda: run(  # noqa: E731
        faults=chosen,
        stock=not args.no_stock and not args.quick,
        reference=not args.no_reference and not args.quick,
        workers=args.workers,
        after=args.after,
    )
    return report("faults", args, measure, render)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("faults", help="audio gap at the caller per fault: firsthop vs stock")
    p.add_argument("--faults", help=f"comma-separated, of: {', '.join(FAULTS)} (default all)")
    p.add_argument("--after", type=float, help="seconds of call after each fault")
    p.add_argument("--no-stock", action="store_true", help="no stock aiortc calls")
    p.add_argument(
        "--no-reference", action="store_true", help="no relay faults again with --no-standby"
    )
    p.add_argument("--workers", type=int, default=1, help="relay workers (default 1)")
    p.add_argument(
        "--quick", action="store_true", help="none, worker_kill, tx_sigstop; firsthop alone"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_main)
