"""The shared socket's batched sends (`Transceiver._batch_end`) on a real UDP socket: what the
kernel takes is counted `packets_out`, and each datagram it refuses (too big, an address of
the other family) one `send_error`, once: a later clean batch counts nothing again."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from firsthop.services.transceiver.service import Transceiver, TransceiverConfig


@pytest.fixture
def rig() -> Iterator[tuple[Transceiver, socket.socket]]:
    tx = Transceiver(TransceiverConfig(media=("127.0.0.1", 0), api=("127.0.0.1", 0)))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.settimeout(5)
    tx._sock = sock  # (what the receive loop sets)
    yield tx, sink
    sock.close()
    sink.close()


def batch(tx: Transceiver, items: list[tuple[bytes, tuple[str, int]]]) -> None:
    tx._batch_start()
    for data, dest in items:
        tx._send(data, dest)
    tx._batch_end()


def test_a_batch_counts_what_was_sent_and_each_refused_datagram_once(
    rig: tuple[Transceiver, socket.socket],
) -> None:
    tx, sink = rig
    dest = sink.getsockname()
    batch(tx, [(b"one", dest), (b"x" * 70_000, dest), (b"two", ("::1", 9)), (b"three", dest)])
    assert [sink.recv(100) for _ in range(2)] == [b"one", b"three"]
    assert tx.counters["packets_out"] == 2
    assert tx.counters["send_error"] == 2  # EMSGSIZE from the kernel; the IPv6 address here
    assert tx.counters["send_would_block"] == 0
    batch(tx, [(b"four", dest), (b"five", dest)])  # a clean batch: nothing counted again
    assert [sink.recv(100) for _ in range(2)] == [b"four", b"five"]
    assert tx.counters["packets_out"] == 4 and tx.counters["send_error"] == 2
    batch(tx, [(b"y" * 70_000, dest), (b"six", dest)])  # a later refusal: counted once more
    assert sink.recv(100) == b"six"
    assert tx.counters["send_error"] == 3 and tx.counters["packets_out"] == 5
