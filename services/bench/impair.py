"""A userspace UDP impairment proxy: loss, delay and jitter, each way (kernel netem is not
available here). Used by the loss tests and `firsthop bench loss`.

Clients send to `listen`; each client gets its own upstream socket toward `target` (so the
far side sees one address per client, as behind a NAT), and what comes back on it goes to
that client from `listen`. Every datagram, each way, is dropped with probability `loss`,
else delivered after `delay` plus a uniform random `jitter` (so packets reorder when the
jitter exceeds their spacing, as on a real jittery link). Seeded: a run is repeatable.

Runs in a thread of its own (`start()` / `stop()`); counts what it forwarded and dropped.
`rebind(client)` emulates a NAT rebinding: the client's upstream socket is replaced by a new
one (a new source port toward `target`) and the old one closed.
"""

from __future__ import annotations

import heapq
import itertools
import random
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field

from firsthop.shared.address import Address


@dataclass(frozen=True)
class Impairment:
    loss: float = 0.0  # probability a datagram is lost
    delay: float = 0.0  # seconds, fixed
    jitter: float = 0.0  # seconds, uniform in [0, jitter] on top of `delay`


@dataclass
class ImpairedPath:
    target: Address
    up: Impairment = field(default_factory=Impairment)  # client -> target
    down: Impairment = field(default_factory=Impairment)  # target -> client
    seed: int = 1
    host: str = "127.0.0.1"
    counts: dict[str, int] = field(
        default_factory=lambda: {"up": 0, "down": 0, "up_lost": 0, "down_lost": 0}
    )

    def __post_init__(self) -> None:
        self._random = random.Random(self.seed)
        self._listen = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._listen.bind((self.host, 0))
        self._listen.setblocking(False)
        self.listen: Address = self._listen.getsockname()
        self._upstream: dict[Address, socket.socket] = {}
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listen, selectors.EVENT_READ, None)
        self._due: list[tuple[float, int, socket.socket, bytes, Address]] = []
        self._seq = itertools.count()
        self._stop = threading.Event()
        self._rebind: list[Address] = []  # clients whose mapping changes (from other threads)
        self._rebound = threading.Event()
        self._retired: list[socket.socket] = []  # old mappings: closed at stop()
        self._thread = threading.Thread(target=self._run, name="impair", daemon=True)

    def start(self) -> ImpairedPath:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in [self._listen, *self._upstream.values(), *self._retired]:
            sock.close()
        self._selector.close()

    def rebind(self, client: Address | None = None) -> None:
        """Give `client` (None: every client so far) a new upstream socket, as a NAT that
        rebinds: what it sends from now on leaves from a new port, and replies to the old
        one are lost. Returns once the proxy's thread has done it."""
        clients = [client] if client is not None else list(self._upstream)
        if clients:
            self._rebound.clear()
            self._rebind.extend(clients)
            self._rebound.wait(5)

    def _schedule(
        self,
        way: str,
        impairment: Impairment,
        sock: socket.socket,
        data: bytes,
        dest: Address,
        now: float,
    ) -> None:
        if self._random.random() < impairment.loss:
            self.counts[f"{way}_lost"] += 1
            return
        self.counts[way] += 1
        at = now + impairment.delay + self._random.uniform(0, impairment.jitter)
        heapq.heappush(self._due, (at, next(self._seq), sock, data, dest))

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._rebind:
                while self._rebind:
                    old = self._upstream.pop(self._rebind.pop(), None)
                    if old is not None:  # what is queued on it still leaves from it
                        self._selector.unregister(old)
                        self._retired.append(old)
                self._rebound.set()
            now = time.monotonic()
            while self._due and self._due[0][0] <= now:
                _, _, sock, data, dest = heapq.heappop(self._due)
                try:
                    sock.sendto(data, dest)
                except OSError:
                    pass  # as a network would: lost
            timeout = 0.05 if not self._due else max(0.0, self._due[0][0] - now)
            for key, _ in self._selector.select(min(timeout, 0.05)):
                self._read(key.fileobj, key.data)  # type: ignore[arg-type]

    def _read(self, sock: socket.socket, client: Address | None) -> None:
        for _ in range(64):
            try:
                data, src = sock.recvfrom(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue  # an ICMP error for an earlier send
            now = time.monotonic()
            if client is None:  # from a client, on the listening socket
                upstream = self._upstream.get(src)
                if upstream is None:
                    upstream = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    upstream.bind((self.host, 0))
                    upstream.setblocking(False)
                    self._upstream[src] = upstream
                    self._selector.register(upstream, selectors.EVENT_READ, src)
                self._schedule("up", self.up, upstream, data, self.target, now)
            else:
                self._schedule("down", self.down, self._listen, data, client, now)
