"""Starting firsthop's own processes: the one launcher for `firsthop up`, benches and tests.

* `free_port(kind)`: a loopback port nobody holds right now (bind to 0, read it back, close;
  or the next free one of `FIRSTHOP_PORT_RANGE`, when set).
* the command builders (`relay_command`, `transceiver_command`, `agent_command`,
  `signaling_command`): the argv of a `firsthop` service on loopback, so every caller spells
  a service's flags the same way;
* `Spec`: what to run (argv, environment) and how to know it is ready: an HTTP URL that
  answers 200, a TCP port that accepts, or (`announces`) the service's own word — every
  service writes where it listens to the file named by FIRSTHOP_READY_FILE once it serves
  (`shared.lifecycle.announce`), so it can be given port 0 and read back;
* `Child`: a process started from a `Spec` in the background (blocking calls, for tests and
  benches): `start()` returns once it is ready (with `bound`, what it announced), `stop()`
  asks it to end (SIGTERM) within a grace, `kill()` ends it now. `firsthop up` runs the same
  specs under Trio (`up.py`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO

from firsthop.shared.address import Address, parse_hostport
from firsthop.shared.lifecycle import READY_FILE_ENV

HOST = "127.0.0.1"
FIRSTHOP = (sys.executable, "-m", "firsthop.services.cli")


PORT_RANGE_ENV = "FIRSTHOP_PORT_RANGE"  # LOW-HIGH: where `free_port` picks (else: the kernel)
_turn: int | None = None  # this process's next offset into the range


def free_port(kind: int = socket.SOCK_DGRAM, host: str = HOST) -> int:
    """A port of `kind` nobody holds on `host` right now, for a service started next to bind.

    The kernel's choice (bind to port 0), unless `FIRSTHOP_PORT_RANGE=LOW-HIGH` is set: then
    the range's ports in turn, from a random start, the first that binds. A range outside the
    kernel's ephemeral one (`net.ipv4.ip_local_port_range`) closes the window between the
    pick and the service's bind: no connection's or bind-to-0's port can land there, and
    processes given ranges of their own never pick each other's (the test processes each
    have one: tests/conftest.py)."""
    span = os.environ.get(PORT_RANGE_ENV)
    if not span:
        with socket.socket(socket.AF_INET, kind) as s:
            s.bind((host, 0))
            return int(s.getsockname()[1])
    global _turn
    try:
        low, high = (int(end) for end in span.split("-"))
    except ValueError:
        raise ValueError(f"{PORT_RANGE_ENV} must be LOW-HIGH, got {span!r}") from None
    if not 0 < low <= high < 65536:
        raise ValueError(f"{PORT_RANGE_ENV} must be LOW-HIGH within 1-65535, got {span!r}")
    size = high - low + 1
    if _turn is None:
        _turn = int.from_bytes(os.urandom(4), "big") % size
    for _ in range(size):
        port = low + _turn % size
        _turn += 1
        with socket.socket(socket.AF_INET, kind) as s:
            try:
                s.bind((host, port))
            except OSError:
                continue  # held (or a TCP port's connections still linger)
            return port
    raise OSError(f"no free port in {PORT_RANGE_ENV}={span}")


def _flag(name: str, value: object | None) -> list[str]:
    return [] if value is None else [name, str(value)]


def relay_command(
    *,
    listen: int,
    internal: int,
    metrics: int,
    cluster: int = 1,
    workers: int = 1,
    redis: str | None = None,
    extra: Iterable[str] = (),
    listen_host: str = HOST,
) -> list[str]:
    return [
        *FIRSTHOP,
        "relay",
        *("--listen", f"{listen_host}:{listen}"),
        *("--internal", f"{HOST}:{internal}"),
        *("--metrics", f"{HOST}:{metrics}"),
        *("--cluster", str(cluster)),
        *("--workers", str(workers)),
        *("--allow-dest", "127.0.0.0/8"),
        *_flag("--redis", redis),
        *extra,
    ]


def transceiver_command(
    *,
    media: int,
    api: int,
    tx_id: str | None = None,
    agent_url: str | None = None,
    redis: str | None = None,
    extra: Iterable[str] = (),
) -> list[str]:
    return [
        *FIRSTHOP,
        "transceiver",
        *("--media", f"{HOST}:{media}"),
        *("--api", f"{HOST}:{api}"),
        *_flag("--id", tx_id),
        *_flag("--agent-url", agent_url),
        *_flag("--redis", redis),
        *extra,
    ]


def agent_command(kind: str, port: int, extra: Iterable[str] = ()) -> list[str]:
    return [*FIRSTHOP, "agent", "--kind", kind, "--listen", f"{HOST}:{port}", *extra]


def redis_command(port: int) -> list[str]:
    """A throwaway redis-server on loopback: nothing persisted (`firsthop up`, tests)."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise RuntimeError("redis-server not found: install it (apt-get install redis-server)")
    return [
        exe,
        *("--port", str(port)),
        *("--bind", HOST),
        *("--save", ""),
        *("--appendonly", "no"),
        *("--protected-mode", "no"),
    ]


def signaling_command(*, port: int, extra: Iterable[str] = ()) -> list[str]:
    return [*FIRSTHOP, "signaling", "--listen", f"{HOST}:{port}", *extra]


@dataclass
class Spec:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # on top of this process's own
    ready_http: str | None = None  # ready once this URL answers 200
    ready_tcp: int | None = None  # ready once this loopback port accepts
    announces: bool = False  # ready once it has said where it listens (FIRSTHOP_READY_FILE)


def ready(spec: Spec) -> bool:
    """Whether `spec`'s service answers now (one try)."""
    if spec.announces:
        path = spec.env.get(READY_FILE_ENV)
        return path is not None and os.path.exists(path)
    try:
        if spec.ready_http is not None:
            with urllib.request.urlopen(spec.ready_http, timeout=1) as resp:
                return bool(resp.status == 200)
        if spec.ready_tcp is not None:
            with socket.create_connection((HOST, spec.ready_tcp), timeout=0.5):
                return True
    except OSError:
        return False
    return True


class Child:
    """One background process from a `Spec`."""

    def __init__(self, spec: Spec, *, quiet: bool = False, cwd: str | None = None) -> None:
        self.spec = spec
        self.quiet = quiet
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.bound: dict[str, Address] = {}  # what it announced it listens on

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 20.0) -> Child:
        ready_file = None
        if self.spec.announces:
            ready_file = os.path.join(tempfile.mkdtemp(prefix="firsthop-"), "ready.json")
            self.spec.env[READY_FILE_ENV] = ready_file
        # Quiet: its output is kept aside, and its tail told if it does not come up.
        self._close_log()  # (a restart's previous one)
        self._log = tempfile.TemporaryFile() if self.quiet else None
        self.proc = subprocess.Popen(
            self.spec.argv,
            env={**os.environ, **self.spec.env},
            cwd=self.cwd,
            stdout=subprocess.DEVNULL if self.quiet else None,
            stderr=self._log,
        )
        deadline = time.monotonic() + timeout
        while not ready(self.spec):
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"{self.spec.name} exited with {self.proc.returncode}{self._log_tail()}"
                )
            if time.monotonic() > deadline:
                tail = self._log_tail()
                self.kill()
                raise RuntimeError(f"{self.spec.name} was not ready within {timeout:.0f} s{tail}")
            time.sleep(0.05)
        self._log_tail()  # it is up: the file stays the child's alone
        if ready_file is not None:
            with open(ready_file) as f:
                self.bound = {k: parse_hostport(v) for k, v in json.load(f).items()}
            shutil.rmtree(os.path.dirname(ready_file), ignore_errors=True)
        return self

    def _log_tail(self, size: int = 2000) -> str:
        """The end of a quiet child's output so far, for an error; closes our copy."""
        log, self._log = self._log, None
        if log is None:
            return ""
        with log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - size))
            tail = log.read().decode(errors="replace").strip()
        return f"; its last words:\n{tail}" if tail else ""

    def stop(self, timeout: float = 10.0) -> float:
        """SIGTERM, then wait; returns how long it took to exit (kills it past `timeout`
        and raises `subprocess.TimeoutExpired`)."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        self._close_log()
        return time.monotonic() - t0

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close_log()

    def _close_log(self) -> None:
        # Closed once the child is gone: left to the garbage collector, the open file is a
        # ResourceWarning in whichever test happens to run then (an error under pytest).
        if self._log is not None:
            self._log.close()
            self._log = None
