"""recvmmsg/sendmmsg through ctypes (shared/mmsg.py), on real loopback sockets, IPv4 and
IPv6: batches larger and smaller than what is queued, empty and oversized datagrams,
connected and addressed sends, a send that fails in the middle of a batch, errors
counted and never raised, and the bound on the decoded-address cache."""

from __future__ import annotations

import errno
import socket
from collections.abc import Iterator

import pytest

from firsthop.shared.mmsg import (
    SLOT,
    Receiver,
    Sender,
    decode_sockaddr,
    encode_sockaddr,
    send_batch,
)

FAMILIES = [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]


def udp(family: int, host: str) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.bind((host, 0))
    sock.setblocking(False)
    return sock


@pytest.fixture(params=FAMILIES, ids=["v4", "v6"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[socket.socket, socket.socket]]:
    family, host = request.param
    a, b = udp(family, host), udp(family, host)
    yield a, b
    a.close()
    b.close()


def where(sock: socket.socket) -> tuple[str, int]:
    name = sock.getsockname()
    return name[0], name[1]


def test_receives_a_batch_with_lengths_and_sources(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    for i in range(5):
        b.sendto(bytes([i]) * (10 * i + 1), where(a))
    rx = Receiver(8, 100, headroom=52)
    assert rx.receive(a.fileno()) == 5
    assert rx.lengths[:5] == [1, 11, 21, 31, 41]
    assert rx.sources[:5] == [where(b)] * 5
    assert bytes(rx.payload(3)) == bytes([3]) * 31
    # the payload sits past the headroom, so a header can be written in front of it
    assert rx.arena[3 * rx.stride + 52] == 3
    assert rx.receive(a.fileno()) == 0  # EAGAIN: nothing queued, nothing counted
    assert rx.errors == 0


def test_a_partial_batch_then_the_rest(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    for i in range(7):
        b.sendto(i.to_bytes(2, "big"), where(a))
    rx = Receiver(3, 64)
    got = []
    while n := rx.receive(a.fileno()):
        got += [int.from_bytes(rx.payload(i), "big") for i in range(n)]
    assert got == list(range(7))


def test_empty_and_oversized_datagrams(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.sendto(b"", where(a))
    b.sendto(b"x" * 500, where(a))
    b.sendto(b"y" * 100, where(a))
    rx = Receiver(4, 100)
    assert rx.receive(a.fileno()) == 3
    assert rx.lengths[:3] == [0, 100, 100]
    assert [rx.truncated(i) for i in range(3)] == [False, True, False]


def test_connected_send_in_one_call(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    b.connect(where(a))
    rx = Receiver(4, 64, headroom=8)
    a_fd = a.fileno()
    b.send(b"one")
    b.send(b"two")
    assert rx.receive(a_fd) == 2
    # send both back as they are, from where they were received: no copy
    a.connect(where(b))
    tx = Sender(4, connected=True)
    for i in range(2):
        tx.add(rx.base + i * rx.stride + rx.headroom, rx.lengths[i])
    assert tx.flush(a_fd) == 2
    assert tx.dropped == 0
    assert [b.recv(64) for _ in range(2)] == [b"one", b"two"]


def test_addressed_sends_of_any_buffer(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    payloads = [b"bytes", bytearray(b"bytearray"), memoryview(b"__view__")[2:6], b""]
    assert send_batch(b, [(p, where(a)) for p in payloads], count=3) == (4, 0)
    rx = Receiver(8, 64)
    assert rx.receive(a.fileno()) == 4
    assert [bytes(rx.payload(i)) for i in range(4)] == [b"bytes", b"bytearray", b"view", b""]
    assert rx.sources[:4] == [where(b)] * 4


def test_bytes_are_copied_into_the_senders_own_slots_batch_after_batch(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """`bytes` up to SLOT go through the sender's arena (one slot per entry, reused by the
    next batch); a longer one, through a copy of its own."""
    a, b = pair
    tx = Sender(3)
    rx = Receiver(4, SLOT + 8)
    for batch in ([b"a" * SLOT, b"b" * (SLOT + 1), b"c"], [b"d", b"e" * 10, b"f" * SLOT]):
        for payload in batch:
            tx.add_buffer(payload, where(a))
        assert tx.flush(b.fileno()) == 3
        assert rx.receive(a.fileno()) == 3
        assert [bytes(rx.payload(i)) for i in range(3)] == batch


def test_a_failed_send_in_the_middle_is_counted_and_the_rest_go(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    a, b = pair
    tx = Sender(4)
    tx.add_buffer(b"first", where(a))
    tx.add_buffer(b"z" * 70_000, where(a))  # EMSGSIZE: sendmmsg stops after the first
    tx.add_buffer(b"third", where(a))
    assert tx.flush(b.fileno()) == 2
    assert tx.dropped == 1
    assert tx.errnos[errno.EMSGSIZE] == 1
    rx = Receiver(4, 64)
    assert rx.receive(a.fileno()) == 2
    assert [bytes(rx.payload(i)) for i in range(2)] == [b"first", b"third"]


def test_a_full_socket_buffer_leaves_the_rest_unsent_as_would_block() -> None:
    """EAGAIN mid-batch (a Unix datagram socket whose peer reads nothing fills at once): what
    went is `sent`, the rest `dropped`, all of it `would_block`; the next flush starts clean."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        a.setblocking(False)
        tx = Sender(256, connected=True)
        for _ in range(256):
            tx.add_buffer(b"x" * 1000)
        sent = tx.flush(a.fileno())
        assert 0 < sent < 256
        assert tx.dropped == tx.would_block == 256 - sent
        assert tx.errnos[errno.EAGAIN] == 1
        while True:  # the peer reads it all: room again
            try:
                b.recv(2000, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
        tx.add_buffer(b"y")
        assert tx.flush(a.fileno()) == 1
        assert tx.dropped == tx.would_block == 0
        assert b.recv(10) == b"y"
    finally:
        a.close()
        b.close()


def test_errors_are_counted_never_raised(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    gone = udp(a.family, where(a)[0])
    dead = where(gone)
    gone.close()
    a.connect(dead)
    tx = Sender(2, connected=True)
    tx.add_buffer(b"ping")
    tx.flush(a.fileno())
    rx = Receiver(2, 64)
    # the ICMP port unreachable comes back as ECONNREFUSED on the connected socket
    assert rx.receive(a.fileno()) == 0
    assert rx.errnos[errno.ECONNREFUSED] == 1
    assert rx.receive(-1) == 0
    assert rx.errnos[errno.EBADF] == 1
    tx.add_buffer(b"x")
    assert tx.flush(-1) == 0
    assert tx.dropped == 1
    assert tx.errnos[errno.EBADF] == 1


def test_the_source_cache_is_bounded() -> None:
    a = udp(socket.AF_INET, "127.0.0.1")
    senders = [udp(socket.AF_INET, "127.0.0.1") for _ in range(6)]
    rx = Receiver(8, 16, max_sources=4)
    for s in senders:
        s.sendto(b"hi", where(a))
    assert rx.receive(a.fileno()) == 6
    assert rx.sources[:6] == [where(s) for s in senders]
    assert len(rx._cache) == 4  # the newest four
    senders[0].sendto(b"again", where(a))  # evicted: decoded again, still right
    assert rx.receive(a.fileno()) == 1
    assert rx.sources[0] == where(senders[0])
    assert len(rx._cache) == 4
    for s in (a, *senders):
        s.close()


def test_the_destination_cache_is_bounded() -> None:
    sinks = [udp(socket.AF_INET, "127.0.0.1") for _ in range(5)]
    out = udp(socket.AF_INET, "127.0.0.1")
    tx = Sender(8, max_destinations=2)
    for s in sinks:
        tx.add_buffer(b"to you", where(s))
    assert len(tx._names) == 2
    assert tx.flush(out.fileno()) == 5  # evicted names were kept alive until the flush
    assert [s.recv(16) for s in sinks] == [b"to you"] * 5
    for s in (out, *sinks):
        s.close()


@pytest.mark.parametrize(
    "addr", [("127.0.0.1", 3478), ("10.1.2.3", 1), ("::1", 5004), ("2001:db8::5", 65535)]
)
def test_sockaddr_round_trip(addr: tuple[str, int]) -> None:
    assert decode_sockaddr(encode_sockaddr(addr)) == addr
    assert decode_sockaddr(bytes(16)) is None  # AF_UNSPEC
