"""One relay worker: three sockets, a data-plane thread, and the Trio tasks around it.

Sockets: `public` (the region's ingress, SO_REUSEPORT so N workers share it and the kernel
keeps each client on one worker; a second one with a --listen of the other IP family; with
--listen-tcp also an ICE-TCP listener per family, SO_REUSEPORT too, whose connections the
data-plane thread serves, see `tcp_ingress.py`), `peer` (the
internal address peer relays send to, also SO_REUSEPORT) and `own` (this worker's private
internal socket: frames to transceivers and peer relays leave from it, so their replies
come back to the worker that holds the flow).

Trio owns the lifecycle: `serve_worker` binds, starts the data-plane thread, runs the cache
tasks, and on cancellation stops the thread, then flushes pending cache writes (bounded).
Run as `python -m firsthop.services.relay.worker INDEX` it is one process of `firsthop relay`,
reporting readiness and stats snapshots as JSON lines on stdout. Run with `--standby` it is
the relay's warm standby: imported, connected to Redis, holding a fresh copy of the flow
cache (`FlowSnapshot`), but bound to nothing until the supervisor writes `serve INDEX` on
its stdin when worker INDEX died; it then binds at once, so the dead worker's clients are
served again within milliseconds, their flows recovered from Redis on their first datagram
(or, when Redis is down too, from the copy).
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio
from opentelemetry.trace import SpanKind

from firsthop.services.relay.config import RelayConfig
from firsthop.services.relay.dataplane import (
    SOCKET_BUFFER,
    CacheAnswered,
    CacheFailed,
    DataPlane,
    LookupWanted,
    Pinned,
    Stored,
)
from firsthop.services.relay.flow_cache import CacheUnavailable, FlowCache, FlowSnapshot
from firsthop.services.relay.flow_table import FlowTable
from firsthop.services.relay.tcp_ingress import tcp_listener
from firsthop.services.relay.write_behind import WriteBehind
from firsthop.shared import memory
from firsthop.shared.address import Address, ip_family
from firsthop.shared.telemetry import (
    context_from_traceparent,
    setup_tracing,
    shutdown_tracing,
    tracer,
    tracing_enabled,
)
from firsthop.shared.wire.route_token import DestinationFilter

log = logging.getLogger("firsthop.relay")

FLUSH_ON_EXIT = 2.0  # seconds given to the last cache writes at shutdown
STATS_EVERY = 0.5
CONFIG_ENV = "FIRSTHOP_RELAY_WORKER_CONFIG"
STANDBY_ARG = "--standby"  # argv[1] of the warm standby worker (else: the slot's index)
TRACER = tracer("firsthop.relay")


def udp_socket(addr: Address, *, reuseport: bool) -> socket.socket:
    """A UDP socket bound to `addr`, IPv4 or IPv6 by its host. An IPv6 one is IPV6_V6ONLY:
    `[::]:3478` and `0.0.0.0:3478` are then two sockets side by side (one per --listen), and
    a v4 client is only ever seen as itself, never as a v4-mapped ::ffff:a.b.c.d."""
    v6 = ip_family(addr[0]) == 6
    sock = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
    try:
        if v6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        for opt, force in ((socket.SO_RCVBUF, 33), (socket.SO_SNDBUF, 32)):  # *BUFFORCE
            try:
                sock.setsockopt(socket.SOL_SOCKET, force, SOCKET_BUFFER)
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER)
        sock.bind(addr)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass
class WorkerHandle:
    index: int
    public: Address
    peer: Address
    own: Address
    dataplane: DataPlane
    cache: FlowCache | None
    tcp: Address | None = None
    public_other: Address | None = None
    tcp_other: Address | None = None
    snapshot: FlowSnapshot | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def stats(self) -> dict[str, Any]:
        snap = dict(self.dataplane.snapshot)
        cache = self.cache
        snap["redis_errors"] = cache.errors if cache else 0
        snap["redis_writes"] = cache.writes if cache else 0
        snap["redis_lookups"] = cache.lookups if cache else 0
        snap["redis_hits"] = cache.hits if cache else 0
        snap["redis_pending_writes"] = self.extra.get("pending_writes", 0)
        snap["redis_dropped_writes"] = self.extra.get("dropped_writes", 0)
        snap["snapshot_hits"] = self.snapshot.hits if self.snapshot else 0
        return snap


async def serve_worker(
    config: RelayConfig,
    index: int = 0,
    *,
    cache: FlowCache | None = None,
    snapshot: FlowSnapshot | None = None,
    task_status: trio.TaskStatus[WorkerHandle] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve until cancelled. A standby that takes over passes its `cache` (connected
    already) and its `snapshot` of the flow cache, which answers look-ups Redis cannot."""
    public = udp_socket(config.listen, reuseport=True)
    public_other = udp_socket(config.listen_other, reuseport=True) if config.listen_other else None
    peer = udp_socket(config.internal, reuseport=True)
    own = udp_socket((config.internal[0], 0), reuseport=False)
    tcp = [tcp_listener(addr, reuseport=True) for addr in config.listens_tcp]
    ingress_tcp = config.ingresses_tcp
    table = FlowTable(
        cluster=config.cluster,
        keys=config.keys,
        ingress=config.ingress,
        allow_dest=DestinationFilter(config.allow_dest),
        peers=config.peers,
        limits=config.limits,
        recovery=config.redis is not None,
        now=time.time(),
        ingress_tcp=ingress_tcp[0] if ingress_tcp else None,
        ingress_other=config.ingresses[1] if config.listen_other else None,
        ingress_tcp_other=ingress_tcp[1] if len(ingress_tcp) > 1 else None,
    )
    trio_token = trio.lowlevel.current_trio_token()
    wakeup = trio.Event()

    def _set() -> None:
        wakeup.set()

    def notify() -> None:  # from the data-plane thread
        try:
            trio_token.run_sync_soon(_set)
        except trio.RunFinishedError:
            pass

    cpu = None
    if config.pin_cpus:
        cpus = sorted(os.sched_getaffinity(0))
        cpu = cpus[index % len(cpus)]
    dp = DataPlane(
        table,
        public=public,
        own=own,
        peer=peer,
        notify=notify,
        cpu=cpu,
        tcp=tcp,
        public_other=public_other,
        datapath=config.datapath,
    )
    if cache is None and config.redis:
        cache = FlowCache(config.redis)
    handle = WorkerHandle(
        index=index,
        public=public.getsockname()[:2],
        peer=peer.getsockname()[:2],
        own=own.getsockname()[:2],
        dataplane=dp,
        cache=cache,
        tcp=tcp[0].getsockname()[:2] if tcp else None,
        public_other=public_other.getsockname()[:2] if public_other else None,
        tcp_other=tcp[1].getsockname()[:2] if len(tcp) > 1 else None,
        snapshot=snapshot,
    )
    dp.want_pins = cache is not None and tracing_enabled()
    pins_send, pins_recv = trio.open_memory_channel[Pinned](100)
    queued = WriteBehind()
    store_wanted = trio.Event()
    lookup_send, lookup_recv = trio.open_memory_channel[Address](10_000)

    async def dispatch() -> None:
        nonlocal wakeup, store_wanted
        while True:
            await wakeup.wait()
            wakeup = trio.Event()
            while dp.outbox:
                item = dp.outbox.popleft()
                if isinstance(item, Stored):
                    if cache is None:
                        continue
                    queued.add(item.entries)
                    store_wanted.set()
                elif isinstance(item, Pinned):
                    try:
                        pins_send.send_nowait(item)
                    except trio.WouldBlock:
                        pass  # spans are best effort; forwarding never waits for them
                elif isinstance(item, LookupWanted):
                    try:
                        lookup_send.send_nowait(item.client)
                    except trio.WouldBlock:
                        dp.send_command(CacheFailed(item.client))

    async def lookups() -> None:
        assert cache is not None
        async for first in lookup_recv:
            batch = [first]
            while len(batch) < 256:
                try:
                    batch.append(lookup_recv.receive_nowait())
                except trio.WouldBlock:
                    break
            try:
                tokens = await cache.lookup(batch)
            except CacheUnavailable:
                now = trio.current_time()
                for client in batch:
                    token = snapshot.get(client, now) if snapshot is not None else None
                    if token is None:
                        dp.send_command(CacheFailed(client))
                    else:  # Redis is down; the standby's copy of it knows this client
                        dp.send_command(CacheAnswered(client, token))
                continue
            for client, token in zip(batch, tokens, strict=True):
                dp.send_command(CacheAnswered(client, token))

    async def first_packet_spans() -> None:
        """One span per new flow, joined to its session's trace (§10), off the packet path."""
        assert cache is not None
        async for pinned in pins_recv:
            try:
                parents = await cache.trace_parents([token for _, token, *_ in pinned.flows])
            except CacheUnavailable:
                continue
            for (client, _, dest, via, created, established), parent in zip(
                pinned.flows, parents, strict=True
            ):
                # (Redis contents: whatever is there; a traceparent is 55 ASCII characters)
                text = parent.decode("ascii", "replace")[:128] if parent else None
                ctx = context_from_traceparent(text)
                span = TRACER.start_span(
                    "relay.flow",
                    context=ctx,
                    kind=SpanKind.SERVER,
                    start_time=int(created * 1e9),
                    attributes={
                        "firsthop.client": f"{client[0]}:{client[1]}",
                        "firsthop.destination": f"{dest[0]}:{dest[1]}",
                        "firsthop.cluster": config.cluster,
                        "firsthop.relay_worker": index,
                        "firsthop.hop": f"{via[0]}:{via[1]}" if via else "",
                    },
                )
                span.add_event("first_answer", timestamp=int(established * 1e9))
                span.end(end_time=int(established * 1e9))

    async def flush_writes() -> None:
        assert cache is not None
        batch = queued.take()
        try:
            await cache.store(batch)
        except CacheUnavailable:
            queued.failed(batch, trio.current_time())
        handle.extra["pending_writes"] = len(queued)
        handle.extra["dropped_writes"] = queued.dropped

    async def writes() -> None:
        nonlocal store_wanted
        assert cache is not None
        while True:
            await store_wanted.wait()
            store_wanted = trio.Event()
            retry_at = queued.next_attempt()
            if retry_at is not None:
                await trio.sleep_until(retry_at)  # after a failure: not before its retry
            if queued.due(trio.current_time()):
                await flush_writes()
            if len(queued):
                store_wanted.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(dispatch)
            if cache is not None:
                nursery.start_soon(lookups)
                nursery.start_soon(writes)
                if dp.want_pins:
                    nursery.start_soon(first_packet_spans)
            thread_done = trio.Event()

            async def run_thread() -> None:
                try:
                    await trio.to_thread.run_sync(dp.run, limiter=trio.CapacityLimiter(1))
                finally:
                    thread_done.set()

            nursery.start_soon(run_thread)
            task_status.started(handle)
            try:
                await thread_done.wait()
                raise RuntimeError("relay data plane exited")
            finally:
                dp.stop()
    finally:
        # The nursery above waited for the data-plane thread to return, so the sockets
        # are no longer in use when they close here.
        with trio.CancelScope(shield=True):
            if cache is not None:
                with trio.move_on_after(FLUSH_ON_EXIT):
                    while dp.outbox:
                        item = dp.outbox.popleft()
                        if isinstance(item, Stored):
                            queued.add(item.entries)
                    if len(queued):
                        await flush_writes()
                cache.close()
            for sock in (public, public_other, peer, own, *tcp):
                if sock is not None:
                    sock.close()
            dp.close()


# -- as a process of `firsthop relay` ----------------------------------------------------

SNAPSHOT_EVERY = 2.0  # seconds between a standby's copies of the flow cache, at least,
SNAPSHOT_SHARE = 0.1  # and at most this share of its time spent copying (a big cache)


class Control:
    """Lines from the supervisor on our stdin. It holds the write end, so EOF means it
    exited, however it died. (PR_SET_PDEATHSIG would fire when the *thread* that spawned us
    exits, and Trio spawns from short-lived helper threads.)"""

    MAX_LINE = 256

    def __init__(self) -> None:
        self._stream = trio.lowlevel.FdStream(os.dup(0))
        self._buffered = b""

    async def line(self) -> bytes | None:
        """The next line (None: the supervisor is gone)."""
        while b"\n" not in self._buffered:
            chunk = await self._stream.receive_some(1024)
            if not chunk:
                return None
            self._buffered = (self._buffered + chunk)[-self.MAX_LINE :]
        line, _, self._buffered = self._buffered.partition(b"\n")
        return line.strip()

    async def until_gone(self) -> None:
        while await self.line() is not None:
            pass

    async def aclose(self) -> None:
        await self._stream.aclose()


def _emit(message: dict[str, Any]) -> None:
    try:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, ValueError):
        pass  # the supervisor is gone; our stdin's EOF is on its way


async def _stand_by(
    config: RelayConfig, control: Control, cache: FlowCache | None, snapshot: FlowSnapshot
) -> int | None:
    """The warm standby: everything imported, Redis connected, a copy of the cluster's
    flows kept fresh, no socket bound (bound, it would take a share of the traffic). Returns
    the index of the dead worker the supervisor says to replace (`serve INDEX`), or None
    when the supervisor is gone."""
    index: int | None = None
    async with trio.open_nursery() as nursery:

        async def refresh() -> None:
            assert cache is not None
            while True:
                started = trio.current_time()
                try:
                    snapshot.replace(await cache.snapshot(config.limits.max_flows), started)
                except CacheUnavailable:
                    pass  # keep the last copy (it ages out)
                now = trio.current_time()
                _emit(
                    {
                        "type": "standby",
                        "pid": os.getpid(),
                        "flows": len(snapshot),
                        "age": now - snapshot.taken if snapshot.taken > -math.inf else None,
                    }
                )
                await trio.sleep(max(SNAPSHOT_EVERY, (now - started) / SNAPSHOT_SHARE))

        _emit({"type": "standby", "pid": os.getpid(), "flows": 0, "age": None})
        if cache is not None:
            nursery.start_soon(refresh)
        while (line := await control.line()) is not None:
            word, _, arg = line.partition(b" ")
            if word == b"serve" and arg.isdigit():
                index = int(arg)
                break
        nursery.cancel_scope.cancel()
    return index


async def _worker_process(config: RelayConfig, index: int | None) -> None:
    """One worker of `firsthop relay`, serving slot `index` (None: the warm standby until
    told which slot to serve). Says on stdout when it is ready, and its stats."""
    control = Control()
    cache = FlowCache(config.redis) if config.redis else None
    snapshot = FlowSnapshot() if index is None else None
    handle: WorkerHandle | None = None
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:

                async def stop_on_signal() -> None:
                    async for _ in signals:
                        nursery.cancel_scope.cancel()
                        return

                nursery.start_soon(stop_on_signal)
                took_over = index is None
                if index is None:
                    assert snapshot is not None
                    memory.freeze_startup()  # (now, not when a slot waits for it: `memory`)
                    index = await _stand_by(config, control, cache, snapshot)
                    if index is None:
                        nursery.cancel_scope.cancel()
                        return
                handle = await nursery.start(
                    partial(serve_worker, config, index, cache=cache, snapshot=snapshot)
                )
                assert handle is not None
                if not took_over:  # (a full collection stalls every flow: `memory`)
                    memory.freeze_startup()
                _emit(
                    {
                        "type": "ready",
                        "index": index,
                        "pid": os.getpid(),
                        "took_over": took_over,
                        "public": handle.public,
                        "peer": handle.peer,
                        "own": handle.own,
                        "tcp": handle.tcp,
                        "public_other": handle.public_other,
                        "tcp_other": handle.tcp_other,
                    }
                )

                async def report(handle: WorkerHandle) -> None:
                    while True:
                        _emit({"type": "stats", "index": index, "stats": handle.stats()})
                        await trio.sleep(STATS_EVERY)

                nursery.start_soon(report, handle)
                await control.until_gone()
                nursery.cancel_scope.cancel()
    finally:
        if handle is not None:
            _emit({"type": "stats", "index": index, "stats": handle.stats()})
        elif cache is not None:
            cache.close()  # (serve_worker closes the one it was given)
        with trio.CancelScope(shield=True):
            await control.aclose()


def main() -> None:
    arg = sys.argv[1] if len(sys.argv) > 1 else "0"
    index = None if arg == STANDBY_ARG else int(arg)
    logging.basicConfig(
        level=os.environ.get("FIRSTHOP_LOG_LEVEL", "INFO"),
        format=f"relay[{'standby' if index is None else f'w{index}'}] %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    config = RelayConfig.from_json(os.environ[CONFIG_ENV])
    setup_tracing("relay")
    try:
        trio.run(_worker_process, config, index)
    finally:
        shutdown_tracing()


if __name__ == "__main__":
    main()
