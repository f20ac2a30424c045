"""`firsthop bench sessions --knee`: the most concurrent echo calls one transceiver holds on
one pinned core, and the most stock aiortc holds on it, asked alike in the same run.

The whole call path runs (caller -> relay -> transceiver -> echo agent and back), the
transceiver pinned alone to the first allowed CPU (`--whole-path`: the transceiver, echo agent
and relay together on it), everything else (the caller workers, the capture, and what is not
measured) to the last: on a 2-core machine the other core carries the bench, and when it
saturates the figure is the bench's limit, not the measured processes' (each step says).

The reference: the same sweep against the stock aiortc answerer (`stock.py`, one peer
connection and socket per call) pinned alone to that core, with the same callers and the same
loss bound; its sockets are one per call, so it is judged on loss alone. `bench sessions`
prices a call at a load stock can carry, where a wake-up per packet weighs on firsthop's
cost; the knees compare what one core holds at its limit.

A step: N cheap callers (`knee_caller.py`: aiortc for ICE/DTLS/SRTP/RTCP, pre-encoded tone
bursts out, RTP recorded and judged after the window, not decoded while it runs) in worker
processes like `bench sessions`' (`python -m firsthop.services.bench.knee worker`); after the
warm-up, a steady window. It passes when

* frame loss (frames of tone that did not come back, or came back late and were replaced by
  silence, over all calls; a call that did not connect loses all its frames) is <= 0.5 %, and
* the transceiver's residence p99 is <= 40 ms: per burst onset, the first tone packet into the
  transceiver's media socket to the first tone packet out of it, stamped by the kernel
  (`capture.py`: a passive AF_PACKET capture on `lo`; without CAP_NET_RAW the step is judged
  on loss alone and says so). It holds the wait for the transceiver's 20 ms output tick
  (0-20 ms, each call at its own phase).

The sweep doubles N from `--calls` until a step fails (or `--max-calls`), then bisects between
the last pass and the first failure down to `--resolution`. On a shared machine other
processes may hold the measured core: a step that failed while others took more than 10 % of
it (its busy time beyond the measured processes' own) is run again, twice at most, and every
attempt is reported.

Per step: the transceiver's own counters over the step's calls (repaired frames, late and
skipped packets: the caller's audio came in late or lost, before the echo's way back), the
measured processes' CPU (% of their core) and run-queue wait, each core's busy %, each
process's CPU, and the server's RSS at load (the transceiver's, or stock's in the
reference); RSS per session = (RSS at load - RSS idle before the first step)
/ N (the idle RSS before each step is reported too: what earlier steps left behind counts
in later steps' figure, so the first steps' is the cleaner one). Before the sweep a loss
check proves the judge: a step whose echo agent is stopped (SIGSTOP) for `STALL_S`
mid-window must report the frames that stall cost.

Invariants: every process started here is stopped before `run` returns; each step starts
with no live session on the server measured, or says how many were left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from firsthop.services.bench.echo import _pct
from firsthop.services.bench.knee_caller import (
    BURST_FRAMES,
    FRAME_S,
    PERIOD_FRAMES,
    BurstTrack,
    TapCaller,
    burst_frames,
    encoded_cycle,
    judge,
)
from firsthop.services.bench.knee_report import (
    MAX_RESIDENCE_P99_MS,
    render,
    step_line,
    summarize,
)
from firsthop.services.bench.measure import (
    BenchError,
    LineTool,
    children_of,
    cpu_sample,
    report,
    settings,
)
from firsthop.services.bench.procs import Stack
from firsthop.services.bench.sessions import (
    MAX_LOSS_PCT,
    codec_floor,
    connect_all,
    emit,
    frequencies,
    worker_main,
)

SATURATED_PCT = 90.0  # a core this busy over the window is the limit
CONTENDED = 0.10  # share of the window other processes took on the measured core
RETRIES = 2  # more attempts at a step that failed contended
STALL_S = 0.5  # the loss check's agent stall
PERIOD_S = PERIOD_FRAMES * FRAME_S
KNEE_DEFAULTS: dict[str, Any] = {
    "calls": "20",
    "seconds": 10.0,
    "warmup": 2.0,
    "max_calls": 400,
    "resolution": 10,
}
KNEE_QUICK: dict[str, Any] = {
    "calls": "2",
    "seconds": 2.0,
    "warmup": 0.5,
    "max_calls": 4,
    "resolution": 2,
}


# -- the caller worker process ----------------------------------------------------------------


async def _worker(config: dict[str, Any], lines: asyncio.StreamReader) -> None:
    stack = Stack(**config["ports"])
    freqs: list[float] = config["freqs"]
    callers = [TapCaller(BurstTrack(encoded_cycle(f), phase=(f * 0.618034) % 1.0)) for f in freqs]
    done = await connect_all(callers, stack.answerer(config["target"]), config["connect_timeout"])
    try:
        await lines.readline()  # "go"
        start = time.monotonic()
        for caller in callers:
            caller.recording = True
            caller.burst_track.arm()
        await lines.readline()  # "stop"
        end = time.monotonic()
        for caller in callers:
            caller.recording = False
        calls = []
        for caller, freq, outcome in zip(callers, freqs, done, strict=True):
            verdict = judge(
                caller.packets, caller.burst_track.onsets, freq, config["all_freqs"], (start, end)
            )
            connected = outcome is None
            if not connected:  # a call that never connected lost every frame of the window
                bursts = int((end - start) // PERIOD_S)
                verdict.bursts, verdict.expected = bursts, bursts * BURST_FRAMES
                verdict.lost = verdict.expected
            calls.append({**vars(verdict), "freq": freq, "connected": connected})
        emit({"type": "result", "window_s": round(end - start, 3), "calls": calls})
    finally:
        await asyncio.gather(*(c.close() for c in callers), return_exceptions=True)
    emit({"type": "closed"})


# -- /proc: what each core and the transceiver did -------------------------------------------


def core_ticks() -> dict[int, tuple[int, int]]:
    """(busy, total) jiffies per CPU since boot (/proc/stat; idle and iowait are not busy)."""
    out: dict[int, tuple[int, int]] = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name != "cpu":
            values = [int(v) for v in fields[:8]]
            total = sum(values)
            out[int(name[3:])] = (total - values[3] - values[4], total)
    return out


def rss_kib(pid: int) -> tuple[int, int]:
    """(VmRSS KiB, threads) of a process."""
    rss = threads = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return rss, threads


COUNTED = (
    "frames_decoded",
    "frames_repaired",
    "jitter_late",
    "jitter_skipped",
    "agent_frames_played",
    "output_gaps",
    "output_late_played",
)


def tx_counters(api_port: int) -> dict[str, int]:
    """The transceiver's own event counters of interest (`/metrics`; a call adds its own at its
    end): repaired frames and late or skipped packets say the caller's audio came in late or
    lost, before the echo's way back."""
    url = f"http://127.0.0.1:{api_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out = dict.fromkeys(COUNTED, 0)
    for line in text.splitlines():
        if line.startswith('firsthop_transceiver_events_total{event="'):
            name = line.split('"')[1]
            if name in out:
                out[name] = int(float(line.rsplit(" ", 1)[1]))
    return out


def pin_threads(pid: int, cpu: int | None) -> None:
    """Pin every thread of `pid` (threads it starts later inherit it from theirs)."""
    if cpu is None:
        return
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
        except OSError:
            pass  # a thread that ended meanwhile


# -- one step -----------------------------------------------------------------------------


class Bench:
    """The running stack, capture and pinning, and the steps measured on them.

    `target` "firsthop" measures what `pinned` names on the measured core ("transceiver":
    the transceiver alone; "path": transceiver, echo agent and relay together); "stock" the
    stock aiortc answerer alone there (the reference: no capture, judged on loss alone).
    """

    def __init__(
        self,
        exits: ExitStack,
        *,
        seconds: float,
        warmup: float,
        workers: int,
        target: str = "firsthop",
        pinned: str = "transceiver",
    ):
        self.seconds, self.warmup, self.workers = seconds, warmup, workers
        self.target, self.pinned = target, pinned
        mask = sorted(os.sched_getaffinity(0))
        self.tx_cpu = mask[0] if len(mask) >= 2 else None
        self.bench_cpu = mask[-1] if len(mask) >= 2 else None
        exits.callback(os.sched_setaffinity, 0, set(mask))
        self.log: IO[bytes] = exits.enter_context(tempfile.TemporaryFile())
        # Everything started from here on inherits the bench's core; the transceiver is then
        # moved, every thread of it, to its own.
        if self.bench_cpu is not None:
            os.sched_setaffinity(0, {self.bench_cpu})
        self.stack = stack = Stack()
        exits.callback(stack.stop)
        stack.start(stock=target == "stock")
        self.server_pid = stack.stock_pid if target == "stock" else stack.tx_pid
        for pid in self.measured_pids().values():
            pin_threads(pid, self.tx_cpu)
        self.capture: LineTool | None = None
        self.capture_error: str | None = "stock: not captured"
        if target == "firsthop":
            argv = [sys.executable, "-m", "firsthop.services.bench.capture"]
            self.capture = LineTool(
                "capture", [*argv, str(stack.tx_media), str(PERIOD_S)], self.log
            )
            exits.callback(self.capture.stop)
            ready = self.capture.line(timeout=30)
            self.capture_error = None if ready == "ready" else ready.removeprefix("error ")
            if self.capture_error is not None:
                self.capture = None
        self._wait_idle()
        time.sleep(1.0)
        self.idle_rss_kib, self.idle_threads = rss_kib(self.server_pid)

    def codec_floor(self) -> float:
        """The codec floor (`sessions.codec_floor`) on the measured core, of the callers'
        own frames: a cycle of tone bursts and silence, decoded, and the decodes encoded."""
        if self.tx_cpu is not None:
            os.sched_setaffinity(0, {self.tx_cpu})
        try:
            return codec_floor(frames=burst_frames(frequencies(1)[0]))
        finally:
            if self.bench_cpu is not None:
                os.sched_setaffinity(0, {self.bench_cpu})

    def measured_pids(self) -> dict[str, int]:
        """The processes on the measured core, by name."""
        stack = self.stack
        if self.target == "stock":
            return {"stock": stack.stock_pid}
        pids = {"transceiver": stack.tx_pid}
        if self.pinned == "path":
            pids |= {"agent": stack.agent_pid, "relay": stack.relay_pid}
            for i, child in enumerate(children_of(stack.relay_pid)):
                pids[f"relay worker {i}"] = child
        return pids

    def _wait_idle(self, timeout: float = 60.0) -> int:
        deadline = time.monotonic() + timeout
        while (left := self.stack.sessions(self.target)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def _pids(self, workers: list[LineTool]) -> dict[str, int]:
        stack = self.stack
        if self.target == "stock":
            pids = {"stock": stack.stock_pid}
        else:
            pids = {"transceiver": stack.tx_pid, "agent": stack.agent_pid}
            pids["relay"] = stack.relay_pid
            for i, child in enumerate(children_of(stack.relay_pid)):
                pids[f"relay worker {i}"] = child
        for i, worker in enumerate(workers):
            pids[f"callers {i}"] = worker.pid
        if self.capture is not None:
            pids["capture"] = self.capture.pid
        return pids

    def step(self, calls: int, *, stall: float = 0.0) -> dict[str, Any]:
        leftover = self._wait_idle()
        idle_rss, _ = rss_kib(self.server_pid)
        firsthop = self.target == "firsthop"
        counted0 = tx_counters(self.stack.tx_api) if firsthop else {}
        freqs = frequencies(calls)
        shares = [freqs[i :: self.workers] for i in range(min(self.workers, calls))]
        stack = self.stack
        names = ("relay_port", "tx_media", "tx_api", "token", "stock_port")
        ports = {k: getattr(stack, k) for k in names}
        argv = [sys.executable, "-m", "firsthop.services.bench.knee", "worker"]
        workers: list[LineTool] = []
        try:  # (the ones started are stopped if a later one cannot be)
            for i in range(len(shares)):
                workers.append(LineTool(f"caller worker {i}", argv, self.log))
            for worker, mine in zip(workers, shares, strict=True):
                config = {"ports": ports, "freqs": mine, "all_freqs": freqs, "target": self.target}
                worker.send(json.dumps({**config, "connect_timeout": 60.0}))
            ready = [json.loads(worker.line(timeout=60 + calls)) for worker in workers]
            time.sleep(self.warmup)
            if self.capture is not None:
                self.capture.ask("dump", timeout=60)  # forget the setup and warm-up
            pids = self._pids(workers)
            cpu0, cores0 = cpu_sample(pids), core_ticks()
            t0 = time.monotonic()
            for worker in workers:
                worker.send("go")
            if stall:
                time.sleep(self.seconds / 3)
                os.kill(stack.agent_pid, signal.SIGSTOP)
                try:
                    time.sleep(stall)
                finally:
                    os.kill(stack.agent_pid, signal.SIGCONT)
            time.sleep(max(0.0, t0 + self.seconds - time.monotonic() - 0.5))
            rss, threads = rss_kib(self.server_pid)
            time.sleep(max(0.0, t0 + self.seconds - time.monotonic()))
            for worker in workers:
                worker.send("stop")
            window = time.monotonic() - t0
            cpu1, cores1 = cpu_sample(pids), core_ticks()
            captured = None
            if self.capture is not None:
                captured = json.loads(self.capture.ask("dump", timeout=120))
            results = [json.loads(worker.line(timeout=120 + calls)) for worker in workers]
            for worker in workers:
                worker.line(timeout=60)  # "closed"
        finally:
            for worker in workers:
                worker.stop()
        self._wait_idle()
        counted1 = tx_counters(stack.tx_api) if firsthop else {}
        if cpu0 is None or cpu1 is None:
            raise BenchError(f"a process under test exited during the {calls}-call step")
        cpu_pct = {n: 100.0 * (cpu1[n][0] - cpu0[n][0]) / 1e9 / window for n in cpu1}
        measured = list(self.measured_pids())
        server_pct = sum(cpu_pct[n] for n in measured)
        # runnable but not running: the wait of the measured process that waited most
        wait_ms = max((cpu1[n][1] - cpu0[n][1]) / 1e6 for n in measured)
        busy = {
            cpu: round(100.0 * (cores1[cpu][0] - b0) / max(1, cores1[cpu][1] - t0_), 1)
            for cpu, (b0, t0_) in cores0.items()
        }
        per_call = [call for r in results for call in r["calls"]]
        expected = sum(c["expected"] for c in per_call)
        lost = sum(c["lost"] for c in per_call)
        loss_pct = 100.0 * lost / expected if expected else 100.0
        res = [ms for _, ms in captured["matched"]] if captured else []
        p99 = _pct(res, 0.99)
        callers_pct = sum(v for n, v in cpu_pct.items() if n.startswith("callers"))
        row: dict[str, Any] = {
            "calls": calls,
            "connected": sum(r["connected"] for r in ready),
            "setup_errors": [e for r in ready for e in r["errors"]][:5],
            "leftover_sessions_at_start": leftover,
            "window_s": round(window, 3),
            "stall_s": stall,
            "frames_expected": expected,
            "frames_lost": lost,
            "loss_pct": round(loss_pct, 3),
            "worst_call_lost": max((c["lost"] for c in per_call), default=0),
            "all_heard_own": all(c["heard_own"] for c in per_call if c["connected"]),
            "residence_ms": {
                "p50": _pct(res, 0.5),
                "p95": _pct(res, 0.95),
                "p99": p99,
                "max": max(res, default=None),
                "n": len(res),
                "kernel_drops": captured["kernel_drops"] if captured else None,
            },
            "cpu_pct": {n: round(v, 1) for n, v in cpu_pct.items()},
            "callers_cpu_pct": round(callers_pct, 1),
            "callers_cpu_pct_per_call": round(callers_pct / calls, 3),
            "measured": measured,  # the processes on the measured core
            "measured_cpu_pct": round(server_pct, 1),
            "measured_cpu_pct_per_call": round(server_pct / calls, 3),
            "measured_runqueue_wait_ms": round(wait_ms, 1),
            "transceiver_cpu_pct": round(cpu_pct["transceiver"], 1) if firsthop else None,
            "transceiver_cpu_pct_per_call": (
                round(cpu_pct["transceiver"] / calls, 3) if firsthop else None
            ),
            "core_busy_pct": busy,
            "contended": self._contended(busy, server_pct, wait_ms / 1000 / window),
            "rss_kib": rss,
            "threads": threads,
            "rss_kib_per_session": round((rss - self.idle_rss_kib) / calls, 1),
            # idle just before this step: what earlier steps left (freed memory Python keeps)
            "rss_kib_idle_before": idle_rss,
            # the whole step's calls, setup to hang-up, as the transceiver counted them
            "transceiver_counted": (
                {k: counted1[k] - counted0[k] for k in COUNTED} if firsthop else None
            ),
            "per_call": per_call,
        }
        row["passed"] = (
            loss_pct <= MAX_LOSS_PCT
            and row["connected"] == calls
            and (p99 is None if self.capture is None else p99 is not None)
            and (p99 is None or p99 <= MAX_RESIDENCE_P99_MS)
        )
        row["bound"] = self._bound(row)
        return row

    def _contended(self, busy: dict[int, float], measured_pct: float, waited: float) -> bool:
        """Whether other processes held the measured core for more than CONTENDED of the
        window: its busy time beyond the measured processes' own (pinned), else the share of
        the window they waited runnable (a process's own threads count there too)."""
        if self.tx_cpu is not None and self.tx_cpu in busy:
            return busy[self.tx_cpu] - measured_pct > 100.0 * CONTENDED
        return waited > CONTENDED

    def _bound(self, row: dict[str, Any]) -> str:
        """What was the limit over the window: each that applies, the measured core first."""
        tx_core = row["core_busy_pct"].get(self.tx_cpu) if self.tx_cpu is not None else None
        other = row["core_busy_pct"].get(self.bench_cpu) if self.bench_cpu is not None else None
        found = []
        if row["measured_cpu_pct"] >= SATURATED_PCT:
            found.append(f"measured core ({' + '.join(row['measured'])})")
        elif row["contended"] or (tx_core is not None and tx_core >= SATURATED_PCT):
            found.append("measured core shared (other processes ran on it)")
        if other is not None and other >= SATURATED_PCT:
            found.append(f"bench core {other:.0f} % busy (callers and what is not measured)")
        return "; ".join(found) or "neither core saturated"


# -- the sweep ----------------------------------------------------------------------------


def sweep(bench: Bench, start: int, max_calls: int, resolution: int) -> list[dict[str, Any]]:
    """Double from `start` until a step fails or `max_calls` passes, then bisect. A step that
    failed while other processes held the transceiver's core (`contended`) is run again, up
    to RETRIES times: on a shared machine that failure is theirs."""
    rows: list[dict[str, Any]] = []

    def step(n: int) -> bool:
        for attempt in range(1, RETRIES + 2):
            row = bench.step(n)
            row["attempt"] = attempt
            rows.append(row)
            print(step_line(row), file=sys.stderr, flush=True)
            if row["passed"] or not row["contended"]:
                break
        return bool(rows[-1]["passed"])

    passed, failed, n = 0, None, start
    while True:
        if step(n):
            passed = n
            if n >= max_calls:
                break
            n = min(2 * n, max_calls)
        else:
            failed = n
            break
    while failed is not None and failed - passed > resolution:
        n = (passed + failed) // 2
        if step(n):
            passed = n
        else:
            failed = n
    return rows


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _unwind_on_sigterm(exits: ExitStack) -> None:
    """SIGTERM unwinds like Ctrl-C, so that the stack, workers and capture are stopped; the
    previous handler is back when `exits` closes."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    exits.callback(signal.signal, signal.SIGTERM, previous)


def run(
    start: int,
    *,
    max_calls: int,
    resolution: int,
    seconds: float,
    warmup: float,
    workers: int,
    pinned: str = "transceiver",
    reference: bool = True,
) -> dict[str, Any]:
    """firsthop's sweep (what `pinned` names on the measured core), then, with `reference`,
    stock aiortc's on the same core with the same callers: the same question asked of both."""
    with ExitStack() as exits:
        _unwind_on_sigterm(exits)
        bench = Bench(exits, seconds=seconds, warmup=warmup, workers=workers, pinned=pinned)
        try:
            floors = [bench.codec_floor()]  # before and after the sweep, as `bench sessions`
            check = bench.step(min(start, 4), stall=STALL_S)
            rows = sweep(bench, start, max_calls, resolution)
            floors.append(bench.codec_floor())
        except BenchError as exc:
            raise _with_log(bench, exc) from exc
        config = {
            "start": start,
            "max_calls": max_calls,
            "resolution": resolution,
            "seconds": seconds,
            "warmup": warmup,
            "workers": workers,
            "pinned": pinned,
            "measured": list(bench.measured_pids()),
            "transceiver_cpu": bench.tx_cpu,
            "bench_cpu": bench.bench_cpu,
            "max_loss_pct": MAX_LOSS_PCT,
            "max_residence_p99_ms": MAX_RESIDENCE_P99_MS,
            "residence": "kernel-stamped capture" if bench.capture_error is None else None,
            "capture_error": bench.capture_error,
            "idle_rss_kib": bench.idle_rss_kib,
            "idle_threads": bench.idle_threads,
        }
    stall_frames = int(STALL_S / FRAME_S)
    loss_check = {
        "calls": check["calls"],
        "stall_s": STALL_S,
        "frames_lost": check["frames_lost"],
        "per_call_lost": [c["lost"] for c in check["per_call"]],
        # the stall may fall partly into a burst's silence: at least 30 % of it is tone
        "detected": all(c["lost"] >= stall_frames * 0.3 for c in check["per_call"]),
    }
    summary = summarize(rows, statistics.median(floors))
    result: dict[str, Any] = {"config": config, "loss_check": loss_check, "rows": rows}
    result["summary"] = summary
    if reference:
        ref = _reference(start, max_calls, resolution, seconds, warmup, workers)
        stock = ref["summary"]["knee_calls"]
        result["reference"] = ref
        result["knee_over_stock"] = round(summary["knee_calls"] / stock, 2) if stock else None
    return result


def _reference(
    start: int, max_calls: int, resolution: int, seconds: float, warmup: float, workers: int
) -> dict[str, Any]:
    """Stock aiortc's knee: its answerer alone on the measured core, the same callers, the
    same loss bound (no residence: its sockets are one per call). It starts from a quarter
    of firsthop's start (2 at least), stock holding far fewer calls."""
    with ExitStack() as exits:
        _unwind_on_sigterm(exits)
        bench = Bench(exits, seconds=seconds, warmup=warmup, workers=workers, target="stock")
        try:
            rows = sweep(bench, max(2, start // 4), max_calls, max(1, resolution // 4))
        except BenchError as exc:
            raise _with_log(bench, exc) from exc
        idle = bench.idle_rss_kib
    return {"target": "stock", "idle_rss_kib": idle, "rows": rows, "summary": summarize(rows)}


def _with_log(bench: Bench, exc: BenchError) -> BenchError:
    bench.log.seek(0)
    tail = "\n".join(bench.log.read().decode(errors="replace").splitlines()[-20:])
    return BenchError(f"{exc}\n--- the last stderr lines ---\n{tail}")


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    asyncio.run(worker_main(_worker))


def main(args: argparse.Namespace) -> int:
    """`bench sessions --knee`."""
    chosen = settings(args, KNEE_QUICK if args.quick else KNEE_DEFAULTS)

    def measure() -> dict[str, Any]:
        start, top = int(chosen["calls"]), int(chosen["max_calls"])
        if start < 1 or top < start or int(chosen["resolution"]) < 1:
            raise ValueError("--knee needs 1 <= calls <= max-calls and resolution >= 1")
        return run(
            start,
            max_calls=top,
            resolution=int(chosen["resolution"]),
            seconds=float(chosen["seconds"]),
            warmup=float(chosen["warmup"]),
            workers=args.workers,
            pinned="path" if args.whole_path else "transceiver",
        )

    return report("sessions --knee", args, measure, render)
