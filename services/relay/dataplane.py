"""The relay worker's packet loop: one OS thread that owns the sockets' hot path.

Why a thread and not a Trio task: Trio parks a task on a socket by registering it with epoll
and rescheduling on wake, which is paid once per burst and measured at 1.7-1.9x the cost of
a C forwarder per packet; one thread that drains each ready socket until EAGAIN and waits in
a single long-lived epoll set pays one `epoll_wait` per burst and nothing else. Trio still
owns the thread's lifecycle (see `worker.py`) and does all the slow I/O (Redis, metrics).

Strategy: the common cases — a datagram from a client with a flow, a framed reply from that
flow's destination, a framed datagram from a first-hop relay for a known second-hop flow —
run inline here: one `FlowTable.known_*` check, no copy of the payload. Everything else goes
to `FlowTable` (the sans-IO core), whose decision this loop carries out.

Batches (`shared/mmsg.py`): a readable socket is read with one recvmmsg of up to `BATCH`
datagrams into one shared arena; the batch's forwards are queued as slices of that arena (a
client's datagram with its flow's header written in front of it in place) and leave in one
sendmmsg per destination socket when the batch is done, or earlier, before a datagram takes
the slow path, so a flow's datagrams keep their order. What the kernel refuses is a counted
`send_error` drop, a receive error a counted `recv_error`/`upstream_error`, as before.
Wake-ups, not syscalls, dominate what a batch saves, so a busy wake-up (`GATHER_MIN`
datagrams or more, or any one while the worker carries `BUSY_RATE` a second) that emptied
its sockets sleeps before the next epoll wait: as long as `GATHER_BATCH` datagrams take to
come at the last window's rate, 0.2-0.7 ms. The next batch gathers meanwhile, and no
datagram waits longer than that for it (socket buffers are 4 MiB: at 150,000/s 0.7 ms is
105 datagrams). An idle relay, or one at a few calls' rates, never sleeps this way (the
rule: `shared/gather.py`, which the transceiver's loop follows too).

The common cases of `_drain_public`, `_drain_upstream` and `_drain_peer` run in C when built
(`_fastpath.c`, `--datapath`): one call receives a batch, one forwards it up to the first
datagram that is not a common case, which takes the full path here; no bytecode runs per
datagram, and the flow table stays the one owner of the flows (C reads its dicts and writes
a flow's `last_seen`, as `known_client`/`known_return`/`known_peer` do). With C, the wait
itself is C's too (`Forwarder.serve`): the epoll wait and every wake-up whose ready
descriptors are all datagram sockets and whose datagrams are all common cases run without a
bytecode, until the tick, a datagram that is not one (finished here), anything else ready
(handled here), or a wake-up the gather looks at (at a call's rates each datagram is its own
wake-up, and Python's turn of the loop cost about a third of what each one cost). The
table is touched only by this thread; Trio talks to it through `commands` (a queue plus an
eventfd that wakes the epoll wait) and gets events back through `outbox`.

IPv6: a worker may have two public sockets, one per IP family (IPv6 ones IPV6_V6ONLY, so no
v4-mapped address ever shows up); a reply leaves from the one of its client's family. An
IPv6 socket's addresses come as (host, port, flowinfo, scope_id) and are cut to (host, port)
as they arrive, so every table is keyed alike. A datagram is received past `HEADROOM` bytes,
room for the longer (IPv6) PROXY v2 header; an IPv4 flow's 28 bytes go right in front of it.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from firsthop.services.relay.flow_table import FlowTable
from firsthop.services.relay.flows import (
    MAX_DATAGRAM,
    Deliver,
    Drop,
    Flow,
    Forward,
    Recover,
    ReturnToPeer,
)
from firsthop.services.relay.tcp_ingress import Connection, TcpIngress
from firsthop.shared.address import ip_family
from firsthop.shared.gather import Gather
from firsthop.shared.mmsg import Receiver, Sender
from firsthop.shared.wire.demux import STUN_LAST
from firsthop.shared.wire.proxy_v2 import FAMILY_INET6_STREAM, V4_HEADER, V6_HEADER

try:  # built with the package where a C compiler is (setup.py); else the Python loop
    from firsthop.services.relay import _fastpath
except ImportError:  # pragma: no cover - depends on the build
    _fastpath = None  # type: ignore[assignment]

log = logging.getLogger("firsthop.relay")

RECV_BUFFER = 2048  # > headroom + MAX_DATAGRAM: oversize is seen, not truncated
BATCH = 256  # datagrams per recvmmsg: one call per readable socket per wake-up
GATHER = 0.0007  # seconds, at most, a wake-up that carried traffic lets the next batch gather
# Datagrams in a wake-up for it to count as busy: at a voice call's rates (one datagram a
# wake-up) a sleep only adds a syscall and a context switch (measured: the relay's CPU at 4
# calls 2.0-2.3 % of a core without, 2.6-3.2 % with a gather after every wake-up).
GATHER_MIN = 4
# A worker carrying this many datagrams a second or more (measured over RATE_WINDOW) gathers
# after every wake-up that carried any: at such rates datagrams come spread out (one or two a
# wake-up, each wake-up an epoll_wait, a dispatch and a batch call of their own), and the
# wake-ups, not the datagrams, become what a core spends. 5000/s is some 50 calls.
BUSY_RATE = 5000.0
RATE_WINDOW = 0.05  # seconds
# How long a gather lasts: what GATHER_BATCH datagrams take to come at the rate of the last
# window, between GATHER_FLOOR and GATHER (at 40,000/s 0.7 ms, at 150,000/s 0.2 ms): enough
# to amortise a wake-up, and the less added latency the busier the worker.
GATHER_BATCH = 32
GATHER_FLOOR = 0.0002
MAX_SENDERS = 64  # destinations batched at once; beyond, what is queued goes first
TICK = 0.25  # housekeeping period, seconds
SWEEP_MIN = 1000  # flows looked at per tick, at least
SOCKET_BUFFER = 4 * 1024 * 1024
HEADROOM = V6_HEADER  # room for a PROXY v2 header in front of a received datagram
MAX_UPSTREAM = 4096  # connected upstream sockets per worker; beyond, the shared `own` one


@dataclass(frozen=True, slots=True)
class Stored:
    """Flows the cache should learn: (client, token, via)."""

    entries: list[tuple[tuple[str, int], bytes, tuple[str, int] | None]]


@dataclass(frozen=True, slots=True)
class Pinned:
    """Flows that just got their first answer (for the relay's first-packet span):
    (client, token, dest, via, created, established_at)."""

    flows: list[
        tuple[tuple[str, int], bytes, tuple[str, int], tuple[str, int] | None, float, float]
    ]


@dataclass(frozen=True, slots=True)
class LookupWanted:
    client: tuple[str, int]


# Commands to the data-plane thread (from Trio, through `send_command`).


@dataclass(frozen=True, slots=True)
class Stop:
    """Leave the loop."""


@dataclass(frozen=True, slots=True)
class CacheAnswered:
    """The flow cache's answer for a client whose datagrams are held (token None: no entry)."""

    client: tuple[str, int]
    token: bytes | None


@dataclass(frozen=True, slots=True)
class CacheFailed:
    """The flow cache could not be asked: drop the held datagrams, remember no miss."""

    client: tuple[str, int]


Command = Stop | CacheAnswered | CacheFailed


DATAPATHS = ("auto", "c", "python")


def datapath_in_use(datapath: str) -> str:
    """What --datapath ("c", "python", "auto": c when built) runs: "c" or "python";
    ValueError for another word, or for "c" when it was not built."""
    if datapath not in DATAPATHS:
        raise ValueError(f"--datapath is one of {', '.join(DATAPATHS)}, not {datapath!r}")
    if datapath == "c" and _fastpath is None:
        raise ValueError("--datapath c: the relay's C data path was not built (setup.py)")
    return "c" if datapath != "python" and _fastpath is not None else "python"


def native_forwarder(datapath: str) -> Any:
    """The C forwarder for `datapath`, or None (the Python loop)."""
    if datapath_in_use(datapath) == "python":
        return None
    assert _fastpath is not None
    return _fastpath.Forwarder(
        count=BATCH,
        size=RECV_BUFFER - HEADROOM,
        headroom=HEADROOM,
        flow_type=Flow,
        v4_header=V4_HEADER,
        v6_header=V6_HEADER,
        v6_family_min=FAMILY_INET6_STREAM,
        stun_last=STUN_LAST,
        max_datagram=MAX_DATAGRAM,
    )


class DataPlane:
    def __init__(
        self,
        table: FlowTable,
        *,
        public: socket.socket,
        own: socket.socket,
        peer: socket.socket,
        notify: Callable[[], None] = lambda: None,
        cpu: int | None = None,
        tcp: list[socket.socket] | None = None,
        public_other: socket.socket | None = None,
        datapath: str = "auto",
    ) -> None:
        self.table = table
        # ICE-TCP callers (optional): their connections join this thread's epoll set
        self.tcp = (
            TcpIngress(
                tcp,
                table.limits,
                on_frame=self._tcp_frame,
                on_close=table.forget_tcp,
                count_drop=table.count_drop,
            )
            if tcp
            else None
        )
        self.public = public
        self.public_other = public_other  # a second public socket, of the other IP family
        publics = [sock for sock in (public, public_other) if sock is not None]
        self._public6 = next((s for s in publics if s.family == socket.AF_INET6), public)
        self._public4 = next((s for s in publics if s.family == socket.AF_INET), public)
        self.own = own
        self.peer = peer
        self.notify = notify  # wakes the Trio side; must be thread-safe
        self.cpu = cpu
        self.commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self.outbox: collections.deque[Stored | LookupWanted | Pinned] = collections.deque()
        self.want_pins = False  # set when first-packet spans are wanted (tracing on)
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._stopping = False
        # Counters owned by this thread; `snapshot` is a consistent copy for readers.
        self.upstream = 0
        self.downstream = 0
        self.upstream_bytes = 0
        self.downstream_bytes = 0
        self.upstreams: dict[tuple[str, int], socket.socket] = {}
        self._upstream_by_fd: dict[int, tuple[socket.socket, tuple[str, int]]] = {}
        self._ep: select.epoll | None = None
        self._buf = bytearray(RECV_BUFFER)
        # One arena for every socket's batch (drains run one at a time, and each flushes
        # its sends before the next receive reuses the slots).
        self._rx = Receiver(BATCH, RECV_BUFFER - HEADROOM, headroom=HEADROOM)
        self.native = native_forwarder(datapath)  # the common cases in C, or None
        self._upstream_fds: dict[tuple[str, int], int] = {}  # for `native`: dest -> fd
        # for `native.serve`: each datagram socket's fd -> 0 (public), 1 (peer), or the
        # destination of an upstream socket; whatever else wakes the loop is Python's
        self._routes: dict[int, int | tuple[str, int]] = {}
        self._to_public4 = Sender(BATCH)
        self._to_public6 = Sender(BATCH)
        self._to_peer = Sender(BATCH)
        self._spare: list[Sender] = []  # connected senders not holding a batch
        self._queued: dict[socket.socket, Sender] = {}  # upstream socket -> its batch
        self._handled = 0  # datagrams received in this wake-up
        self._earlier = 0  # and in the wake-ups `native.serve` handled before it
        self._more = False
        self.gather = Gather(
            GATHER, GATHER_FLOOR, GATHER_BATCH, BUSY_RATE, GATHER_MIN, window=RATE_WINDOW
        )
        self.snapshot: dict[str, Any] = self._make_snapshot()

    # -- control (any thread) ---------------------------------------------------------------

    def send_command(self, command: Command) -> None:
        self.commands.put(command)
        os.eventfd_write(self._wake_fd, 1)

    def stop(self) -> None:
        self.send_command(Stop())

    # -- the loop (its own thread) ----------------------------------------------------------

    def run(self) -> None:
        if self.cpu is not None:
            try:
                os.sched_setaffinity(0, {self.cpu})  # this thread only (pid 0 = caller)
            except OSError as exc:
                log.info("cpu pinning unavailable: %s", exc)
        other = self.public_other
        for sock in (self.public, self.own, self.peer, other):
            if sock is not None:
                sock.setblocking(False)
        self._ep = ep = select.epoll()
        pub_fd, own_fd, peer_fd = self.public.fileno(), self.own.fileno(), self.peer.fileno()
        other_fd = other.fileno() if other is not None else -1
        wake_fd = self._wake_fd
        for fd in (pub_fd, own_fd, peer_fd, wake_fd, other_fd):
            if fd >= 0:
                ep.register(fd, select.EPOLLIN)
        self._routes.update({pub_fd: 0, peer_fd: 1})
        if other_fd >= 0:
            self._routes[other_fd] = 0
        public = self.public
        native = self.native
        tcp = self.tcp
        if tcp is not None:
            tcp.attach(ep)
        buf = self._buf
        view = memoryview(buf)
        next_tick = 0.0
        upstream_by_fd = self._upstream_by_fd
        gather = self.gather
        try:
            while not self._stopping:
                now = time.time()
                if now >= next_tick:
                    next_tick = now + TICK
                    # A quarter of the table per tick: every flow is looked at each second.
                    table = self.table
                    table.sweep(now, budget=max(SWEEP_MIN, table.size // 4 + 1))
                    self._housekeeping(now)
                self._handled = self._earlier = 0
                self._more = False  # set when a receive filled its batch: more is queued
                # (ICE-TCP frames a pass left in a deframer: polled for without waiting)
                backlog = tcp is not None and tcp.backlog
                if native is not None and not backlog:
                    # Wake-ups of datagram sockets only, forwarded in C, until one needs
                    # Python: anything else ready is polled for here, without waiting
                    wait = min(max(0.0, next_tick - now), RATE_WINDOW)  # (a clock step)
                    pending = self._serve(native, wait)
                    now = time.time()
                    ready = ep.poll(0) if pending else []
                else:
                    ready = ep.poll(0 if backlog else TICK)
                for fd, events in ready:
                    now = time.time()
                    if fd == pub_fd:
                        self._drain_public(public, now)
                    elif fd in upstream_by_fd:
                        self._drain_upstream(upstream_by_fd[fd], now)
                    elif fd == peer_fd:
                        self._drain_peer(now)
                    elif fd == own_fd:
                        self._drain_own(buf, view, now)
                    elif fd == other_fd:
                        assert other is not None
                        self._drain_public(other, now)
                    elif fd == wake_fd:
                        os.eventfd_read(wake_fd)
                        self._run_commands(time.time())
                    elif tcp is not None:
                        tcp.on_event(fd, events, now)
                if tcp is not None and tcp.backlog:
                    tcp.serve_backlog(time.time())
                    self._more = self._more or bool(tcp.backlog)
                # Wake-ups, not syscalls, are what a batch has to amortise: when this one
                # carried traffic and emptied its sockets, let the next batch gather for
                # GATHER before asking again (a datagram waits at most that much longer).
                wait = gather.after(now, self._handled, self._more, self._earlier)
                if wait:
                    time.sleep(wait)
        finally:
            if tcp is not None:
                tcp.close_all()
            ep.close()
            for sock in self.upstreams.values():
                sock.close()
            self.snapshot = self._make_snapshot()

    # Upstream sockets: one per destination (transceiver or peer relay), bound on the
    # internal host and connect()ed, so a send names no address (no per-packet address
    # parsing, route cached by the kernel) and a reply needs no source check (the kernel
    # only delivers the connected peer's datagrams). Destinations are few.

    def upstream_for(self, dest: tuple[str, int]) -> socket.socket | None:
        sock = self.upstreams.get(dest)
        if sock is not None or len(self.upstreams) >= MAX_UPSTREAM:
            return sock
        # A destination of the internal socket's family is reached from the internal host;
        # one of the other family (an IPv6 transceiver, token family 6, behind an IPv4
        # --internal) from that family's wildcard: the kernel picks the source by route.
        v6 = ip_family(dest[0]) == 6
        family = socket.AF_INET6 if v6 else socket.AF_INET
        if family == self.own.family:
            local = self.own.getsockname()[0]
        else:
            local = "::" if v6 else "0.0.0.0"
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            sock.bind((local, 0))
            sock.connect(dest)
            sock.setblocking(False)
        except OSError:
            sock.close()
            self.table.count_drop("upstream_socket_error")
            return None
        self.upstreams[dest] = sock
        self._upstream_fds[dest] = sock.fileno()
        self._upstream_by_fd[sock.fileno()] = (sock, dest)
        self._routes[sock.fileno()] = dest
        if self._ep is not None:
            self._ep.register(sock.fileno(), select.EPOLLIN)
        return sock

    def _drain_public(self, public: socket.socket, now: float) -> None:
        if self.native is not None:
            self._drain_native(self.native, public.fileno(), now)
            return
        # One recvmmsg; each datagram lands past room for its frame header, which is
        # written in front of it in place, so the frame leaves as one slice of the arena.
        # The forwards go in one sendmmsg per upstream socket at the end.
        rx = self._rx
        got = rx.receive(public.fileno())
        if rx.errors:
            self._count_rx_errors("recv_error")
        if not got:
            return
        self._handled += got
        self._more |= got == BATCH
        arena, base, stride = rx.arena, rx.base, rx.stride
        lengths, sources = rx.lengths, rx.sources
        upstreams, queued = self.upstreams, self._queued
        known = self.table.known_client
        fwd = fwd_bytes = 0
        at = HEADROOM  # where datagram i starts in the arena
        for i in range(got):
            n = lengths[i]
            addr = sources[i]
            flow = known(addr, n, arena[at] if n else 0, now)
            if flow is not None:
                sock = upstreams.get(flow.dest)
                if sock is not None:
                    header = flow.header
                    start = at - len(header)
                    arena[start:at] = header
                    out = queued.get(sock)
                    if out is None:
                        out = self._sender_for(sock)
                    out.add(base + start, at + n - start)
                    fwd += 1
                    fwd_bytes += n
                    at += stride
                    continue
            # The slow path: what is queued goes first (a flow's datagrams keep their order)
            self._flush()
            data = bytes(arena[at : at + n])
            self._carry_out(self.table.on_client(addr, data, now), data, n)
            at += stride
        self._flush()
        self.upstream += fwd
        self.upstream_bytes += fwd_bytes

    def _drain_upstream(self, entry: tuple[socket.socket, tuple[str, int]], now: float) -> None:
        sock, peer = entry
        if self.native is not None:
            self._drain_native(self.native, sock.fileno(), now)
            return
        rx = self._rx
        got = rx.receive(sock.fileno(), sources=False)  # connected: only `peer` gets here
        if rx.errors:  # e.g. ECONNREFUSED: ICMP port unreachable from the peer
            self._count_rx_errors("upstream_error")
        if not got:
            return
        self._handled += got
        self._more |= got == BATCH
        arena, view, base, stride = rx.arena, rx.view, rx.base, rx.stride
        lengths = rx.lengths
        to4, to6, to_peer = self._to_public4, self._to_public6, self._to_peer
        known = self.table.known_return
        out = out_bytes = 0
        at = HEADROOM
        for i in range(got):
            n = lengths[i]
            end = at + n
            # A frame's header is 28 bytes (IPv4) or 52 (IPv6), by its family byte (§2.2).
            hlen = (
                V6_HEADER if n >= V6_HEADER and arena[at + 13] >= FAMILY_INET6_STREAM else V4_HEADER
            )
            # (the key is a copy of the header: a dict is looked up by bytes)
            flow = known(bytes(view[at : at + hlen]), peer, n - hlen, now) if n >= hlen else None
            if flow is not None:
                if flow.via is not None:  # second hop: back to the first relay as it is
                    to_peer.add_to(base + at, n, flow.via)
                elif flow.stream:
                    if not self._tcp_send(flow.client, view[at + hlen : end]):
                        at += stride
                        continue
                elif hlen == V4_HEADER:
                    to4.add_to(base + at + hlen, n - hlen, flow.client)
                else:
                    to6.add_to(base + at + hlen, n - hlen, flow.client)
                out += 1
                out_bytes += n - hlen
            else:
                self._flush()
                data = bytes(view[at:end])
                self._carry_out(self.table.on_return(peer, data, now), data, n)
            at += stride
        self._flush()
        self.downstream += out
        self.downstream_bytes += out_bytes

    # The same three drains in C (`_fastpath.c`): it forwards the common cases, in order, and
    # stops at the first datagram that is not one; that one takes the full path here, and C
    # goes on after it. What C queued before the stop has left by then (order kept).

    def _serve(self, fp: Any, timeout: float) -> bool:
        """Wait up to `timeout` seconds, and forward the datagrams of the wake-ups meanwhile,
        in C (`Forwarder.serve`) for as long as every one is a common case; the one that is
        not is finished here. Whether to poll for what else is ready, without waiting:
        something other than a datagram socket, or, after a slow datagram, the wake-up's
        other sockets, which C did not read (else a public socket kept busy by new-flow
        checks, always first in epoll's level-triggered order, starves the upstream
        sockets: no answer, no media back, until the flood ends)."""
        table = self.table
        assert self._ep is not None
        why, fd, got, stop, handled, last, more, *counts = fp.serve(
            self._ep.fileno(),
            timeout,
            self._routes,
            table.flows,
            table.by_return,
            table.hop_flows,
            self._upstream_fds,
            self._public4.fileno(),
            self._public6.fileno(),
            self.peer.fileno(),
            self.gather.rate >= BUSY_RATE,
            GATHER_MIN,
        )
        up, up_bytes, down, down_bytes, dropped, recv_errors, upstream_errors = counts
        self.upstream += up
        self.upstream_bytes += up_bytes
        self.downstream += down
        self.downstream_bytes += down_bytes
        for reason, n in (
            ("send_error", dropped),
            ("recv_error", recv_errors),
            ("upstream_error", upstream_errors),
        ):
            if n:
                table.count_drop(reason, n)
        if why == _fastpath.SERVE_TIMEOUT:  # (no wake-up just now: all went to the rate)
            last = 0
        self._handled, self._earlier, self._more = last, handled - last, bool(more)
        if why == _fastpath.SERVE_SLOW:
            self._forward_from(fp, fd, got, stop, time.time())
        return why in (_fastpath.SERVE_OTHER, _fastpath.SERVE_SLOW)

    def _drain_native(self, fp: Any, fd: int, now: float) -> None:
        """One receive on the datagram socket `fd`, its batch forwarded by C and, where it
        stops, by the full path here."""
        upstream = fd in self._upstream_by_fd  # (connected: only its peer's datagrams come)
        got: int = fp.receive(fd, not upstream)
        errors = fp.take_rx_errors()
        if errors:  # (upstream: e.g. ECONNREFUSED, ICMP port unreachable from the peer)
            self.table.count_drop("upstream_error" if upstream else "recv_error", errors)
        if got:
            self._handled += got
            self._more |= got == BATCH
            self._forward_from(fp, fd, got, 0, now, stopped=False)

    def _forward_from(
        self, fp: Any, fd: int, got: int, start: int, now: float, *, stopped: bool = True
    ) -> None:
        """The rest of the batch of `got` datagrams C received on `fd`: C forwards from
        `start` up to each datagram that is not a common case, which the flow table decides
        here (`stopped`: C has already stopped at `start`)."""
        table = self.table
        entry = self._upstream_by_fd.get(fd)
        forward: Callable[[int], tuple[int, int, int, int]]
        full_path: Callable[[int, bytes], object]
        if entry is not None:
            peer = entry[1]
            fds = (self._public4.fileno(), self._public6.fileno(), self.peer.fileno())

            def forward(at: int) -> tuple[int, int, int, int]:
                return fp.forward_returns(at, table.by_return, peer, now, *fds)  # type: ignore[no-any-return]

            def full_path(_: int, data: bytes) -> object:
                return table.on_return(peer, data, now)
        elif fd == self.peer.fileno():

            def forward(at: int) -> tuple[int, int, int, int]:
                return fp.forward_peers(at, table.hop_flows, self._upstream_fds, now)  # type: ignore[no-any-return]

            def full_path(i: int, data: bytes) -> object:
                return table.on_peer(fp.source(i), data, now)
        else:

            def forward(at: int) -> tuple[int, int, int, int]:
                return fp.forward_clients(at, table.flows, self._upstream_fds, now)  # type: ignore[no-any-return]

            def full_path(i: int, data: bytes) -> object:
                return table.on_client(fp.source(i), data, now)

        stop = start
        while True:
            if stopped:
                data = fp.datagram(stop)
                self._carry_out(full_path(stop, data), data, len(data))
                stop += 1
            stop, sent, nbytes, dropped = forward(stop)
            stopped = True
            if entry is not None:
                self.downstream += sent
                self.downstream_bytes += nbytes
            else:
                self.upstream += sent
                self.upstream_bytes += nbytes
            if dropped:
                table.count_drop("send_error", dropped)
            if stop >= got:
                return

    def _drain_own(self, buf: bytearray, view: memoryview, now: float) -> None:
        # Only when more destinations exist than upstream sockets (MAX_UPSTREAM).
        for _ in range(BATCH):
            try:
                n, addr = self.own.recvfrom_into(buf)
            except BlockingIOError:
                break
            except OSError:
                self.table.count_drop("recv_error")
                continue
            addr = (addr[0], addr[1])
            data = bytes(view[:n])
            self._carry_out(self.table.on_return(addr, data, now), data, n)

    def _drain_peer(self, now: float) -> None:
        if self.native is not None:
            self._drain_native(self.native, self.peer.fileno(), now)
            return
        rx = self._rx
        got = rx.receive(self.peer.fileno())
        if rx.errors:
            self._count_rx_errors("recv_error")
        if not got:
            return
        self._handled += got
        self._more |= got == BATCH
        arena, view, base, stride = rx.arena, rx.view, rx.base, rx.stride
        lengths, sources = rx.lengths, rx.sources
        upstreams, queued = self.upstreams, self._queued
        known = self.table.known_peer
        fwd = fwd_bytes = 0
        at = HEADROOM
        for i in range(got):
            n = lengths[i]
            addr = sources[i]
            hlen = (
                V6_HEADER if n > V6_HEADER and arena[at + 13] >= FAMILY_INET6_STREAM else V4_HEADER
            )
            flow = (
                known(bytes(view[at : at + hlen]), addr, arena[at + hlen], n - hlen, now)
                if n > hlen
                else None
            )
            if flow is not None:
                sock = upstreams.get(flow.dest)
                if sock is not None:
                    out = queued.get(sock)
                    if out is None:
                        out = self._sender_for(sock)
                    out.add(base + at, n)
                    fwd += 1
                    fwd_bytes += n - hlen
                    at += stride
                    continue
            self._flush()
            data = bytes(view[at : at + n])
            self._carry_out(self.table.on_peer(addr, data, now), data, n)
            at += stride
        self._flush()
        self.upstream += fwd
        self.upstream_bytes += fwd_bytes

    # -- batched sends ---------------------------------------------------------------------

    def _sender_for(self, sock: socket.socket) -> Sender:
        """A batch for the connected upstream socket `sock`, from the spares."""
        if len(self._queued) >= MAX_SENDERS:
            self._flush()  # (bounds the senders held; each destination keeps its order)
        out = self._spare.pop() if self._spare else Sender(BATCH, connected=True)
        self._queued[sock] = out
        return out

    def _flush(self) -> None:
        """Send every queued batch: one sendmmsg per destination socket (more only when
        the kernel takes part of one); what it refused is counted."""
        queued = self._queued
        if queued:
            for sock, out in queued.items():
                out.flush(sock.fileno())
                if out.dropped:
                    self.table.count_drop("send_error", out.dropped)
                    self.upstream -= out.dropped
                self._spare.append(out)
            queued.clear()
        for sock, out in (
            (self._public4, self._to_public4),
            (self._public6, self._to_public6),
            (self.peer, self._to_peer),
        ):
            if out.pending:
                out.flush(sock.fileno())
                if out.dropped:
                    self.table.count_drop("send_error", out.dropped)
                    self.downstream -= out.dropped

    def _count_rx_errors(self, reason: str) -> None:
        rx = self._rx
        self.table.count_drop(reason, rx.errors)
        rx.errors = 0

    def _carry_out(self, decision: object, data: bytes, n: int) -> None:
        """Carry out a core decision for the datagram `data` (of `n` bytes)."""
        try:
            if type(decision) is Forward:
                sock = self.upstream_for(decision.dest)
                if sock is not None:
                    sock.sendmsg((decision.header, data))
                else:
                    self.own.sendmsg((decision.header, data), (), 0, decision.dest)
                self.upstream += 1
                self.upstream_bytes += n
            elif type(decision) is Deliver:
                if decision.stream:
                    if not self._tcp_send(decision.client, memoryview(data)[decision.offset :]):
                        return
                else:
                    client = decision.client
                    public = self._public6 if ip_family(client[0]) == 6 else self._public4
                    public.sendto(data[decision.offset :], client)
                self.downstream += 1
                self.downstream_bytes += n - decision.offset
            elif type(decision) is ReturnToPeer:
                self.peer.sendto(data, decision.via)
                self.downstream += 1
                self.downstream_bytes += n
            elif type(decision) is Recover:
                self.outbox.append(LookupWanted(decision.client))
                self.notify()
        except OSError:
            self.table.count_drop("send_error")

    # -- ICE-TCP ---------------------------------------------------------------------------

    def _tcp_frame(self, conn: Connection, data: bytes, now: float) -> str | None:
        """One RFC 4571 frame from an ICE-TCP connection: a datagram of its flow. Returns
        why the connection must close, if it must."""
        client = conn.client
        flow = self.table.known_tcp_client(client, len(data), data[0], now)
        if flow is not None:
            sock = self.upstreams.get(flow.dest)
            if sock is not None:
                try:
                    sock.sendmsg((flow.header, data))
                except OSError:
                    self.table.count_drop("send_error")
                    return None
                self.upstream += 1
                self.upstream_bytes += len(data)
                return None
        decision = self.table.on_tcp_client(client, data, now)
        if type(decision) is Drop:
            if not conn.routed:
                return "first_frame_rejected"
            if client not in self.table.tcp_flows:
                return "flow_ended"
            return None
        self._carry_out(decision, data, len(data))
        return None

    def _tcp_send(self, client: tuple[str, int], payload: bytes | memoryview) -> bool:
        if self.tcp is None:
            self.table.count_drop("tcp_no_connection")
            return False
        return self.tcp.send(client, payload)

    # -- housekeeping and commands --------------------------------------------------------

    def _housekeeping(self, now: float) -> None:
        if self.tcp is not None:
            self.tcp.sweep(now)
        if self.want_pins:
            new = [f for f in self.table.events.established if f.established_at >= f.created]
            if new:
                self.outbox.append(
                    Pinned(
                        [
                            (f.client, f.token, f.dest, f.via, f.created, f.established_at)
                            for f in new
                            if f.stored_at == float("-inf")
                        ]
                    )
                )
        due: list[Flow] = self.table.due_for_store(now)
        if due:
            self.outbox.append(Stored([(f.client, f.token, f.via) for f in due]))
            self.notify()
        self.snapshot = self._make_snapshot()

    def _run_commands(self, now: float) -> None:
        while True:
            try:
                command = self.commands.get_nowait()
            except queue.Empty:
                return
            match command:
                case Stop():
                    self._stopping = True
                case CacheAnswered(client, token):
                    for data, decision in self.table.recovered(client, token, now):
                        self._carry_out(decision, data, len(data))
                case CacheFailed(client):
                    self.table.recovered(client, None, now, negative=False)

    def _make_snapshot(self) -> dict[str, Any]:
        t = self.table
        return {
            "upstream": self.upstream,
            "downstream": self.downstream,
            "upstream_bytes": self.upstream_bytes,
            "downstream_bytes": self.downstream_bytes,
            "flows": t.established_count,
            "pending": t.pending,
            "recoveries": t.recoveries,
            "revocations": t.revocations,
            "revoked": len(t.revoked),
            "drops": dict(t.drops),
            "evictions": dict(t.evictions),
            "tcp_connections": self.tcp.connections if self.tcp else 0,
            "tcp_queued_bytes": self.tcp.queued if self.tcp else 0,
            "tcp_accepted": self.tcp.accepted if self.tcp else 0,
            "tcp_closed": dict(self.tcp.closed) if self.tcp else {},
        }

    def close(self) -> None:
        os.close(self._wake_fd)
