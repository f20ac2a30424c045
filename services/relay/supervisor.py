"""`firsthop relay`: N worker processes on one SO_REUSEPORT address, plus /metrics.

Each worker is a process (`python -m firsthop.services.relay.worker INDEX`) so N of them use N cores
without sharing a GIL; the kernel spreads clients across them by 4-tuple hash. The
supervisor replaces a worker that dies, adds up the workers' stats snapshots for `/metrics`,
and on SIGTERM passes the signal on and gives the workers until the 5 s deadline to stop
reading and flush their cache writes.

Failover: besides the N workers, one warm standby process (`worker --standby`) waits with
everything imported, Redis connected and a copy of the flow cache, bound to nothing (a bound
socket would take its share of the SO_REUSEPORT traffic). When a worker dies the supervisor
learns it at once (its stdout closes) and tells the standby `serve INDEX`: it binds within
milliseconds, where a cold start costs the 0.5 s restart delay and ~0.25 s of Python start.
The dead worker's clients then reach it (or, with N > 1, the kernel rehashes them over the
group meanwhile) and their flows come back from Redis on their first datagram, held while
asked, or from the standby's copy when Redis is down too; a new standby starts 1 s later.
With no standby ready (or a worker that never came up) the slot is cold-started after 0.5 s,
so a crash loop costs at most a process start per 0.5 s.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field, replace
from typing import Any

import trio

from firsthop.services.relay.config import RelayConfig
from firsthop.services.relay.dataplane import datapath_in_use
from firsthop.services.relay.stats import relay_metrics, sum_worker_stats
from firsthop.services.relay.tcp_ingress import tcp_listener
from firsthop.services.relay.worker import CONFIG_ENV, STANDBY_ARG, udp_socket
from firsthop.shared.address import Address, format_hostport
from firsthop.shared.claim import AddressInUse, claim, lock
from firsthop.shared.http import serve_simple
from firsthop.shared.lifecycle import announce
from firsthop.shared.metrics import CONTENT_TYPE

log = logging.getLogger("firsthop.relay")

CLAIM_SETTLE = 2.0  # seconds for a dead relay's workers to let go of its addresses
STOP_DEADLINE = 4.5  # seconds from SIGTERM to SIGKILL; the relay exits within 5 s
RESTART_DELAY = 0.5  # before a cold start (a worker that failed to start, or no standby)
STANDBY_RESPAWN = 1.0  # a standby starts this long after the workers are ready, or after a
# takeover (the new worker has the CPU to itself while its clients come back)


async def _first(*events: trio.Event) -> None:
    """Return once any of `events` is set."""
    async with trio.open_nursery() as nursery:
        for event in events:

            async def wait(event: trio.Event = event) -> None:
                await event.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(wait)


@dataclass(eq=False)
class Spawned:
    """One worker process: serving `slot`, or the warm standby (`slot` None, until claimed)."""

    proc: trio.Process
    slot: WorkerProcess | None = None
    standing_by: trio.Event = field(default_factory=trio.Event)  # it said it waits, warm
    claimed: trio.Event = field(default_factory=trio.Event)
    ready: trio.Event = field(default_factory=trio.Event)  # it serves (bound)
    exited: trio.Event = field(default_factory=trio.Event)
    flows: int = 0  # the standby's copy of the flow cache, flows
    copied_at: float | None = None  # and when it was taken (trio clock)

    async def tell(self, line: str) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.send_all(line.encode() + b"\n")


class Processes:
    """Starts the worker processes and watches each until it exits (stopping it, bounded,
    when the relay stops); keeps one warm standby (`keep_standby`) for a dead worker's slot."""

    def __init__(self, config: RelayConfig, nursery: trio.Nursery) -> None:
        self.env = dict(os.environ)
        self.env[CONFIG_ENV] = config.to_json()
        self.standby: Spawned | None = None
        self._nursery = nursery

    async def spawn(self, arg: str, slot: WorkerProcess | None) -> Spawned:
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-m", "firsthop.services.relay.worker", arg],
            env=self.env,
            stdin=subprocess.PIPE,  # its control: "serve INDEX" (a standby); EOF: we died
            stdout=subprocess.PIPE,
        )
        spawned = Spawned(proc, slot)
        self._nursery.start_soon(self._watch, spawned)
        return spawned

    def claim(self, slot: WorkerProcess) -> Spawned | None:
        """The standby, now `slot`'s, if one is ready (the caller tells it to serve)."""
        spare = self.standby
        if spare is None or not spare.standing_by.is_set() or spare.exited.is_set():
            return None
        self.standby = None
        spare.slot = slot
        spare.claimed.set()
        return spare

    @property
    def standby_flows(self) -> int:
        spare = self.standby
        return spare.flows if spare is not None and spare.standing_by.is_set() else 0

    @property
    def standby_copy_age(self) -> float:
        """Seconds since the standby's copy of the flow cache was taken (-1: none)."""
        spare = self.standby
        if spare is None or spare.copied_at is None:
            return -1.0
        return trio.current_time() - spare.copied_at

    @property
    def standby_ready(self) -> int:
        spare = self.standby
        return int(spare is not None and spare.standing_by.is_set() and not spare.exited.is_set())

    async def keep_standby(self) -> None:
        await trio.sleep(STANDBY_RESPAWN)  # the workers' clients come back first
        while True:
            spare = await self.spawn(STANDBY_ARG, None)
            self.standby = spare
            await _first(spare.claimed, spare.exited)
            if spare.claimed.is_set():
                await trio.sleep(STANDBY_RESPAWN)
                continue
            if self.standby is spare:
                self.standby = None
            code = spare.proc.returncode
            log.error("relay standby worker exited with %s; starting another", code)
            await trio.sleep(RESTART_DELAY)

    async def _watch(self, spawned: Spawned) -> None:
        try:
            await self._read(spawned)
            await spawned.proc.wait()
        finally:
            with trio.CancelScope(shield=True):
                await _stop(spawned)
            spawned.exited.set()

    async def _read(self, spawned: Spawned) -> None:
        stdout = spawned.proc.stdout
        assert stdout is not None
        buffered = b""
        async for chunk in stdout:
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                kind, slot = msg.get("type"), spawned.slot
                if kind == "standby":
                    spawned.flows = int(msg.get("flows", 0))
                    if msg.get("age") is not None:
                        spawned.copied_at = trio.current_time() - float(msg["age"])
                    spawned.standing_by.set()
                elif kind == "ready":
                    if slot is not None:
                        slot.ready = msg
                    spawned.ready.set()
                elif kind == "stats" and slot is not None:
                    slot.stats = msg["stats"]


async def _stop(spawned: Spawned) -> None:
    proc = spawned.proc
    if proc.returncode is not None:
        return
    proc.send_signal(signal.SIGTERM)
    with trio.move_on_after(STOP_DEADLINE):
        await proc.wait()
    if proc.returncode is None:
        log.warning("relay worker %s did not stop in time; killing it", proc.pid)
        proc.kill()
        await proc.wait()


@dataclass
class WorkerProcess:
    """Slot `index` of the relay: one serving process at a time, replaced when it dies (by
    the warm standby when there is one ready, else by a cold start)."""

    config: RelayConfig
    index: int
    ready: dict[str, Any] | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    restarts: int = 0
    takeovers: int = 0

    async def run(
        self, processes: Processes, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run the slot, replacing its worker when it dies; `started` once first ready."""
        first = True
        spawned: Spawned | None = None
        while True:
            # The standby takes over at once from a worker that served; a worker that never
            # came up (and a slot with no standby ready) waits RESTART_DELAY, then a cold start.
            if spawned is not None and spawned.ready.is_set():
                spawned = processes.claim(self)
            else:
                spawned = None
            if spawned is not None:
                self.takeovers += 1
                try:
                    await spawned.tell(f"serve {self.index}")
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    spawned.proc.kill()  # it is dying anyway; waited for below
            else:
                if self.restarts:
                    await trio.sleep(RESTART_DELAY)
                spawned = await processes.spawn(str(self.index), self)
            await _first(spawned.ready, spawned.exited)
            if spawned.ready.is_set():
                if first:
                    first = False
                    task_status.started()
                await spawned.exited.wait()
            self.ready = None
            log.error("relay worker %d exited with %s", self.index, spawned.proc.returncode)
            self.restarts += 1


@dataclass
class RelayHandle:
    workers: list[WorkerProcess]
    metrics: Address
    processes: Processes | None = None

    def totals(self) -> dict[str, Any]:
        result = sum_worker_stats(w.stats for w in self.workers)
        result["workers_ready"] = sum(1 for w in self.workers if w.ready)
        result["worker_restarts"] = sum(w.restarts for w in self.workers)
        result["takeovers"] = sum(w.takeovers for w in self.workers)
        processes = self.processes
        result["standby_ready"] = processes.standby_ready if processes else 0
        result["standby_flows"] = processes.standby_flows if processes else 0
        result["standby_copy_age"] = processes.standby_copy_age if processes else -1.0
        return result


async def serve_relay(
    config: RelayConfig,
    *,
    task_status: trio.TaskStatus[RelayHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    # Every address it serves is this relay's alone (`shared.claim`): its workers' SO_REUSEPORT
    # group must not take in another process, nor join another's. Claimed before anything
    # starts; held until the relay ends. (A port 0 is chosen below: it is nobody else's.)
    claims = await claim_addresses(config)
    try:
        await _serve_relay(config, claims, task_status=task_status)
    finally:
        for lock in claims:
            lock.close()


async def claim_addresses(config: RelayConfig) -> list[socket.socket]:
    """Claim the relay's listen addresses (`AddressInUse` names the first one taken). One
    held by a process that did not claim it may be a relay's worker still exiting after its
    supervisor was killed (it leaves at its stdin's EOF): that gets `CLAIM_SETTLE` seconds."""
    wanted: list[tuple[str, Address]] = [("udp", a) for a in config.listens]
    wanted += [("udp", config.internal)]
    wanted += [("tcp", a) for a in config.listens_tcp]
    wanted += [("tcp", config.metrics)]
    claims: list[socket.socket] = []
    try:
        for kind, addr in wanted:
            if addr[1] == 0:
                continue
            deadline = trio.current_time() + CLAIM_SETTLE
            while True:
                try:
                    claims.append(claim(kind, addr))
                    break
                except AddressInUse as exc:
                    if exc.by_firsthop or trio.current_time() >= deadline:
                        raise
                await trio.sleep(0.05)
    except BaseException:
        for lock in claims:
            lock.close()
        raise
    return claims


async def _serve_relay(
    config: RelayConfig,
    claims: list[socket.socket],
    *,
    task_status: trio.TaskStatus[RelayHandle],
) -> None:
    # A port 0 for the public or peer socket is chosen here, once, and held by a probe
    # socket in the SO_REUSEPORT group until every worker has bound the same port; it is
    # claimed then (the lock alone: no one else holds it).
    probes = []
    for name in ("listen", "listen_other"):
        addr = getattr(config, name)
        if addr is not None and addr[1] == 0:
            probes.append(udp_socket(addr, reuseport=True))
            bound: Any = (addr[0], probes[-1].getsockname()[1])
            config = replace(config, **{name: bound})
            claims.append(lock("udp", bound))
    if config.internal[1] == 0:
        probes.append(udp_socket(config.internal, reuseport=True))
        config = replace(config, internal=(config.internal[0], probes[-1].getsockname()[1]))
        claims.append(lock("udp", config.internal))
    tcp_probes = []
    for name in ("listen_tcp", "listen_tcp_other"):
        addr = getattr(config, name)
        if addr is not None and addr[1] == 0:
            tcp_probes.append(tcp_listener(addr, reuseport=True, listen=False))
            bound = (addr[0], tcp_probes[-1].getsockname()[1])
            config = replace(config, **{name: bound})
            claims.append(lock("tcp", bound))
    workers = [WorkerProcess(config, i) for i in range(config.workers)]
    processes: Processes | None = None

    async def http(method: str, path: str) -> tuple[int, str, bytes]:
        handle_totals = RelayHandle(workers, config.metrics, processes).totals()
        if path == "/metrics":
            return 200, CONTENT_TYPE, relay_metrics(handle_totals, len(workers)).encode()
        if path == "/healthz":
            ok = handle_totals["workers_ready"] == len(workers)
            spare = processes.standby if processes is not None else None
            body = json.dumps(
                {
                    "ok": ok,
                    "workers_ready": handle_totals["workers_ready"],
                    "worker_pids": [w.ready["pid"] if w.ready else None for w in workers],
                    "standby_pid": spare.proc.pid if spare is not None else None,
                }
            )
            return (200 if ok else 503), "application/json", body.encode()
        return 404, "text/plain", b"not found\n"

    async with trio.open_nursery() as nursery:
        processes = Processes(config, nursery)
        try:  # all at once: a restarted relay serves after one worker's start, not N
            async with trio.open_nursery() as starting:
                for worker in workers:
                    starting.start_soon(nursery.start, worker.run, processes)
        finally:
            for probe in probes:
                probe.close()
            for tcp_probe in tcp_probes:
                tcp_probe.close()
        metrics = await nursery.start(serve_simple, http, config.metrics)
        log.info(
            "relay cluster %d ready: %d worker(s) on %s, internal %s, metrics %s, data path %s",
            config.cluster,
            len(workers),
            ", ".join(
                [f"{format_hostport(a)} UDP" for a in config.listens]
                + [f"{format_hostport(a)} TCP (ICE-TCP)" for a in config.listens_tcp]
            ),
            format_hostport(config.internal),
            format_hostport(metrics),
            datapath_in_use(config.datapath),
        )
        more = {
            name: getattr(config, name)
            for name in ("listen_tcp", "listen_other", "listen_tcp_other")
            if getattr(config, name) is not None
        }
        announce(listen=config.listen, internal=config.internal, metrics=metrics, **more)
        if config.standby:  # once the workers serve: it must not slow the relay's start
            nursery.start_soon(processes.keep_standby)
        task_status.started(RelayHandle(workers, metrics, processes))
