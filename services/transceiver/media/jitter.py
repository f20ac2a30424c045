"""A low-latency, adaptive audio jitter buffer for the server side.

aiortc's receiver holds audio in `JitterBuffer(capacity=16, prefetch=4)` and releases a frame
only once the *next* frame's packet has arrived: 80 ms and more of residence before the agent
hears anything. On the server the consumer is a model, not a loudspeaker: what matters is
getting each 20 ms frame to it as soon as it can be in order.

Policy (one Opus frame per RTP packet, as WebRTC sends audio):

* in-order packets are released at once;
* when a gap opens, newer packets are held until the missing one arrives or `depth` newer
  packets have queued up, then the gap is given up on: a *lost* frame takes its slot, which
  the decoder fills (`opus.py`: from the in-band FEC of the packet after it, carried in the
  lost frame's `data` when that packet is here, else by concealment), so the agent hears
  a repaired frame, not a hole. At most `MAX_CONCEALED` in a row: past that a long outage is
  silence, as it was;
* `depth` adapts: it grows by one (up to `MAX_DEPTH`) each time a packet that was given up on
  arrives late, i.e. when the link reorders more than the window allows, and shrinks by one
  after `CALM` consecutive in-order packets. A clean link runs at depth 0: zero added delay.

The interface is aiortc's (`add(packet) -> (pli_flag, frame | None)`, `capacity`); packets are
duck-typed (`sequence_number`, `timestamp`, `payload_type`, `payload`). aiortc takes at most one
frame per packet, but filling a gap releases several at once, so when a `sink` is set every
released frame goes to it, in order, and `add` returns None (the transceiver's sink feeds the
receiver's decoder queue). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

MAX_DEPTH = 4  # packets (80 ms at 20 ms ptime)
MAX_CONCEALED = 5  # lost frames repaired in a row (100 ms); past that, silence
CALM = 250  # in-order packets (5 s) before the window shrinks by one
_HALF = 1 << 15


class Frame:
    """What the decoder takes: the encoded bytes and the RTP timestamp. A `lost` frame
    stands for a packet given up on: its `data` is the next packet's (whose in-band FEC may
    carry it), or empty."""

    __slots__ = ("data", "timestamp", "payload_type", "lost")

    def __init__(
        self, data: bytes, timestamp: int, payload_type: int = 0, lost: bool = False
    ) -> None:
        self.data = data
        self.timestamp = timestamp
        self.payload_type = payload_type
        self.lost = lost


def _newer(a: int, b: int) -> int:
    """How far sequence number `a` is ahead of `b` (negative if behind), mod 2^16."""
    return ((a - b + _HALF) & 0xFFFF) - _HALF


class LowLatencyJitterBuffer:
    capacity = 64

    def __init__(self, sink: Callable[[Frame], None] | None = None, min_depth: int = 0) -> None:
        self.sink = sink
        self.min_depth = min_depth  # a floor for the window (a client that plays audio)
        self.depth = min_depth
        self.next_seq: int | None = None
        self.held: dict[int, Any] = {}
        self.calm = 0
        self.late = 0
        self.skipped = 0
        self.concealed = 0  # lost frames released for the decoder to repair
        self.released: list[Frame] = []  # frames ready beyond the one `add` returns
        self._last: Frame | None = None  # the last frame released from a packet
        self._lost_run = 0

    def add(self, packet: Any) -> tuple[bool, Frame | None]:
        seq = packet.sequence_number
        if self.next_seq is None:
            self.next_seq = seq
        ahead = _newer(seq, self.next_seq)
        if ahead < 0:
            if ahead > -MAX_DEPTH * 4:  # it came after we gave up on it
                self.late += 1
                self.depth = min(MAX_DEPTH, self.depth + 1)
                self.calm = 0
            return False, self._pop_released()
        if ahead >= self.capacity:  # a jump (new stream, long outage): start over
            self.held.clear()
            self.next_seq = seq
            ahead = 0
        self.held[seq] = packet
        if ahead == 0:
            self.calm += 1
            if self.calm >= CALM and self.depth > self.min_depth:
                self.depth -= 1
                self.calm = 0
        self._drain()
        return False, self._pop_released()

    def _drain(self) -> None:
        assert self.next_seq is not None
        while True:
            packet = self.held.pop(self.next_seq, None)
            if packet is not None:
                frame = Frame(packet.payload, packet.timestamp, packet.payload_type)
                self.released.append(frame)
                self._last = frame
                self._lost_run = 0
                self.next_seq = (self.next_seq + 1) & 0xFFFF
                continue
            if len(self.held) > self.depth:  # waited long enough for the missing one
                self.skipped += 1
                self._lose()
                self.next_seq = (self.next_seq + 1) & 0xFFFF
                continue
            return

    def _lose(self) -> None:
        """Release a lost frame in the missing packet's slot (see `Frame`)."""
        last = self._last
        if last is None or self._lost_run >= MAX_CONCEALED:
            return
        assert self.next_seq is not None
        self._lost_run += 1
        after = self.held.get((self.next_seq + 1) & 0xFFFF)
        timestamp = (last.timestamp + 960 * self._lost_run) & 0xFFFFFFFF  # 20 ms frames
        data = after.payload if after is not None else b""
        self.released.append(Frame(data, timestamp, last.payload_type, lost=True))
        self.concealed += 1

    def _pop_released(self) -> Frame | None:
        if not self.released:
            return None
        if self.sink is not None:
            for frame in self.released:
                self.sink(frame)
            self.released.clear()
            return None
        return self.released.pop(0)
