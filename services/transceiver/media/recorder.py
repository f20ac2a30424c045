"""A call's recording, sans-IO: both sides' Opus, as carried, into one two-channel Ogg/Opus.

Left is the caller (the Opus packets the call's jitter buffer hands the decoder), right the
agent (the packets the output clock sends, silence included): nothing is decoded or encoded
again (`shared/wire/ogg.py` frames the two as one multistream packet per 20 ms). What the
caller heard is what was sent, so a barge-in's cut shows where it was heard.

**Alignment.** The file's sample 0 is `start` (monotonic seconds). The agent's packet takes
the 20 ms slot its output clock played it in (the frame's deadline, not when a late tick got
to it: frames a stall let pile up keep their own slots; a re-phase shows as the silence it
was). The caller's takes the slot of its arrival for the first, then of its RTP timestamp
counted from there (the caller's own spacing survives arrival jitter). When that line leaves
the window a packet can still be written in (`LATE_RUN` packets in a row older than `SETTLE`
slots, or one more than `AHEAD` ahead of its arrival: a caller clock slower or faster than
ours, a delay that changed, a new stream) it is drawn again from the arrival (`rebased`): the
caller is never more than 200 ms from when it was heard, and loses at most 0.3 s of audio
when its line is drawn again. A lone straggler is dropped; no slot is written twice (`late`). A
slot is written once it is `SETTLE` slots old; a side with nothing for a slot gets silence
there (a lost packet, the agent quiet, a call that was not sending), so the two channels stay
aligned for the whole call. A packet not of 20 ms (or, on the agent's side, not of one frame)
is written as silence and counted (`replaced`).

`take()` gives the file's bytes made so far (the I/O writes them); `close(now)` writes what is
left, both sides to the same end.
"""

from __future__ import annotations

from firsthop.shared.wire.ogg import (
    OggWriter,
    OpusPacketError,
    opus_head,
    opus_tags,
    packet_samples,
    self_delimited,
)

FRAME = 960  # 48 kHz samples in a 20 ms slot
SLOT = 0.02
SETTLE = 10  # slots (200 ms) before a slot is written: the jitter buffer's lateness and more
AHEAD = 10  # slots past its arrival a caller's packet may claim (past it: a new base)
LATE_RUN = 3  # caller packets too late in a row: its line is behind (a slower clock), not one
SILENCE = b"\xf8\xff\xfe"  # a 20 ms CELT frame of silence (RFC 6716 §3.1 TOC 0xf8)
VENDOR = "firsthop"


class CallRecorder:
    def __init__(self, start: float, serial: int, comments: list[str] | None = None) -> None:
        self.start = start
        self._ogg = OggWriter(serial)
        # two streams, none coupled; channel 0 (left) <- stream 1 (the caller, the last
        # stream: as it came), channel 1 (right) <- stream 0 (the agent, self-delimited)
        self._ogg.header(opus_head(2, 2, 0, bytes([1, 0]), pre_skip=0))
        self._ogg.header(opus_tags(VENDOR, comments or []))
        self._caller: dict[int, bytes] = {}
        self._agent: dict[int, bytes] = {}
        self._caller_base: tuple[int, int] | None = None  # (RTP timestamp, its slot)
        self._late_run = 0  # caller packets in a row that came too late for their slots
        self._agent_last = -1
        self._written = 0  # the next slot to write
        self.replaced = 0
        self.late = 0
        self.rebased = 0
        self.closed = False

    def _slot(self, now: float) -> int:
        return max(0, round((now - self.start) / SLOT))

    def caller(self, packet: bytes | None, timestamp: int, now: float) -> None:
        """A caller's packet as the decoder got it (None: lost, left to silence)."""
        if self.closed:
            return
        here = self._slot(now)
        if self._caller_base is None:
            self._caller_base = (timestamp, here)
        base_ts, base_slot = self._caller_base
        delta = (timestamp - base_ts + (1 << 31)) % (1 << 32) - (1 << 31)
        slot = base_slot + round(delta / FRAME)
        if slot < self._written and self._late_run < LATE_RUN:
            self._late_run += 1  # a straggler: dropped (`late`), the line kept
            slot = -1
        elif not self._written <= slot <= here + AHEAD:  # the line drifted off: drawn again
            self._caller_base, slot = (timestamp, here), here
            self.rebased += 1
        if slot >= 0:
            self._late_run = 0
        if packet is not None:
            self._put(self._caller, slot, packet, last_stream=True)
        self._settle(now)

    def agent(self, packet: bytes, due: float, now: float) -> None:
        """A packet the call sent (the agent's voice, or silence) in its slot due at `due`."""
        if self.closed:
            return
        slot = max(self._slot(due), self._agent_last + 1)
        self._agent_last = slot
        self._put(self._agent, slot, packet, last_stream=False)
        self._settle(now)

    def _put(self, side: dict[int, bytes], slot: int, packet: bytes, *, last_stream: bool) -> None:
        if slot < self._written or slot in side:
            self.late += 1
            return
        try:
            if packet_samples(packet) != FRAME:
                raise OpusPacketError("not 20 ms")
            side[slot] = packet if last_stream else self_delimited(packet)
        except OpusPacketError:
            self.replaced += 1
            side[slot] = SILENCE if last_stream else self_delimited(SILENCE)

    def _settle(self, now: float) -> None:
        self._write_until(self._slot(now) - SETTLE)

    def _write_until(self, end: int) -> None:
        silent_agent = self_delimited(SILENCE)
        while self._written < end:
            slot = self._written
            agent = self._agent.pop(slot, silent_agent)
            caller = self._caller.pop(slot, SILENCE)
            self._ogg.audio(agent + caller, FRAME)
            self._written += 1

    def take(self) -> bytes:
        return self._ogg.take()

    def close(self, now: float) -> bytes:
        """The rest: every slot up to now (and any packet already placed past it)."""
        if not self.closed:
            last = max([self._slot(now), *self._caller, *self._agent], default=0)
            self._write_until(last + 1)
            self._ogg.close()
            self.closed = True
        return self.take()

    @property
    def seconds(self) -> float:
        return self._written * SLOT
