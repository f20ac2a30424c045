"""Start the real services on free loopback ports for benchmarks (and the tests that run them)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field

from shared.wire.route_token import format_route_keys


def free_port(kind: int = socket.SOCK_DGRAM) -> int:
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=0.5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer")


def wait_tcp(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"nothing listening on {port}")


@dataclass
class Stack:
    """relay + echo agent + transceiver (and optionally the stock aiortc reference)."""

    quiet: bool = True
    keys: str = field(default_factory=lambda: format_route_keys({1: os.urandom(32)}))
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    relay_port: int = 0
    tx_media: int = 0
    tx_api: int = 0
    agent_port: int = 0
    stock_port: int = 0

    def _spawn(self, args: list[str]) -> subprocess.Popen[bytes]:
        env = {
            **os.environ,
            "FIRSTHOP_ROUTE_KEYS": self.keys,
            "FIRSTHOP_LOG_LEVEL": os.environ.get("FIRSTHOP_LOG_LEVEL", "WARNING"),
        }
        out = subprocess.DEVNULL if self.quiet else None
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=out)
        self.procs.append(proc)
        return proc

    def start(self, *, stock: bool = False, tx_args: tuple[str, ...] = ()) -> Stack:
        me = [sys.executable, "-m", "services.cli"]
        self.relay_port, metrics = free_port(), free_port(socket.SOCK_STREAM)
        relay = self._spawn(
            me
            + [
                "relay",
                "--listen",
                f"127.0.0.1:{self.relay_port}",
                "--internal",
                f"127.0.0.1:{free_port()}",
                "--metrics",
                f"127.0.0.1:{metrics}",
                "--workers",
                "1",
                "--allow-dest",
                "127.0.0.0/8",
            ]
        )
        self.agent_port = free_port(socket.SOCK_STREAM)
        self._spawn(me + ["agent", "--kind", "echo", "--listen", f"127.0.0.1:{self.agent_port}"])
        self.tx_media, self.tx_api = free_port(), free_port(socket.SOCK_STREAM)
        tx = self._spawn(
            me
            + [
                "transceiver",
                "--media",
                f"127.0.0.1:{self.tx_media}",
                "--api",
                f"127.0.0.1:{self.tx_api}",
                "--agent-url",
                f"ws://127.0.0.1:{self.agent_port}",
                "--capacity",
                "1000",
                *tx_args,
            ]
        )
        wait_http(f"http://127.0.0.1:{metrics}/healthz", relay)
        wait_http(f"http://127.0.0.1:{self.tx_api}/healthz", tx)
        wait_tcp(self.agent_port)
        if stock:
            self.stock_port = free_port(socket.SOCK_STREAM)
            self._spawn([sys.executable, "-m", "services.bench.stock", str(self.stock_port)])
            wait_tcp(self.stock_port)
        return self

    @property
    def tx_pid(self) -> int:
        return self.procs[2].pid

    @property
    def stock_pid(self) -> int:
        return self.procs[3].pid

    def offer_to_firsthop(self, offer: str, *, direct: bool = False) -> str:
        ingress = f"127.0.0.1:{self.tx_media if direct else self.relay_port}"
        body = json.dumps(
            {"call_id": f"bench-{time.monotonic_ns()}", "offer_sdp": offer, "ingress": [ingress]}
        ).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.tx_api}/internal/v1/sessions",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return str(json.loads(resp.read())["answer_sdp"])

    def offer_to_stock(self, offer: str) -> str:
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.stock_port}/offer",
            data=offer.encode(),
            method="POST",
            headers={"Content-Type": "application/sdp"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return str(resp.read().decode())

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(8)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks
