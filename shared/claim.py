"""Claiming a listen address for one service: refuse to share it with another process.

The relay's workers bind their public sockets with ``SO_REUSEPORT`` so the kernel spreads
clients between them; but any other process of the same user may then join the group, and the
kernel spreads clients to it too. A second ``firsthop up`` did exactly that: it bound
``127.0.0.1:3478`` beside the first, and calls to the first stack hung when their packets
went to the second. So before its workers bind, a relay claims each address it serves:

* a **lock** named after the address, an abstract Unix socket (``\\0firsthop:udp:HOST:PORT``):
  atomic, per network namespace (the scope of a port), gone with the process that held it,
  so two relays starting at the same instant cannot both win;
* a **probe**: a bind of the address *without* ``SO_REUSEPORT``, which the kernel refuses
  while any socket (ours from before, or another program's, reuseport or not) holds it.

`AddressInUse` names the address and who holds it, for one clear line to the user.
`in_use(kind, addr)` is the probe alone, to name the culprit after another bind failed.
"""

from __future__ import annotations

import errno
import socket

from firsthop.shared.address import Address, format_hostport, ip_family

Kind = str  # "udp" | "tcp"


class AddressInUse(OSError):
    """`addr` is already served by another process (`by_firsthop`: one that claimed it)."""

    def __init__(self, kind: Kind, addr: Address, *, by_firsthop: bool = False) -> None:
        who = "another firsthop process" if by_firsthop else "another process"
        super().__init__(
            errno.EADDRINUSE, f"{format_hostport(addr)} ({kind}) is already served by {who}"
        )
        self.kind, self.addr, self.by_firsthop = kind, addr, by_firsthop


def _probe(kind: Kind, addr: Address) -> socket.socket:
    family = socket.AF_INET6 if ip_family(addr[0]) == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM)
    try:
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as the relay binds
        if kind == "tcp":  # a closed connection's TIME_WAIT is no one serving
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except BaseException:
        sock.close()
        raise
    return sock


def in_use(kind: Kind, addr: Address) -> bool:
    """Whether some socket holds `addr` now (a bind without SO_REUSEPORT is refused)."""
    try:
        _probe(kind, addr).close()
    except OSError as exc:
        return exc.errno == errno.EADDRINUSE
    return False


def lock(kind: Kind, addr: Address) -> socket.socket:
    """The lock alone: for an address this process has just bound (a port 0 it was given),
    which no one else can hold. Raises `AddressInUse` if another claimed it."""
    held = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        held.bind(f"\0firsthop:{kind}:{format_hostport(addr)}")
    except OSError as exc:
        held.close()
        if exc.errno == errno.EADDRINUSE:
            raise AddressInUse(kind, addr, by_firsthop=True) from None
        raise
    return held


def claim(kind: Kind, addr: Address) -> socket.socket:
    """Claim `addr` for this process: the returned lock socket holds the claim until it is
    closed (or the process ends). Raises `AddressInUse`."""
    lock_ = lock(kind, addr)
    try:
        if in_use(kind, addr):
            raise AddressInUse(kind, addr)
    except BaseException:
        lock_.close()
        raise
    return lock_
