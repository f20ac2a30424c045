"""The relay's ICE-TCP ingress on its own (`TcpIngress`), driven by hand on loopback sockets:
what the data plane's loop would do, one step at a time."""

from __future__ import annotations

import select
import socket
import struct

from firsthop.services.relay.flows import RelayLimits
from firsthop.services.relay.tcp_ingress import (
    FRAME_BURST,
    FRAMES_PER_EVENT,
    KERNEL_SEND_BUFFER,
    TcpIngress,
    tcp_listener,
)
from firsthop.shared.address import Address
from firsthop.shared.wire.rfc4571 import frame


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


def accepted(
    frames: list[bytes], drops: list[str]
) -> tuple[TcpIngress, socket.socket, socket.socket]:
    """An ingress whose frame handler records what it is handed, a caller connected to it
    and accepted, and the listener."""
    listener = tcp_listener(("127.0.0.1", 0), reuseport=False)
    listener.setblocking(False)

    def on_frame(conn: object, data: bytes, now: float) -> None:
        frames.append(data)

    tcp = TcpIngress(
        [listener],
        RelayLimits(),
        on_frame=on_frame,
        on_close=lambda _: None,
        count_drop=drops.append,
    )
    caller = connect(listener)
    tcp._accept(listener, 0.0)
    return tcp, caller, listener


def test_a_pass_handles_a_bounded_number_of_a_connections_frames_the_rest_next_passes() -> None:
    """A caller's one write of thousands of one-byte frames: each pass handles at most
    FRAMES_PER_EVENT of them (the first, before the connection is routed, alone), the socket
    is not read while its frames wait, the loop is told to come back (`backlog`), and every
    frame is handled in order, up to the connection's burst; the rest are counted drops."""
    frames: list[bytes] = []
    drops: list[str] = []
    tcp, caller, listener = accepted(frames, drops)
    (conn,) = tcp.by_fd.values()
    flood = b"".join(frame(bytes([i % 256])) for i in range(3000))
    caller.sendall(frame(b"check") + flood)
    assert select.select([conn.sock], [], [], 5)[0]
    tcp._read(conn, 0.0)
    assert frames == [b"check"] and list(tcp.backlog.values()) == [conn]
    tcp.serve_backlog(0.0)
    assert len(frames) == 1 + FRAMES_PER_EVENT
    passes = 2
    while tcp.backlog or select.select([conn.sock], [], [], 0)[0]:
        before = len(frames) + len(drops)
        if tcp.backlog:
            tcp.serve_backlog(0.0)
        else:
            tcp._read(conn, 0.0)
        assert len(frames) + len(drops) - before <= FRAMES_PER_EVENT
        passes += 1
    assert frames[1:] == [bytes([i % 256]) for i in range(int(FRAME_BURST) - 1)]
    assert drops == ["tcp_rate_limited"] * (3001 - int(FRAME_BURST))
    assert passes >= 3000 // FRAMES_PER_EVENT
    caller.close()
    tcp.close_all()
    listener.close()


def test_an_empty_first_frame_resets_the_connection() -> None:
    """RFC 6544: a caller's first frame is its check; an empty one (RFC 4571 allows them
    later) would let a caller with no token make the relay parse a flood for free."""
    frames: list[bytes] = []
    tcp, caller, listener = accepted(frames, [])
    (conn,) = tcp.by_fd.values()
    caller.sendall(frame(b"") * 8000)
    assert select.select([conn.sock], [], [], 5)[0]
    tcp._read(conn, 0.0)
    assert tcp.closed["empty_first_frame"] == 1 and not tcp.by_fd and not tcp.backlog
    assert frames == []
    caller.close()
    tcp.close_all()
    listener.close()
