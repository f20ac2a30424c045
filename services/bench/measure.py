"""Measuring processes for the benchmarks (Linux): CPU time, children, UDP drops, pinning;
and the tools the benchmarks start and speak to in lines.

CPU is every thread's run time from /proc/PID/task/*/schedstat (ns), with the time it spent
runnable while another process held its CPU (the noise of a shared machine); where schedstat
is off, utime+stime ticks from /proc/PID/stat and no wait (-1).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any


def settings(args: argparse.Namespace, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """A bench's settings: `defaults` (the quick ones with --quick), then what was given."""
    return {k: v if getattr(args, k) is None else getattr(args, k) for k, v in defaults.items()}


def report(
    name: str,
    args: argparse.Namespace,
    measure: Callable[[], dict[str, Any]],
    render: Callable[[dict[str, Any]], str],
) -> int:
    """Run a bench and print its result (JSON with --json); exit code 1 with the reason
    when it could not run."""
    try:
        result = measure()
    except (BenchError, ValueError, RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"firsthop bench {name}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


class BenchError(Exception):
    pass


def stop_process(proc: subprocess.Popen[bytes], grace: float = 6.0) -> None:
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            try:
                pipe.close()
            except BrokenPipeError:
                pass
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class LineTool:
    """A C tool the bench started, spoken to in lines on stdin/stdout (it pins itself)."""

    def __init__(self, name: str, argv: list[str], log: IO[bytes]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log
        )
        self.pid = self.proc.pid
        self._buf = b""

    def line(self, timeout: float) -> str:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"{self.name}: no answer within {timeout:.0f} s")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise BenchError(f"{self.name} exited with {self.proc.wait()}")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        return line.decode()

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(text.encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError as exc:
            raise BenchError(f"{self.name} exited with {self.proc.wait()}") from exc

    def ask(self, text: str, timeout: float = 10.0) -> str:
        self.send(text)
        return self.line(timeout)

    def stop(self) -> None:
        stop_process(self.proc)


# -- /proc ---------------------------------------------------------------------------------


def _schedstat_works() -> bool:
    try:
        return int(Path("/proc/self/schedstat").read_text().split()[0]) > 0
    except (OSError, ValueError, IndexError):
        return False


SCHEDSTAT = _schedstat_works()
TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


def stat_fields(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text[text.rindex(")") + 2 :].split()  # from field 3 (state) on: ppid is [1]


def sched_ns(pid: int) -> tuple[int, int]:
    """(CPU time, time runnable but waiting for a CPU) of process `pid` so far, summed over
    its live threads, in ns. Without schedstat: utime+stime in ticks, and no wait (-1)."""
    if not SCHEDSTAT:
        fields = stat_fields(pid)
        return int((int(fields[11]) + int(fields[12])) * TICK_NS), -1
    run = wait = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()
        except OSError:
            continue  # a thread that ended meanwhile
        run += int(fields[0])
        wait += int(fields[1])
    return run, wait


def cpu_sample(pids: dict[str, int]) -> dict[str, tuple[int, int, int, int]] | None:
    """(run ns, wait ns, user ticks, system ticks) per named process; None if one is gone."""
    try:
        out = {}
        for name, pid in pids.items():
            fields = stat_fields(pid)
            out[name] = (*sched_ns(pid), int(fields[11]), int(fields[12]))
        return out
    except OSError:
        return None


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if int(stat_fields(int(entry))[1]) == pid:
                    out.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return out


def udp_drops(port: int) -> int:
    """Datagrams the kernel dropped at UDP sockets on `port` (receive buffer full)."""
    total = 0
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        parts = line.split()
        if len(parts) > 12 and int(parts[1].rpartition(":")[2], 16) == port:
            total += int(parts[-1])
    return total


def pin(pid: int, cpu: int | None) -> None:
    if cpu is not None:
        try:
            os.sched_setaffinity(pid, {cpu})
        except OSError:
            pass  # the report says what was asked; a lost pin only adds noise


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, in seconds."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) * TICK_NS / 1e9
