"""`firsthop bench churn`: what a server keeps once its calls are gone, firsthop next to stock.

Rounds of short calls (N aiortc callers connect, send a tone for `--hold` seconds, hang up)
against firsthop (caller -> relay -> transceiver -> echo agent) and against stock aiortc (one
peer connection and one UDP socket per call), alternating, on one stack. After each round,
when the server reports no live session and `SETTLE` seconds have passed (the transceiver's
lingering calls end and it hands freed memory back, `service.RELEASE_AFTER`), the server
process's threads and RSS are read from /proc. A server whose per-call resources end with the
call comes back to the same thread count and to a flat RSS round after round; one that keeps
them shows them climbing.

Strategy: the caller workers are `bench sessions`' (the same config lines and JSON results);
the services are pinned to the first allowed CPU and the callers to the last, as there.

Invariants: every process started here is stopped before `run` returns; each round starts
with no live session on the server measured, or says how many were left.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from typing import IO, Any

from firsthop.services.bench.knee import rss_kib
from firsthop.services.bench.measure import BenchError, LineTool, report, settings
from firsthop.services.bench.procs import Stack
from firsthop.services.bench.sessions import frequencies
from firsthop.services.transceiver.service import RELEASE_AFTER

SETTLE = RELEASE_AFTER + 1.0  # seconds after the last session ends before the server is read
TARGETS = ("firsthop", "stock")
DEFAULTS: dict[str, Any] = {"calls": 10, "rounds": 20, "hold": 1.0}
QUICK: dict[str, Any] = {"calls": 3, "rounds": 1, "hold": 0.5}


def _settle(stack: Stack, target: str, timeout: float = 60.0) -> int:
    """Wait for no live session, then SETTLE seconds; the sessions left if it timed out."""
    deadline = time.monotonic() + timeout
    while (left := stack.sessions(target)) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(SETTLE)
    return left


def _round(stack: Stack, target: str, calls: int, hold: float, log: IO[bytes]) -> dict[str, Any]:
    """One round of `calls` short calls to `target`: how many connected, got audio back and
    heard themselves."""
    freqs = frequencies(calls)
    names = ("relay_port", "tx_media", "tx_api", "stock_port", "token")
    config = {
        "target": target,
        "stock_port": stack.stock_port,
        "ports": {k: getattr(stack, k) for k in names},
        "freqs": freqs,
        "all_freqs": freqs,
        "connect_timeout": 30.0,
    }
    worker = LineTool(
        "caller worker", [sys.executable, "-m", "firsthop.services.bench.sessions", "worker"], log
    )
    try:
        worker.send(json.dumps(config))
        ready = json.loads(worker.line(timeout=90 + calls))
        worker.send("go")
        time.sleep(hold)
        worker.send("stop")
        result = json.loads(worker.line(timeout=120))
        worker.line(timeout=60)  # "closed": every caller hung up
    finally:
        worker.stop()
    return {
        "connected": ready["connected"],
        "setup_errors": ready["errors"][:5],
        # calls that got audio back, and that heard their own tone in it (a caller worker
        # running short of CPU sends late, and firsthop plays silence in a late echo's slot)
        "answered": sum(c["frames"] > 0 for c in result["calls"]),
        "heard_own": sum(bool(c["heard_own"]) for c in result["calls"]),
    }


def run(calls: int, *, rounds: int, hold: float) -> dict[str, Any]:
    mask = sorted(os.sched_getaffinity(0))
    server_cpu = mask[0] if len(mask) >= 2 else None
    caller_cpu = mask[-1] if len(mask) >= 2 else None
    series: dict[str, list[dict[str, Any]]] = {t: [] for t in TARGETS}
    with ExitStack() as exits:
        exits.callback(os.sched_setaffinity, 0, set(mask))
        log: IO[bytes] = exits.enter_context(tempfile.TemporaryFile())
        if server_cpu is not None:
            os.sched_setaffinity(0, {server_cpu})  # the services inherit it
        stack = Stack()
        exits.callback(stack.stop)
        stack.start(stock=True)
        if caller_cpu is not None:
            os.sched_setaffinity(0, {caller_cpu})  # the caller workers inherit this one
        pids = {"firsthop": stack.tx_pid, "stock": stack.stock_pid}

        def read(target: str, rnd: int) -> dict[str, Any]:
            """The server idle after its round: sessions left, RSS and threads."""
            left = _settle(stack, target)
            rss, threads = rss_kib(pids[target])
            return {"round": rnd, "rss_kib": rss, "threads": threads, "leftover_sessions": left}

        try:
            for target in TARGETS:
                series[target].append(read(target, 0))
            for rnd in range(1, rounds + 1):
                for target in TARGETS:
                    row = _round(stack, target, calls, hold, log)
                    series[target].append(row | read(target, rnd))
        except BenchError as exc:
            log.seek(0)
            tail = "\n".join(log.read().decode(errors="replace").splitlines()[-20:])
            raise BenchError(f"{exc}\n--- the workers' last stderr lines ---\n{tail}") from exc
    config = {"calls": calls, "rounds": rounds, "hold_s": hold, "settle_s": SETTLE}
    return {"config": config, "series": series, "summary": summarize(series)}


def summarize(series: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per target, what the calls left behind: idle threads and RSS after the first round and
    after the last (the first round's one-off growth, code and caches warmed, is apart)."""
    out: dict[str, Any] = {}
    for target, rows in series.items():
        before, first, last = rows[0], rows[1] if len(rows) > 1 else rows[0], rows[-1]
        after = rows[1:]
        out[target] = {
            "calls": sum(r.get("connected", 0) for r in after),
            "threads_before": before["threads"],
            "threads_after_rounds": [r["threads"] for r in after],
            "threads_max_idle": max((r["threads"] for r in after), default=before["threads"]),
            "rss_mb_before": round(before["rss_kib"] / 1024, 1),
            "rss_mb_after_first": round(first["rss_kib"] / 1024, 1),
            "rss_mb_after_last": round(last["rss_kib"] / 1024, 1),
            # creep: growth from the first round's idle to the last's, per round after it
            "rss_kib_creep_per_round": (
                round((last["rss_kib"] - first["rss_kib"]) / (len(after) - 1), 1)
                if len(after) > 1
                else None
            ),
        }
    return out


def render(result: dict[str, Any]) -> str:
    cfg, summary = result["config"], result["summary"]
    lines = [
        f"firsthop bench churn: {cfg['rounds']} rounds of {cfg['calls']} calls of "
        f"{cfg['hold_s']} s, firsthop and stock aiortc alternating; the server read "
        f"{cfg['settle_s']:.0f} s after its last session ended",
        "",
        f"{'target':<10}{'round':>6}{'conn':>6}{'answ':>6}{'heard':>7}{'threads':>9}{'RSS MB':>9}",
    ]
    for target, rows in result["series"].items():
        for r in rows:
            conn, answered = r.get("connected", "-"), r.get("answered", "-")
            heard = r.get("heard_own", "-")
            lines.append(
                f"{target:<10}{r['round']:>6}{conn:>6}{answered:>6}{heard:>7}{r['threads']:>9}"
                f"{r['rss_kib'] / 1024:>9.1f}"
            )
    lines.append("")
    for target, s in summary.items():
        creep = s["rss_kib_creep_per_round"]
        lines.append(
            f"{target}: {s['calls']} calls; idle threads {s['threads_before']} before, "
            f"{s['threads_max_idle']} at most after a round; RSS {s['rss_mb_before']} MB "
            f"before, {s['rss_mb_after_first']} after the first round, "
            f"{s['rss_mb_after_last']} after the last "
            f"({'-' if creep is None else f'{creep:+.0f} KiB'} a round after the first)"
        )
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    chosen = settings(args, QUICK if args.quick else DEFAULTS)

    def measure() -> dict[str, Any]:
        calls, rounds, hold = int(chosen["calls"]), int(chosen["rounds"]), float(chosen["hold"])
        if calls < 1 or rounds < 1 or hold <= 0:
            raise ValueError("churn needs calls >= 1, rounds >= 1 and hold > 0")
        return run(calls, rounds=rounds, hold=hold)

    return report("churn", args, measure, render)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("churn", help="threads and RSS left after rounds of short calls vs stock")
    p.add_argument("--calls", type=int, help="calls per round (10)")
    p.add_argument("--rounds", type=int, help="rounds per target (20)")
    p.add_argument("--hold", type=float, help="seconds each call sends its tone (1.0)")
    p.add_argument("--quick", action="store_true", help="1 round of 3 calls of 0.5 s")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_main)
