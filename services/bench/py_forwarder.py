"""The Python floor of `firsthop bench relay`: the C reference forwarder's job, in Python.

`python -m firsthop.services.bench.py_forwarder HOST CPU DEST_HOST DEST_PORT` does what
`c_forwarder.c fwd` does, line for line: client -> dest, receive past a 28-byte PROXY v2 header
(ARCHITECTURE §3) built once per client, one `send` to DEST on an internal socket connected to
it (as the relay's are: in Python a `sendto` converts its address tuple on every call); dest ->
client, only DEST's frames, the header's dst address looked up, one `sendto` from the public
socket with the header cut off. Same loop shape as the relay's data plane (one epoll set, each
ready socket drained until EAGAIN, at most `BATCH`), so the syscalls per packet and per burst
match the C one and the relay's.

What it is for: it has none of the relay's work (no flow table, no token, no bounds, no
counters), so its CPU per packet is what Python itself costs around the same two syscalls.
The relay's cost above it is the relay's own logic; the floor's cost above C is the
interpreter's, which no Python relay can get under. Prints "ready PUBLIC_PORT INTERNAL_PORT"
and runs until killed (it dies with its parent).
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import socket
import sys

from firsthop.shared.address import Address
from firsthop.shared.wire.proxy_v2 import V4_HEADER, build_proxy_v2

BATCH = 256  # as the relay's data plane and the C forwarder
SOCKET_BUFFER = 4 * 1024 * 1024  # as both of them, *BUFFORCE when permitted
MAX_DATAGRAM = 2048
PR_SET_PDEATHSIG = 1
SO_SNDBUFFORCE, SO_RCVBUFFORCE = 32, 33  # Linux <asm-generic/socket.h>


def _die_with_parent() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def forward(host: str, dest: Address) -> None:
    public = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    internal = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for sock in (public, internal):
        for force, plain in (
            (SO_RCVBUFFORCE, socket.SO_RCVBUF),
            (SO_SNDBUFFORCE, socket.SO_SNDBUF),
        ):
            try:
                sock.setsockopt(socket.SOL_SOCKET, force, SOCKET_BUFFER)
            except OSError:
                sock.setsockopt(socket.SOL_SOCKET, plain, SOCKET_BUFFER)
        sock.bind((host, 0))
        sock.setblocking(False)
    internal.connect(dest)  # only DEST's datagrams are received on it, too
    own = public.getsockname()
    print(f"ready {own[1]} {internal.getsockname()[1]}", flush=True)
    ep = select.epoll()
    ep.register(public.fileno(), select.EPOLLIN)
    ep.register(internal.fileno(), select.EPOLLIN)
    up = bytearray(V4_HEADER + MAX_DATAGRAM)
    up_view = memoryview(up)
    payload = up_view[V4_HEADER:]
    down = bytearray(MAX_DATAGRAM)
    down_view = memoryview(down)
    headers: dict[tuple[str, int], bytes] = {}  # client -> its header, built once
    clients: dict[bytes, tuple[str, int]] = {}  # a header's dst bytes -> the client
    recv_up, send_up = public.recvfrom_into, internal.send
    recv_down, send_down = internal.recv_into, public.sendto
    pub_fd = public.fileno()
    while True:
        for fd, _ in ep.poll():
            if fd == pub_fd:
                for _ in range(BATCH):
                    try:
                        n, client = recv_up(payload)
                    except BlockingIOError:
                        break
                    header = headers.get(client)
                    if header is None:
                        header = headers[client] = build_proxy_v2(client, (own[0], own[1]))
                    up[:V4_HEADER] = header
                    try:
                        send_up(up_view[: V4_HEADER + n])
                    except OSError:  # e.g. DEST's port unreachable (ICMP): the packet is lost
                        continue
            else:
                for _ in range(BATCH):
                    try:
                        n = recv_down(down)
                    except BlockingIOError:
                        break
                    except ConnectionRefusedError:  # DEST's port unreachable: as the relay
                        continue
                    if n < V4_HEADER or down[13] != 0x12:
                        continue  # never a reflector: only DEST's frames (connected) go out
                    key = bytes(down_view[20:28])
                    client = clients.get(key)
                    if client is None:
                        ip = socket.inet_ntoa(key[:4])
                        client = clients[key] = (ip, int.from_bytes(key[6:8], "big"))
                    send_down(down_view[V4_HEADER:n], client)


def main(argv: list[str]) -> int:
    host, cpu, dest_host, dest_port = argv
    _die_with_parent()
    if int(cpu) >= 0:
        os.sched_setaffinity(0, {int(cpu)})
    forward(host, (dest_host, int(dest_port)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
