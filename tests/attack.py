"""What the attack tests need on loopback: spoofed sources, and a NAT in the caller's path.

* `Spoofer` sends UDP datagrams from any 127.0.0.0/8 source address and port through a raw
  socket (IP_HDRINCL; root only): 200k distinct sources cost no file descriptors.
* `Nat` stands between a caller and the relay like a home router: the caller sends to its
  inside address (advertised to the caller as the ingress), it forwards from one outside
  port, and can rebind to another port mid-call (what a NAT does when its mapping times out)
  or go silent both ways (the caller vanished).
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
from collections.abc import Iterator

from firsthop.shared.address import Address


class Spoofer:
    def __init__(self) -> None:
        if os.geteuid() != 0:
            raise RuntimeError("spoofed sources need a raw socket: run the tests as root")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
        self.sent = 0

    def send(self, src: Address, dst: Address, payload: bytes) -> None:
        udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload
        # Version 4, IHL 5; total length, id and checksum are filled in by the kernel.
        ip = struct.pack(
            "!BBHHHBBH4s4s",
            0x45,
            0,
            0,
            0,
            0,
            64,
            socket.IPPROTO_UDP,
            0,
            socket.inet_aton(src[0]),
            socket.inet_aton(dst[0]),
        )
        self.sock.sendto(ip + udp, (dst[0], 0))
        self.sent += 1

    def close(self) -> None:
        self.sock.close()


def spoofed_sources(count: int, start: int = 0) -> Iterator[Address]:
    """`count` distinct source addresses in 127.64.0.0/10, one port each."""
    for i in range(start, start + count):
        yield (f"127.{64 + (i >> 16) % 64}.{(i >> 8) & 0xFF}.{i & 0xFF or 1}", 1024 + i % 60000)


class Nat:
    """A one-caller UDP NAT on loopback, run by a thread."""

    def __init__(self, upstream: Address) -> None:
        self.upstream = upstream
        self.inside = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.inside.bind(("127.0.0.1", 0))
        self.inside_addr: Address = self.inside.getsockname()
        self.outside = self._outside()
        self.caller: Address | None = None
        self.silent = False
        self.rebinds = 0
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @staticmethod
    def _outside() -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        return sock

    @property
    def outside_addr(self) -> Address:
        addr: Address = self.outside.getsockname()
        return addr

    def rebind(self) -> None:
        """The mapping changes: from now on the caller's traffic leaves from a new port."""
        with self._lock:
            old, self.outside = self.outside, self._outside()
            self.rebinds += 1
        old.close()

    def _run(self) -> None:
        while not self._stop:
            with self._lock:
                inside, outside = self.inside, self.outside
            try:
                ready, _, _ = select.select([inside, outside], [], [], 0.05)
            except (OSError, ValueError):
                continue  # the outside socket was replaced under us
            for sock in ready:
                try:
                    data, src = sock.recvfrom(4096)
                except OSError:
                    continue
                if self.silent:
                    continue
                try:
                    if sock is inside:
                        self.caller = src
                        self.outside.sendto(data, self.upstream)
                    elif self.caller is not None:
                        inside.sendto(data, self.caller)
                except OSError:
                    continue  # rebound meanwhile: that datagram is lost, as in a real NAT

    def close(self) -> None:
        self._stop = True
        self._thread.join(2)
        self.inside.close()
        self.outside.close()
