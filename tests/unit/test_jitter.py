from __future__ import annotations

from dataclasses import dataclass

from firsthop.services.transceiver.media.jitter import (
    CALM,
    MAX_CONCEALED,
    MAX_DEPTH,
    Frame,
    LowLatencyJitterBuffer,
)


@dataclass
class Pkt:
    sequence_number: int
    timestamp: int
    payload_type: int = 111
    payload: bytes = b""


def feed(buf: LowLatencyJitterBuffer, seqs: list[int], lost: bool = False) -> list[int]:
    """The packets released, in order (with `lost`, a lost frame as -1 - the packet whose
    FEC it carries, or -1 - 0 if none)."""
    out: list[Frame] = []
    buf.sink = out.append
    for s in seqs:
        buf.add(Pkt(s & 0xFFFF, (s * 960) & 0xFFFFFFFF, payload=s.to_bytes(4, "big", signed=True)))
    return [
        -1 - int.from_bytes(f.data or bytes(4), "big") if f.lost else int.from_bytes(f.data, "big")
        for f in out
        if lost or not f.lost
    ]


def test_in_order_packets_are_released_at_once() -> None:
    buf = LowLatencyJitterBuffer()
    out: list[Frame] = []
    buf.sink = out.append
    for s in range(5):
        buf.add(Pkt(s, s * 960, payload=bytes([s])))
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
    _, frame = buf.add(Pkt(10, 0, payload=b"a"))
    assert frame is not None and frame.data == b"a"


def test_a_lost_packet_leaves_a_lost_frame_carrying_the_next_packet_for_its_fec() -> None:
    buf = LowLatencyJitterBuffer()
    assert feed(buf, [1, 2, 4, 5], lost=True) == [1, 2, -1 - 4, 4, 5]
    frames: list[Frame] = []
    buf.sink = frames.append
    buf.add(Pkt(7, 7 * 960, payload=b"seven"))  # 6 lost, 7 here: its FEC may carry 6
    lost = frames[0]
    assert lost.lost and lost.data == b"seven" and lost.timestamp == 6 * 960
    assert lost.payload_type == 111 and buf.concealed == 2


def test_a_burst_is_concealed_only_up_to_a_bound_and_not_before_the_first_packet() -> None:
    buf = LowLatencyJitterBuffer()
    out = feed(buf, [10, 30], lost=True)  # 19 lost: the first few repaired, then silence
    assert out[0] == 10 and out[-1] == 30
    assert len(out) == 2 + MAX_CONCEALED and buf.concealed == MAX_CONCEALED
    assert all(v == -1 - 0 for v in out[1:-1])  # no packet after them: plain concealment
    assert feed(LowLatencyJitterBuffer(), [5, 6], lost=True) == [5, 6]


def test_a_floor_keeps_the_window_open() -> None:
    buf = LowLatencyJitterBuffer(min_depth=2)
    assert feed(buf, [1, 3, 4, 2, 5]) == [1, 2, 3, 4, 5]  # 2 came two packets late: waited
    feed(buf, list(range(6, 6 + CALM * 3)))
    assert buf.depth == 2  # never below the floor
