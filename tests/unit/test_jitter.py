from __future__ import annotations

from dataclasses import dataclass

from firsthop.services.transceiver.jitter import CALM, MAX_DEPTH, Frame, LowLatencyJitterBuffer


@dataclass
class Pkt:
    sequence_number: int
    timestamp: int
    payload_type: int = 111
    _data: bytes = b""


def feed(buf: LowLatencyJitterBuffer, seqs: list[int]) -> list[int]:
    out: list[Frame] = []
    buf.sink = out.append
    for s in seqs:
        buf.add(Pkt(s & 0xFFFF, (s * 960) & 0xFFFFFFFF, _data=s.to_bytes(4, "big", signed=True)))
    return [int.from_bytes(f.data, "big", signed=True) for f in out]


def test_in_order_packets_are_released_at_once() -> None:
    buf = LowLatencyJitterBuffer()
    out: list[Frame] = []
    buf.sink = out.append
    for s in range(5):
        buf.add(Pkt(s, s * 960, _data=bytes([s])))
        assert len(out) == s + 1  # no added delay on a clean link
    assert buf.depth == 0


def test_gap_skipped_at_depth_zero_and_late_packet_widens_the_window() -> None:
    buf = LowLatencyJitterBuffer()
    assert feed(buf, [1, 2, 4, 5]) == [1, 2, 4, 5]
    assert buf.skipped == 1
    feed(buf, [3])  # too late: dropped, but now we wait for reordering
    assert buf.depth == 1
    assert feed(buf, [7, 6, 8]) == [6, 7, 8]  # a reorder inside the window is repaired


def test_window_shrinks_after_calm_and_is_bounded() -> None:
    buf = LowLatencyJitterBuffer()
    seq = 0
    for _ in range(10):  # persistent late arrivals
        feed(buf, [seq, seq + 2, seq + 3, seq + 4, seq + 5, seq + 6, seq + 1])
        seq += 7
    assert buf.depth == MAX_DEPTH
    feed(buf, list(range(seq, seq + CALM * MAX_DEPTH + 10)))
    assert buf.depth == 0


def test_sequence_wraparound() -> None:
    buf = LowLatencyJitterBuffer()
    # sequence numbers wrap at 2^16; the payloads carry the unwrapped count
    assert feed(buf, [65534, 65535, 65536, 65537]) == [65534, 65535, 65536, 65537]


def test_without_sink_returns_one_frame_per_packet() -> None:
    buf = LowLatencyJitterBuffer()
    _, frame = buf.add(Pkt(10, 0, _data=b"a"))
    assert frame is not None and frame.data == b"a"
