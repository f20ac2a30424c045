"""`firsthop bench relay`: the relay's cost per forwarded packet, next to a C forwarder.

A load generator in its own process (a STUN Binding request per flow first, then 160-byte
RTP-sized packets over many flows) sends through the relay (one worker, pinned) to a sink.
Reported per phase: the relay's CPU-µs per forwarded packet, packets/s achieved at the sink,
loss, and one-way latency p50/p99 from sender-timestamped packets; in the same run, the same
load through a minimal C forwarder (a recvfrom/sendto loop) is the reference, and the same
job in Python (`py_forwarder.py`: the same syscalls, no flow table) is Python's floor: what
the interpreter alone costs around those syscalls, which no Python relay gets under. Targets,
printed and never asserted: relay CPU per packet <= 1.0x the C reference; >= 100k packets/s
per worker at < 0.1 % loss; added latency p99 <= 1 ms at half that rate.

Strategy: generator, sink and reference forwarder are one C program (`c_forwarder.c`, built
here with `cc -O2` into a temporary directory; the Python floor is its own process), because a
Python generator and sink sharing a core top out near the rates being measured, and then they,
not the relay, would be what is measured. Relay and the two forwarders share the first allowed
CPU, generator and sink the last (on a 2-core machine the pair gets one core). Each round runs
C, the Python floor, then the relay at the full rate, then all at half; a "direct" phase per
rate (generator -> sink, framed by the generator) is the latency floor that added latency is
measured from. Latency is the sink socket's kernel receive timestamp minus the sender's stamp,
so the sink's own scheduling is left out ("app" latency keeps it in).

CPU: run time of every thread of the forwarding process(es) from /proc/PID/task/*/schedstat
(ns; utime+stime ticks from /proc/PID/stat where schedstat is off), sampled at "go" and
after the drain, divided by the packets the sink received. The relay's own counters are the
cross-check. Time the forwarder spent runnable while another process held its CPU is
reported too: on a shared machine it, not the forwarder, explains most loss and tail latency.

Invariants: everything binds loopback (flow i binds 127.1.x.y: one address per client, as
the relay limits new flows per source IP) on free ports, and every process started here is
stopped before `run` returns.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from firsthop.services.bench.measure import (
    SCHEDSTAT,
    BenchError,
    LineTool,
    children_of,
    cpu_sample,
    pin,
    report,
    settings,
    stop_process,
    udp_drops,
)
from firsthop.services.bench.wire import chrome_like_binding_request
from firsthop.services.launch import HOST, free_port
from firsthop.services.relay.config import RelayConfig
from firsthop.services.relay.dataplane import DATAPATHS, datapath_in_use
from firsthop.services.relay.worker import CONFIG_ENV
from firsthop.shared.address import Address
from firsthop.shared.metrics import parse_text
from firsthop.shared.wire.route_token import encode_route_token, format_route_keys

Row = dict[str, Any]

SRC_NET = "127.1"
SOURCE = Path(__file__).with_name("c_forwarder.c")
DRAIN = 0.3  # seconds between the generator's last send and the counts
COUNTERS_LAG = 0.8  # a worker's counters are published within 0.25 s + 0.5 s (worker.py)
TARGET_CPU_RATIO = 1.0
TARGET_PPS = 100_000
TARGET_LOSS_PCT = 0.1
TARGET_ADDED_P99_US = 1000.0
PHASES = (("max", 1.0), ("half", 0.5))
FORWARDERS = ("c", "py", "relay")  # measured in this order each round
DEFAULTS = {"rate": 100_000.0, "seconds": 3.0, "flows": 64, "rounds": 3}
QUICK = {"rate": 2000.0, "seconds": 1.0, "flows": 8, "rounds": 1}


# -- processes -------------------------------------------------------------------------------


def build_tools(workdir: Path) -> Path:
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        raise BenchError(
            "firsthop bench relay builds its reference forwarder with a C compiler and `cc` "
            "was not found: install one (Debian/Ubuntu: apt-get install gcc) or set CC"
        )
    exe = workdir / "c_forwarder"
    done = subprocess.run(
        [cc, "-O2", "-o", str(exe), str(SOURCE)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise BenchError(f"{cc} -O2 {SOURCE.name} failed:\n{done.stderr}")
    return exe


# -- the relay under test --------------------------------------------------------------------


def _hostport(addr: Address) -> str:
    return f"{addr[0]}:{addr[1]}"


class Relay:
    """The relay on free loopback ports, pinned to `cpu`.

    By default its one worker process runs alone (`python -m firsthop.services.relay.worker 0`,
    exactly the process `firsthop relay` runs per worker) with the bench as its parent, and
    its counters come from the stats lines it writes for a supervisor. `supervised` runs the
    whole `firsthop relay --workers 1` and reads /metrics instead. Why that is not the
    default: the supervisor spawns workers from a Trio worker thread (`trio.lowlevel.
    open_process`), the worker's PR_SET_PDEATHSIG fires when that *thread* exits, and Trio's
    thread cache ends idle threads after 10 s, so under `firsthop relay` the worker is
    SIGTERMed and restarted every ~10 s and its flows are lost. A phase that straddles a
    restart is flagged and left out of the summary.
    """

    def __init__(
        self,
        key: bytes,
        cpu: int | None,
        log: IO[bytes],
        workdir: Path,
        *,
        supervised: bool,
        datapath: str = "auto",
    ) -> None:
        self.supervised, self.cpu = supervised, cpu
        self.listen = (HOST, free_port(socket.SOCK_DGRAM))
        internal = (HOST, free_port(socket.SOCK_DGRAM))
        metrics = (HOST, free_port(socket.SOCK_STREAM))
        self.url = f"http://{_hostport(metrics)}"
        self.stats_path = workdir / "relay-worker.out"
        env = dict(os.environ, FIRSTHOP_LOG_LEVEL="WARNING")
        if supervised:
            env["FIRSTHOP_ROUTE_KEYS"] = format_route_keys({1: key})
            argv = [sys.executable, "-m", "firsthop.services.cli", "relay", "--workers", "1"]
            argv += ["--no-standby"]  # one worker process, measured alone
            argv += ["--listen", _hostport(self.listen), "--internal", _hostport(internal)]
            argv += ["--metrics", _hostport(metrics), "--allow-dest", "127.0.0.0/8"]
            argv += ["--datapath", datapath]
        else:
            config = RelayConfig(
                listen=self.listen,
                internal=internal,
                keys={1: key},
                allow_dest=["127.0.0.0/8"],
                datapath=datapath,
            )
            env[CONFIG_ENV] = config.to_json()
            argv = [sys.executable, "-m", "firsthop.services.relay.worker", "0"]
        with open(self.stats_path, "wb") as out:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,  # a worker exits when its stdin closes (parent gone)
                stdout=log if supervised else out,
                stderr=log,
                env=env,
            )
        pin(self.proc.pid, cpu)  # before a supervisor spawns its worker: it inherits the mask
        try:
            self.worker = self._wait_ready(timeout=20.0)
        except BaseException:
            self.stop()
            raise
        self.pin_worker()

    def pin_worker(self) -> None:
        for tid in os.listdir(f"/proc/{self.worker}/task"):
            pin(int(tid), self.cpu)

    def pids(self) -> dict[str, int]:
        if self.supervised:
            return {"worker": self.worker, "supervisor": self.proc.pid}
        return {"worker": self.worker}

    def current_worker(self) -> int | None:
        if not self.supervised:
            return self.proc.pid if self.proc.poll() is None else None
        workers = children_of(self.proc.pid)
        return workers[0] if len(workers) == 1 else None

    def _wait_ready(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"the relay exited with {self.proc.returncode}")
            try:
                ready = self.counters()
            except OSError:
                ready = {}  # not listening yet, or 503 until the worker is ready
            worker = self.current_worker()
            if ready and worker is not None:
                return worker
            time.sleep(0.1)
        raise BenchError("the relay did not become ready")

    def counters(self) -> dict[str, float]:
        """Packets up/downstream, drops by reason, worker restarts; {} until ready."""
        out: dict[str, float] = {}
        if not self.supervised:
            stats: dict[str, Any] | None = None
            for line in self.stats_path.read_text().splitlines():
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue  # a line being written
                if msg.get("type") == "stats":
                    stats = msg["stats"]
            if stats is not None:
                out = {"upstream": stats["upstream"], "downstream": stats["downstream"]}
                out.update({"drop:" + k: v for k, v in stats["drops"].items()})
            return out
        with urllib.request.urlopen(self.url + "/healthz", timeout=1) as resp:
            if resp.status != 200:
                return out
        with urllib.request.urlopen(self.url + "/metrics", timeout=2) as resp:
            metrics = parse_text(resp.read().decode())
        for (name, labels), value in metrics.items():
            tags = dict(labels)
            if name == "firsthop_relay_packets_total":
                out[tags["direction"]] = value
            elif name == "firsthop_relay_drops_total":
                out["drop:" + tags["reason"]] = value
            elif name == "firsthop_relay_worker_restarts_total":
                out["worker_restarts"] = value
        return out

    def stop(self) -> None:
        stop_process(self.proc)


# -- one phase -------------------------------------------------------------------------------


def binding_requests(key: bytes, dest: Address, flows: int) -> bytes:
    """One Binding request per flow whose token names `dest`, as the generator reads them."""
    out = bytearray()
    now = int(time.time())
    for i in range(flows):
        token = encode_route_token(
            key_id=1,
            key=key,
            cluster=1,
            host=dest[0],
            port=dest[1],
            issued_at=now,
            nonce=os.urandom(3),
        )
        req = chrome_like_binding_request(token, f"ld{i:04x}", "x" * 24)
        out += len(req).to_bytes(2, "big") + req
    return bytes(out)


class Bench:
    """Sink, C forwarder and relay for a whole run; `measure` runs one phase."""

    def __init__(
        self,
        stack: ExitStack,
        workdir: Path,
        log: IO[bytes],
        *,
        flows: int,
        seconds: float,
        tick_us: int,
        supervised: bool,
        datapath: str = "auto",
    ) -> None:
        self.workdir, self.log = workdir, log
        self.flows, self.seconds, self.tick_us = flows, seconds, tick_us
        cpus = sorted(os.sched_getaffinity(0))
        # Forwarders on one core, generator and sink on another; with one core, no pinning.
        self.fwd_cpu: int | None = cpus[0] if len(cpus) >= 2 else None
        self.load_cpu: int | None = cpus[-1] if len(cpus) >= 2 else None
        self.exe = str(build_tools(workdir))
        self.key = os.urandom(32)
        self.sink = self._start("sink", "sink", HOST, self._cpu(self.load_cpu), stack=stack)
        self.sink_addr = (HOST, int(self.sink.line(10).split()[1]))
        fwd_args = ("fwd", HOST, self._cpu(self.fwd_cpu), *map(str, self.sink_addr))
        self.fwd = self._start("C forwarder", *fwd_args, stack=stack)
        self.fwd_addr = (HOST, int(self.fwd.line(10).split()[1]))
        py_args = [sys.executable, "-m", "firsthop.services.bench.py_forwarder", *fwd_args[1:]]
        self.py = LineTool("Python forwarder", py_args, log)
        stack.callback(self.py.stop)
        self.py_addr = (HOST, int(self.py.line(30).split()[1]))
        self.relay = Relay(
            self.key, self.fwd_cpu, log, workdir, supervised=supervised, datapath=datapath
        )
        stack.callback(self.relay.stop)
        self._phases = 0

    @staticmethod
    def _cpu(cpu: int | None) -> str:
        return str(-1 if cpu is None else cpu)

    def _start(self, name: str, *args: str, stack: ExitStack | None = None) -> LineTool:
        child = LineTool(name, [self.exe, *args], self.log)
        if stack is not None:
            stack.callback(child.stop)
        return child

    def measure(self, target: str, phase: str, rate: float, rnd: int) -> Row:
        pids: dict[str, int] = {}
        if target == "direct":
            dest, frame, port = self.sink_addr, 1, 0
        elif target == "c":
            dest, frame, port = self.fwd_addr, 0, self.fwd_addr[1]
            pids = {"forwarder": self.fwd.pid}
        elif target == "py":
            dest, frame, port = self.py_addr, 0, self.py_addr[1]
            pids = {"forwarder": self.py.pid}
        else:
            dest, frame, port = self.relay.listen, 0, self.relay.listen[1]
            worker = self.relay.current_worker()
            if worker is None:
                raise BenchError("the relay worker is gone")
            if worker != self.relay.worker:  # restarted since the last phase
                self.relay.worker = worker
                self.relay.pin_worker()
            pids = self.relay.pids()
        self._phases += 1
        requests = self.workdir / f"requests-{self._phases}.bin"
        requests.write_bytes(binding_requests(self.key, self.sink_addr, self.flows))
        gen = self._start(
            "load generator",
            *("load", SRC_NET, self._cpu(self.load_cpu), *map(str, dest), str(requests)),
            *(str(rate), str(self.seconds), str(self.tick_us), str(frame)),
        )
        load_pids = {"generator": gen.pid, "sink": self.sink.pid}
        before: dict[str, float] = {}
        after: dict[str, float] = {}
        try:
            ready = gen.line(timeout=30)
            if not ready.startswith("ready"):
                raise BenchError(f"load generator toward {target}: {ready}")
            if target == "relay":
                time.sleep(COUNTERS_LAG)  # so that the handshakes are in `before`
                before = self.relay.counters()
            self.sink.ask("reset")
            drops0 = (udp_drops(port), udp_drops(self.sink_addr[1]))
            cpu0, load0 = cpu_sample(pids), cpu_sample(load_pids)
            gen.send("go")
            sent = json.loads(gen.line(timeout=self.seconds + 30))
            time.sleep(DRAIN)
            cpu1, load1 = cpu_sample(pids), cpu_sample(load_pids)
            got = json.loads(self.sink.ask("report"))
            drops1 = (udp_drops(port), udp_drops(self.sink_addr[1]))
            if target == "relay":
                time.sleep(COUNTERS_LAG - DRAIN)
                after = self.relay.counters()
        finally:
            gen.stop()
        restarted = target == "relay" and (
            cpu0 is None
            or cpu1 is None
            or self.relay.current_worker() != pids["worker"]
            or after.get("worker_restarts", 0.0) > before.get("worker_restarts", 0.0)
        )
        cpu_s: dict[str, float] = {}
        waits: dict[str, float] = {}
        user = system = 0
        if cpu0 is not None and cpu1 is not None and not restarted:
            cpu_s = {n: (cpu1[n][0] - cpu0[n][0]) / 1e9 for n in pids}
            waits = {n: (cpu1[n][1] - cpu0[n][1]) / 1e6 for n in pids}
            user = sum(cpu1[n][2] - cpu0[n][2] for n in pids)
            system = sum(cpu1[n][3] - cpu0[n][3] for n in pids)
        if load0 is not None and load1 is not None:
            waits.update({n: (load1[n][1] - load0[n][1]) / 1e6 for n in load_pids})
        received, n_sent, duration = got["rtp"], sent["sent"], sent["duration_s"]
        row: Row = {
            "phase": phase,
            "target": target,
            "round": rnd,
            "offered_pps": rate,
            "sent": n_sent,
            "sent_pps": round(n_sent / duration, 1),
            "received": received,
            "achieved_pps": round(received / duration, 1),
            "loss_pct": round(100.0 * (n_sent - received) / n_sent, 4) if n_sent else 100.0,
            "reordered": got["reordered"],
            "cpu_s": cpu_s,
            "cpu_us_per_packet": (
                round(sum(cpu_s.values()) * 1e6 / received, 3) if cpu_s and received else None
            ),
            "cpu_user_pct": round(100.0 * user / (user + system), 1) if user + system else None,
            # runnable while another process had the CPU (-1: no schedstat): the noise
            # behind most loss and tail latency on a shared machine
            "runqueue_wait_ms": {k: round(v, 1) for k, v in waits.items()},
            "latency_us": got["latency_sock_us"],
            "app_latency_us": got["latency_app_us"],
            "kernel_rx_drops": {
                "forwarder": drops1[0] - drops0[0] if port else 0,
                "sink": drops1[1] - drops0[1],
            },
            "generator": {k: sent[k] for k in ("errors", "late_ticks", "max_burst", "handshake_s")},
        }
        if target == "relay":
            row["worker_restarted"] = restarted
            row["relay_counters"] = {
                k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)
            }
        return row


# -- the run and its report ------------------------------------------------------------------


def run(
    *,
    rate: float,
    seconds: float,
    flows: int,
    rounds: int,
    tick_us: int = 1000,
    supervised: bool = False,
    datapath: str = "auto",
) -> dict[str, Any]:
    rows: list[Row] = []
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="firsthop-bench-")))
        log_path = workdir / "stderr.log"
        log = stack.enter_context(open(log_path, "wb"))
        try:
            bench = Bench(
                stack,
                workdir,
                log,
                flows=flows,
                seconds=seconds,
                tick_us=tick_us,
                supervised=supervised,
                datapath=datapath,
            )
            for rnd in range(1, rounds + 1):
                for phase, share in PHASES:
                    for target in ("direct", *FORWARDERS) if rnd == 1 else FORWARDERS:
                        rows.append(bench.measure(target, phase, rate * share, rnd))
        except BenchError as exc:
            log.flush()
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
            raise BenchError(f"{exc}\n--- the processes' last stderr lines ---\n{tail}") from exc
        config = {
            "rate": rate,
            "seconds": seconds,
            "flows": flows,
            "rounds": rounds,
            "tick_us": tick_us,
            "payload_bytes": 160,
            "relay": "firsthop relay --workers 1" if supervised else "relay worker process",
            "datapath": datapath_in_use(datapath),
            "forwarder_cpu": bench.fwd_cpu,
            "load_cpu": bench.load_cpu,
            "cpu_source": "schedstat" if SCHEDSTAT else "stat_ticks",
        }
    return {"config": config, "rows": rows, "summary": summarize(rows, rate)}


def _median(rows: list[Row], key: str, sub: str | None = None) -> float | None:
    values = [r[key][sub] if sub else r[key] for r in rows]
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 1)


def summarize(rows: list[Row], rate: float) -> dict[str, Any]:
    """Medians over the rounds (phases with a worker restart left out), and the targets."""

    def pick(phase: str, target: str) -> list[Row]:
        return [
            r
            for r in rows
            if r["phase"] == phase and r["target"] == target and not r.get("worker_restarted")
        ]

    out: dict[str, Any] = {}
    for phase, _ in PHASES:
        c, relay, direct = pick(phase, "c"), pick(phase, "relay"), pick(phase, "direct")
        c_cpu = _median(c, "cpu_us_per_packet")
        r_cpu = _median(relay, "cpu_us_per_packet")
        py_cpu = _median(pick(phase, "py"), "cpu_us_per_packet")
        floor = _median(direct, "latency_us", "p99")
        r_p99, c_p99 = _median(relay, "latency_us", "p99"), _median(c, "latency_us", "p99")
        out[phase] = {
            "c_cpu_us_per_packet": c_cpu,
            "relay_cpu_us_per_packet": r_cpu,
            "cpu_ratio": round(r_cpu / c_cpu, 2) if r_cpu and c_cpu else None,
            # Python's floor: the C forwarder's job in Python, and the relay above it
            "py_cpu_us_per_packet": py_cpu,
            "py_cpu_ratio": round(py_cpu / c_cpu, 2) if py_cpu and c_cpu else None,
            "relay_over_py_us": round(r_cpu - py_cpu, 3) if r_cpu and py_cpu else None,
            "relay_cpu_bound_pps": round(1e6 / r_cpu) if r_cpu else None,
            "c_cpu_bound_pps": round(1e6 / c_cpu) if c_cpu else None,
            "relay_achieved_pps": _median(relay, "achieved_pps"),
            "relay_loss_pct": _median(relay, "loss_pct"),
            "c_loss_pct": _median(c, "loss_pct"),
            "relay_added_p99_us": round(r_p99 - floor, 1) if r_p99 and floor else None,
            "c_added_p99_us": round(c_p99 - floor, 1) if c_p99 and floor else None,
        }
    big, half = out["max"], out["half"]
    ratio, added = big["cpu_ratio"], half["relay_added_p99_us"]
    achieved, loss = big["relay_achieved_pps"], big["relay_loss_pct"]
    out["targets"] = {
        "cpu_ratio": {
            "value": ratio,
            "target": TARGET_CPU_RATIO,
            "met": ratio is not None and ratio <= TARGET_CPU_RATIO,
        },
        "throughput": {
            "offered_pps": rate,
            "achieved_pps": achieved,
            "loss_pct": loss,
            "target_pps": TARGET_PPS,
            "target_loss_pct": TARGET_LOSS_PCT,
            "tested": rate >= TARGET_PPS,
            "met": rate >= TARGET_PPS
            and achieved is not None
            and loss is not None
            and achieved >= TARGET_PPS * (1 - TARGET_LOSS_PCT / 100)
            and loss < TARGET_LOSS_PCT,
        },
        "latency": {
            "added_p99_us": added,
            "at_pps": rate / 2,
            "target_us": TARGET_ADDED_P99_US,
            "met": added is not None and added <= TARGET_ADDED_P99_US,
        },
    }
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def render(result: dict[str, Any]) -> str:
    cfg, summary = result["config"], result["summary"]
    pinning = (
        f"relay and forwarders on cpu {cfg['forwarder_cpu']}, generator and sink on cpu "
        f"{cfg['load_cpu']}"
        if cfg["forwarder_cpu"] is not None
        else "not pinned (one CPU)"
    )
    lines = [
        f"firsthop bench relay: {cfg['relay']} ({cfg['datapath']} data path), "
        f"{cfg['flows']} flows, 160-byte packets, {cfg['seconds']} s per phase, "
        f"a burst every {cfg['tick_us']} us; {pinning}",
        "latency: sink socket's kernel rx timestamp - sender's stamp ('app' adds the sink's "
        "wake-up); wait: ms the forwarder was runnable while another process had its CPU",
        "",
        f"{'phase':<6}{'target':<8}{'rnd':>3}{'offered/s':>11}{'sent/s':>10}{'at sink/s':>11}"
        f"{'loss %':>9}{'cpu us/pkt':>11}{'x C':>6}{'p50 us':>9}{'p99 us':>10}{'app p99':>10}"
        f"{'wait ms':>9}",
    ]
    c_cpu: dict[tuple[str, int], float] = {}
    for r in result["rows"]:
        cost = r["cpu_us_per_packet"]
        if r["target"] == "c" and cost:
            c_cpu[(r["phase"], r["round"])] = cost
        ref = c_cpu.get((r["phase"], r["round"]))
        ratio = cost / ref if r["target"] in ("py", "relay") and ref and cost else None
        fwd_wait = [v for k, v in r["runqueue_wait_ms"].items() if k not in ("generator", "sink")]
        wait = sum(fwd_wait) if fwd_wait and min(fwd_wait) >= 0 else None
        lines.append(
            f"{r['phase']:<6}{r['target']:<8}{r['round']:>3}{r['offered_pps']:>11.0f}"
            f"{r['sent_pps']:>10.0f}{r['achieved_pps']:>11.0f}{r['loss_pct']:>9.3f}"
            f"{_fmt(cost, '.2f'):>11}{_fmt(ratio, '.2f'):>6}{r['latency_us']['p50']:>9.1f}"
            f"{r['latency_us']['p99']:>10.1f}{r['app_latency_us']['p99']:>10.1f}"
            f"{_fmt(wait, '.1f'):>9}"
            + ("  worker restarted: not counted" if r.get("worker_restarted") else "")
        )
    t, big = summary["targets"], summary["max"]

    def verdict(target: dict[str, Any]) -> str:
        if not target.get("tested", True):
            return "not tested at this rate"
        return "met" if target["met"] else "MISSED"

    cpu, tput, lat = t["cpu_ratio"], t["throughput"], t["latency"]
    lines += [
        "",
        "medians over the rounds:",
        f"  relay CPU per packet {_fmt(big['relay_cpu_us_per_packet'], '.2f')} us vs C "
        f"{_fmt(big['c_cpu_us_per_packet'], '.2f')} us = {_fmt(cpu['value'], '.2f')}x "
        f"(target <= {TARGET_CPU_RATIO}x): {verdict(cpu)}",
        f"  relay at {tput['offered_pps']:.0f}/s offered: {_fmt(tput['achieved_pps'], '.0f')}/s "
        f"at the sink, loss {_fmt(tput['loss_pct'], '.3f')} % (target >= {TARGET_PPS}/s at < "
        f"{TARGET_LOSS_PCT} %): {verdict(tput)}",
        f"  Python's floor (the C forwarder's job in Python, no flow table): "
        f"{_fmt(big['py_cpu_us_per_packet'], '.2f')} us = {_fmt(big['py_cpu_ratio'], '.2f')}x C; "
        f"the relay's own logic above it: {_fmt(big['relay_over_py_us'], '.2f')} us",
        f"  relay added latency p99 at {lat['at_pps']:.0f}/s: "
        f"{_fmt(lat['added_p99_us'], '.1f')} us over direct (target <= "
        f"{TARGET_ADDED_P99_US:.0f} us): {verdict(lat)}; over the C forwarder's p99 at full "
        f"rate: {_fmt(_minus(big['relay_added_p99_us'], big['c_added_p99_us']), '.1f')} us",
        f"  one core at these costs forwards at most: relay "
        f"{_fmt(big['relay_cpu_bound_pps'], ',')}/s, C {_fmt(big['c_cpu_bound_pps'], ',')}/s",
    ]
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    chosen = settings(args, QUICK if args.quick else DEFAULTS)
    return report(
        "relay",
        args,
        lambda: run(
            rate=float(chosen["rate"]),
            seconds=float(chosen["seconds"]),
            flows=int(chosen["flows"]),
            rounds=int(chosen["rounds"]),
            tick_us=args.tick_us,
            supervised=args.supervised,
            datapath=args.datapath,
        ),
        render,
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("relay", help="relay CPU/packet, rate, loss, latency vs a C forwarder")
    p.add_argument("--rate", type=float, help="offered packets/s of the full-rate phase")
    p.add_argument("--seconds", type=float, help="length of each phase")
    p.add_argument("--flows", type=int, help="client flows (one UDP socket each)")
    p.add_argument("--rounds", type=int, help="interleaved C/relay rounds")
    p.add_argument("--tick-us", type=int, default=1000, help="pacing: a burst every N µs")
    p.add_argument(
        "--supervised",
        action="store_true",
        help="run the whole `firsthop relay` (supervisor + worker), not its worker alone",
    )
    p.add_argument(
        "--datapath",
        default="auto",
        choices=DATAPATHS,
        help="the relay's --datapath (python: its loop without the C common cases)",
    )
    p.add_argument("--quick", action="store_true", help="a tiny run: 2000/s, 1 s, 8 flows, 1 round")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_main)
