"""ICE-TCP ingress (RFC 6544, passive side): callers whose UDP is blocked reach the relay on
TCP (443 in production) and speak RFC 4571 frames; each frame is one datagram of the flow.

Runs in the data-plane thread (`dataplane.py`), in its epoll set: the flow table belongs to
that thread, and a frame takes the same path as a UDP datagram from there on. A connection
is keyed by its remote (ip, port) — unique per live connection to one listener — and the
flow table keeps its flows apart from UDP ones (`FlowTable.on_tcp_client`), so a flow is
pinned to the connection that opened it and ends when it closes.

Bounds (`RelayLimits.tcp_*`, counted in `closed` by reason, or as drops):

* connections per source IP (an IPv6 source by its /64) and in total: beyond, a new
  connection is reset at accept;
* slow-loris: the first frame, a STUN Binding request with a valid route token, must arrive
  within `tcp_first_frame_timeout` of accept; after that, a connection with no complete
  frame for `tcp_idle_timeout` is closed (a peer trickling a frame byte by byte gets no
  more time than one that sends nothing);
* the first frame must open a flow (anything the table refuses closes the connection), and
  a connection whose flow the table let go of (expired, revoked, displaced) is closed at its
  next frame;
* frame size: a LENGTH above `MAX_DATAGRAM` (no WebRTC packet is larger) resets the
  connection; the read side holds at most one read's whole frames not yet handled and one
  partial frame;
* work: a pass of the loop handles at most `FRAMES_PER_EVENT` frames of one connection
  (empty ones count; a connection not yet routed, one: its first must be its check, and an
  empty one resets it); the rest of that read waits in its deframer (`backlog`), the socket
  is not read before it is handled, and the loop comes back for it without waiting. A read
  of thousands of tiny frames holds every other caller up for 64 frames' work, not 8,192;
* rate: a connection's frames past `FRAME_RATE` a second (burst `FRAME_BURST`, what a
  transceiver's session takes) are dropped and counted (`tcp_rate_limited`): RFC 4571's
  two-byte frames cannot turn one TCP segment into hundreds of datagrams to a transceiver;
* write side: bytes queued toward a slow reader are capped at `tcp_write_buffer` per
  connection and `tcp_write_budget` for all of a worker's connections; a frame that does not
  fit is dropped and counted (`tcp_write_buffer_full`, `tcp_write_budget_full`), as a full
  UDP path would lose it. (The tail of a frame the kernel took only in part is always kept:
  dropping it would corrupt the stream; that is at most one frame per connection.)
"""

from __future__ import annotations

import errno
import select
import socket
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from firsthop.services.relay.flows import MAX_DATAGRAM, RelayLimits
from firsthop.shared.address import Address, ip_family, source_key
from firsthop.shared.ratelimit import TokenBucket
from firsthop.shared.wire.rfc4571 import Deframer, FramingError, prefix

ACCEPT_BATCH = 64  # connections accepted per wake-up
READ_BATCH = 4  # reads per connection per wake-up (level-triggered: the rest comes next turn)
READ_SIZE = 16 * 1024
FRAMES_PER_EVENT = 64  # frames of one connection a pass handles (a call sends ~100 a second)
FRAME_RATE, FRAME_BURST = 1000.0, 2000.0  # a connection's frames a second (a session's rate)
BACKLOG = 1024
KERNEL_SEND_BUFFER = 64 * 1024  # SO_SNDBUF of a caller's connection (the kernel doubles it)
KERNEL_RECEIVE_BUFFER = 64 * 1024  # SO_RCVBUF: what a flooding caller holds in the kernel
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER {on, 0 s}: close() sends RST


@dataclass(eq=False, slots=True)
class Connection:
    sock: socket.socket
    client: Address
    accepted: float
    last_frame: float
    frames: TokenBucket
    deframer: Deframer = field(default_factory=lambda: Deframer(MAX_DATAGRAM))
    out: bytearray = field(default_factory=bytearray)
    routed: bool = False  # its first frame opened a flow
    writing: bool = False  # EPOLLOUT is armed (`out` is not empty)


# What the data plane does with a frame: None, or why the connection must close.
FrameHandler = Callable[[Connection, bytes, float], str | None]


def tcp_listener(addr: Address, *, reuseport: bool, listen: bool = True) -> socket.socket:
    """A TCP socket for `addr` (SO_REUSEPORT: every worker process accepts on the same port
    and the kernel spreads connections between them). An IPv6 one is IPV6_V6ONLY, so
    `[::]` and `0.0.0.0` on one port are two listeners and no v4-mapped peer appears."""
    v6 = ip_family(addr[0]) == 6
    sock = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_STREAM)
    try:
        if v6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuseport:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(addr)
        if listen:
            sock.listen(BACKLOG)
            sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


class TcpIngress:
    def __init__(
        self,
        listeners: list[socket.socket],
        limits: RelayLimits,
        *,
        on_frame: FrameHandler,
        on_close: Callable[[Address], None],
        count_drop: Callable[[str], None],
    ) -> None:
        # one listener per IP family (--listen-tcp 0.0.0.0:443,[::]:443)
        self.listen_fds = {sock.fileno(): sock for sock in listeners}
        self.limits = limits
        self.on_frame = on_frame
        self.on_close = on_close
        self.count_drop = count_drop
        self.by_fd: dict[int, Connection] = {}
        self.by_client: dict[Address, Connection] = {}
        self.per_ip: Counter[str] = Counter()  # by `source_key`
        self.accepted = 0
        self.queued = 0  # bytes waiting in every connection's `out`
        self.closed: Counter[str] = Counter()  # by reason
        self._ep: select.epoll | None = None
        self._buf = bytearray(READ_SIZE)
        # connections whose deframer holds frames a pass did not handle (by fd): the loop
        # serves them without waiting (`serve_backlog`)
        self.backlog: dict[int, Connection] = {}
        self._resting: list[int] = []  # listeners paused while descriptors ran out

    def attach(self, ep: select.epoll) -> None:
        self._ep = ep
        for fd in self.listen_fds:
            ep.register(fd, select.EPOLLIN)

    # -- events ------------------------------------------------------------------------------

    def on_event(self, fd: int, events: int, now: float) -> None:
        listener = self.listen_fds.get(fd)
        if listener is not None:
            self._accept(listener, now)
            return
        conn = self.by_fd.get(fd)
        if conn is None:
            return
        if events & select.EPOLLOUT and not self._flush(conn):
            return
        if events & (select.EPOLLIN | select.EPOLLHUP | select.EPOLLERR):
            self._read(conn, now)

    def _accept(self, listener: socket.socket, now: float) -> None:
        lim = self.limits
        for _ in range(ACCEPT_BATCH):
            try:
                sock, addr = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # ECONNABORTED, EMFILE...: the listener itself is fine
                self.closed["accept_error"] += 1
                if exc.errno in (errno.EMFILE, errno.ENFILE) and self._ep is not None:
                    # Out of descriptors: the waiting connection keeps the (level-triggered)
                    # listener readable, which would spin. Rest it until the next sweep.
                    self._ep.modify(listener.fileno(), 0)
                    self._resting.append(listener.fileno())
                return
            client: Address = (addr[0], addr[1])  # (an IPv6 peer's flowinfo, scope dropped)
            source = source_key(client[0])
            if len(self.by_fd) >= lim.tcp_max_connections:
                self._refuse(sock, "connection_limit")
                continue
            if self.per_ip[source] >= lim.tcp_max_per_ip:
                self._refuse(sock, "connections_per_ip")
                continue
            old = self.by_client.get(client)
            if old is not None:  # the same address again (a NAT reused it): start afresh
                self.close(old, "replaced", reset=True)
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # The kernel's own send buffer (autotuned to MBs) is bounded too, so a caller
            # that stops reading holds little beyond `tcp_write_buffer` in the relay.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, KERNEL_SEND_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, KERNEL_RECEIVE_BUFFER)
            conn = Connection(sock, client, now, now, TokenBucket(FRAME_RATE, FRAME_BURST, now))
            self.by_fd[sock.fileno()] = conn
            self.by_client[client] = conn
            self.per_ip[source] += 1
            self.accepted += 1
            if self._ep is not None:
                self._ep.register(sock.fileno(), select.EPOLLIN)

    def _refuse(self, sock: socket.socket, reason: str) -> None:
        self.closed[reason] += 1
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        finally:
            sock.close()

    def _read(self, conn: Connection, now: float) -> None:
        """Handle up to a pass's frames of `conn`: those its deframer holds first, then
        what the socket has (up to READ_BATCH reads)."""
        buf = self._buf
        deframer = conn.deframer
        budget = FRAMES_PER_EVENT if conn.routed else 1
        n = 0
        for _ in range(READ_BATCH):
            held = deframer.more  # a read's frames a pass left: they go before the socket
            if not held:
                try:
                    n = conn.sock.recv_into(buf)
                except BlockingIOError:
                    break
                except OSError:
                    self.close(conn, "reset")
                    return
                if n == 0:
                    self.close(conn, "eof")
                    return
            try:
                frames = deframer.feed(b"" if held else memoryview(buf)[:n], budget)
            except FramingError as exc:
                self.close(conn, exc.reason, reset=True)
                return
            budget -= len(frames)
            for data in frames:
                if not data:
                    if not conn.routed:  # RFC 6544: a caller's first frame is its check
                        self.close(conn, "empty_first_frame", reset=True)
                        return
                    continue  # an empty frame carries nothing (RFC 4571 allows it)
                conn.last_frame = now
                if not conn.frames.take(now):
                    self.count_drop("tcp_rate_limited")
                    continue
                reason = self.on_frame(conn, data, now)
                if reason is not None:
                    self.close(conn, reason, reset=True)
                    return
                conn.routed = True
            if budget <= 0 or (not held and n < READ_SIZE):
                break
        fd = conn.sock.fileno()
        if deframer.more:
            self.backlog[fd] = conn
        else:
            self.backlog.pop(fd, None)

    def serve_backlog(self, now: float) -> None:
        """A pass for each connection whose deframer holds frames a pass left (the loop
        calls this after its events, and polls without waiting while there are any)."""
        for conn in list(self.backlog.values()):
            if self.by_fd.get(conn.sock.fileno()) is conn:
                self._read(conn, now)

    # -- the reply path ------------------------------------------------------------------------

    def send(self, client: Address, payload: bytes | memoryview) -> bool:
        """Frame `payload` onto `client`'s connection; False (counted) if it is gone or
        its write buffer is full."""
        conn = self.by_client.get(client)
        if conn is None:
            self.count_drop("tcp_no_connection")
            return False
        n = len(payload)
        length = prefix(n)  # (a reply over 65,535 bytes cannot come: datagrams are < 1,500)
        if conn.out:
            if len(conn.out) + 2 + n > self.limits.tcp_write_buffer:
                self.count_drop("tcp_write_buffer_full")
                return False
            if self.queued + 2 + n > self.limits.tcp_write_budget:
                self.count_drop("tcp_write_budget_full")
                return False
            conn.out += length
            conn.out += payload
            self.queued += 2 + n
            return True
        try:
            sent = conn.sock.sendmsg((length, payload))
        except BlockingIOError:
            sent = 0
        except OSError:
            self.close(conn, "reset")
            self.count_drop("send_error")
            return False
        if sent < 2 + n:
            rest = (length + bytes(payload))[sent:]
            conn.out += rest
            self.queued += len(rest)
            self._want_write(conn, True)
        return True

    def _flush(self, conn: Connection) -> bool:
        """Write what is queued; False if the connection closed."""
        try:
            sent = conn.sock.send(conn.out)
        except BlockingIOError:
            return True
        except OSError:
            self.close(conn, "reset")
            return False
        del conn.out[:sent]
        self.queued -= sent
        if not conn.out:
            self._want_write(conn, False)
        return True

    def _want_write(self, conn: Connection, on: bool) -> None:
        if conn.writing == on or self._ep is None:
            return
        conn.writing = on
        mask = select.EPOLLIN | (select.EPOLLOUT if on else 0)
        self._ep.modify(conn.sock.fileno(), mask)

    # -- housekeeping ----------------------------------------------------------------------------

    def sweep(self, now: float) -> None:
        """Close connections past their first-frame deadline or idle too long; listen again
        on listeners that rested."""
        lim = self.limits
        if self._ep is not None:
            for fd in self._resting:
                self._ep.modify(fd, select.EPOLLIN)
        self._resting.clear()
        for conn in list(self.by_fd.values()):
            if not conn.routed:
                if now - conn.accepted > lim.tcp_first_frame_timeout:
                    self.close(conn, "first_frame_timeout", reset=True)
            elif now - conn.last_frame > lim.tcp_idle_timeout:
                self.close(conn, "idle")

    def close(self, conn: Connection, reason: str, *, reset: bool = False) -> None:
        fd = conn.sock.fileno()
        if self.by_fd.get(fd) is not conn:
            return
        del self.by_fd[fd]
        self.backlog.pop(fd, None)
        self.queued -= len(conn.out)
        owner = self.by_client.get(conn.client) is conn
        if owner:
            del self.by_client[conn.client]
        source = source_key(conn.client[0])
        left = self.per_ip[source] - 1
        if left > 0:
            self.per_ip[source] = left
        else:
            del self.per_ip[source]
        if self._ep is not None:
            try:
                self._ep.unregister(fd)
            except OSError:
                pass
        self.closed[reason] += 1
        try:
            if reset:
                conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        except OSError:
            pass
        conn.sock.close()
        if owner:  # (a connection replaced by a newer one from its address has no flow)
            self.on_close(conn.client)

    def close_all(self) -> None:
        for conn in list(self.by_fd.values()):
            self.close(conn, "shutdown")
        if self._ep is not None:
            for fd in self.listen_fds:
                try:
                    self._ep.unregister(fd)
                except OSError:
                    pass

    @property
    def connections(self) -> int:
        return len(self.by_fd)
