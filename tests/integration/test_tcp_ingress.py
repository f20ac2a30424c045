"""The relay's ICE-TCP ingress on its own (`TcpIngress`), driven by hand on loopback sockets:
what the data plane's loop would do, one step at a time."""

from __future__ import annotations

import select
import socket
import struct

from firsthop.services.relay.flows import RelayLimits
from firsthop.services.relay.tcp_ingress import KERNEL_SEND_BUFFER, TcpIngress, tcp_listener
from firsthop.shared.address import Address


def ingress() -> tuple[TcpIngress, socket.socket, list[Address]]:
    listener = tcp_listener(("127.0.0.1", 0), reuseport=False)
    listener.setblocking(False)
    closed: list[Address] = []
    tcp = TcpIngress(
        [listener],
        RelayLimits(),
        on_frame=lambda *args: None,
        on_close=closed.append,
        count_drop=lambda reason: None,
    )
    return tcp, listener, closed


def connect(listener: socket.socket, port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.connect(listener.getsockname())
    return sock


def test_a_second_connection_from_the_same_address_replaces_the_first() -> None:
    """A NAT may reuse an address whose old connection the relay never saw end: the old one
    is reset and its flow forgotten, and the new one starts afresh; closing the old does
    not take the new one's flow."""
    tcp, listener, closed = ingress()
    first = connect(listener)
    port = first.getsockname()[1]
    tcp._accept(listener, 0.0)
    (old,) = tcp.by_fd.values()
    first.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    first.close()  # gone, unseen by the relay
    second = connect(listener, port)
    tcp._accept(listener, 1.0)
    (new,) = tcp.by_fd.values()
    assert new is not old and tcp.by_client[("127.0.0.1", port)] is new
    assert tcp.closed["replaced"] == 1 and closed == [("127.0.0.1", port)]
    assert tcp.per_ip["127.0.0.1"] == 1
    tcp.close(old, "late")  # (already closed: nothing happens)
    assert closed == [("127.0.0.1", port)]
    # the kernel buffers little for a caller that stops reading
    assert new.sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * KERNEL_SEND_BUFFER
    second.close()
    tcp.close_all()
    listener.close()


def test_out_of_descriptors_the_listener_rests_until_the_next_sweep() -> None:
    import resource

    tcp, listener, _ = ingress()
    ep = select.epoll()
    tcp.attach(ep)
    waiting = connect(listener)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    spare = [socket.socket() for _ in range(8)]
    try:
        # no descriptor left for accept(): the listener is readable, and must not spin
        highest = max(s.fileno() for s in spare)
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
        filler: list[socket.socket] = []
        try:
            while True:
                filler.append(socket.socket())
        except OSError:
            pass
        tcp._accept(listener, 0.0)
        assert tcp.closed["accept_error"] == 1 and not tcp.by_fd
        assert ep.poll(0.05) == []  # resting: not reported again
        for sock in filler:
            sock.close()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    tcp.sweep(1.0)
    events = ep.poll(1.0)
    assert [fd for fd, _ in events] == [listener.fileno()]  # listening again
    tcp._accept(listener, 1.0)
    assert len(tcp.by_fd) == 1
    waiting.close()
    for sock in spare:
        sock.close()
    tcp.close_all()
    ep.close()
    listener.close()
