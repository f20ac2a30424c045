"""`firsthop up` starts what exists, serves it, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from tests.support import free_tcp_port, free_udp_port


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    tree: dict[int, list[int]] = {}
    for line in out.splitlines():
        child, parent = map(int, line.split())
        tree.setdefault(parent, []).append(child)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def test_up_runs_the_stack_and_ctrl_c_stops_everything() -> None:
    metrics = free_tcp_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "services.cli",
            "up",
            "--relay-port",
            str(free_udp_port()),
            "--relay-metrics-port",
            str(metrics),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "FIRSTHOP_ROUTE_KEYS"},
    )
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if "firsthop is up" in line:
                break
        assert any("firsthop is up" in line for line in lines), lines
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/healthz", timeout=5) as r:
            assert r.status == 200
        children = _children(proc.pid)
        assert children  # redis, relay and its worker
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
        proc.stdout.close()
        alive = [
            p
            for p in children
            if os.path.exists(f"/proc/{p}")
            and "zombie" not in open(f"/proc/{p}/status").read().lower()
        ]
        assert alive == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
