"""A call's recording, sans-IO: both sides as carried, into one two-channel file.

Left is the caller (the packets the call's jitter buffer hands the decoder), right the agent
(the packets the output clock sends, silence included): nothing is decoded or coded again. A
WebRTC call's (and an Opus phone call's) is Ogg/Opus (`OggOpus`: `shared/wire/ogg.py` frames
the two as one multistream packet per 20 ms); a G.711 phone call's is a WAVE file of its
A-law or mu-law (`WavG711`: `shared/wire/wav.py`, the two interleaved sample by sample). What
the caller heard is what was sent, so a barge-in's cut shows where it was heard.

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
aligned for the whole call. An Opus packet takes a whole slot: one not of 20 ms (on the
agent's side, not of one frame) is written as silence and counted (`replaced`). A G.711
caller's bytes go where their timestamp puts them, sample by sample, so a trunk sending 10,
30 or 40 ms packets fills the slots they cover (the agent's frames are always 20 ms).

`take()` gives the file's bytes made so far (the I/O writes them); `close(now)` writes what is
left, both sides to the same end.
"""

from __future__ import annotations

from typing import Protocol

from firsthop.shared.wire import wav
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
G711_FRAME = 160  # 8 kHz samples (and bytes) in a 20 ms slot
G711_SILENCE = {"pcmu": b"\xff" * G711_FRAME, "pcma": b"\xd5" * G711_FRAME}


class Unfit(ValueError):
    """A packet the file's format cannot put in 20 ms slots."""


class RecordingFormat(Protocol):
    """What a recording is written as: how a side's packet fills slots, and the file."""

    media_type: str  # (served with it)
    suffix: str  # the finished file's
    frame: int  # RTP timestamp units in a 20 ms slot
    silence: tuple[bytes, bytes]  # (caller, agent) for a slot with nothing
    partial: bool  # a slot's entry is samples a packet may fill part of (else: one packet)

    def caller_pieces(self, packet: bytes, pos: int) -> list[tuple[int, int, bytes]]:
        """The caller's packet whose first sample is `pos` (counted from the file's start)
        as (slot, offset in it, bytes) pieces; `Unfit` if it cannot be placed."""
        ...

    def agent_slot(self, packet: bytes) -> bytes:
        """The packet as one slot's entry; `Unfit` if it cannot be."""
        ...

    def write(self, caller: bytes | bytearray, agent: bytes) -> None: ...

    def take(self) -> bytes: ...

    def close(self) -> None: ...


class OggOpus:
    """Two mono Opus streams in one Ogg/Opus file: channel 0 (left) <- stream 1 (the caller,
    the last stream: as it came), channel 1 (right) <- stream 0 (the agent, self-delimited)."""

    media_type, suffix, frame, partial = "audio/ogg; codecs=opus", ".opus", FRAME, False
    silence = (SILENCE, self_delimited(SILENCE))

    def __init__(self, serial: int, comments: list[str] | None = None) -> None:
        self._ogg = OggWriter(serial)
        self._ogg.header(opus_head(2, 2, 0, bytes([1, 0]), pre_skip=0))
        self._ogg.header(opus_tags(VENDOR, comments or []))

    def caller_pieces(self, packet: bytes, pos: int) -> list[tuple[int, int, bytes]]:
        try:
            if packet_samples(packet) != FRAME:
                raise Unfit("not 20 ms")
        except OpusPacketError as exc:
            raise Unfit(str(exc)) from exc
        return [(round(pos / FRAME), 0, packet)]  # (a whole packet: the nearest slot)

    def agent_slot(self, packet: bytes) -> bytes:
        try:
            if packet_samples(packet) != FRAME:
                raise Unfit("not 20 ms")
            return self_delimited(packet)
        except OpusPacketError as exc:
            raise Unfit(str(exc)) from exc

    def write(self, caller: bytes | bytearray, agent: bytes) -> None:
        self._ogg.audio(agent + caller, FRAME)

    def take(self) -> bytes:
        return self._ogg.take()

    def close(self) -> None:
        self._ogg.close()


class WavG711:
    """A G.711 call's two sides in one two-channel WAVE file of its own law, 8 kHz. The
    caller's bytes go where their RTP timestamp says, sample by sample (a trunk may send 10,
    20, 30 ms or more a packet); what is made is handed out a second at a time (`PAGE`)."""

    media_type, suffix, frame, partial = "audio/wav", ".wav", G711_FRAME, True
    PAGE = 16000  # bytes: a second of two 8 kHz channels

    def __init__(self, codec: str) -> None:
        if codec not in G711_SILENCE:
            raise ValueError(f"{codec} is not G.711")
        self.silence = (G711_SILENCE[codec], G711_SILENCE[codec])
        tag = wav.MULAW if codec == "pcmu" else wav.ALAW
        self._out = bytearray(wav.g711_header(tag, 2, 8000))  # sizes: when the file is done
        self._closed = False

    def caller_pieces(self, packet: bytes, pos: int) -> list[tuple[int, int, bytes]]:
        if not packet:
            raise Unfit("no samples")
        pieces, at, end = [], 0, len(packet)
        while at < end:
            slot, offset = divmod(pos + at, G711_FRAME)
            n = min(G711_FRAME - offset, end - at)
            pieces.append((slot, offset, packet[at : at + n]))
            at += n
        return pieces

    def agent_slot(self, packet: bytes) -> bytes:
        if len(packet) != G711_FRAME:
            raise Unfit("not 20 ms")
        return packet

    def write(self, caller: bytes | bytearray, agent: bytes) -> None:
        self._out += wav.interleave(caller, agent)

    def take(self) -> bytes:
        if len(self._out) < self.PAGE and not self._closed:
            return b""
        out, self._out = bytes(self._out), bytearray()
        return out

    def close(self) -> None:
        self._closed = True


class CallRecorder:
    def __init__(self, start: float, file: RecordingFormat) -> None:
        self.start = start
        self.file = file
        self._caller: dict[int, bytes | bytearray] = {}
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
        slot = base_slot + round(delta / self.file.frame)
        if slot < self._written and self._late_run < LATE_RUN:
            self._late_run += 1  # a straggler: dropped (`late`), the line kept
            slot = -1
        elif not self._written <= slot <= here + AHEAD:  # the line drifted off: drawn again
            self._caller_base, slot = (timestamp, here), here
            base_slot, delta = here, 0
            self.rebased += 1
        if slot >= 0:
            self._late_run = 0
        if packet is not None:
            self._caller_packet(packet, slot, base_slot * self.file.frame + delta)
        self._settle(now)

    def _caller_packet(self, packet: bytes, slot: int, pos: int) -> None:
        file, side = self.file, self._caller
        if slot < self._written or (not file.partial and slot in side):
            self.late += 1
            return
        try:
            pieces = file.caller_pieces(packet, pos)
        except Unfit:
            self.replaced += 1
            pieces = [(slot, 0, file.silence[0])]
        late = False
        for at, offset, data in pieces:
            if at < self._written or (not file.partial and at in side):
                late = True
            elif file.partial:  # (the samples land where they belong; a duplicate: again)
                entry = side.get(at)
                if not isinstance(entry, bytearray):
                    entry = side[at] = bytearray(file.silence[0])
                entry[offset : offset + len(data)] = data
            else:
                side[at] = data
        self.late += late

    def agent(self, packet: bytes, due: float, now: float) -> None:
        """A packet the call sent (the agent's voice, or silence) in its slot due at `due`."""
        if self.closed:
            return
        slot = max(self._slot(due), self._agent_last + 1)
        self._agent_last = slot
        try:
            entry = self.file.agent_slot(packet)
        except Unfit:
            self.replaced += 1
            entry = self.file.silence[1]
        if slot < self._written:  # (its slots only move forward: never one taken)
            self.late += 1
        else:
            self._agent[slot] = entry
        self._settle(now)

    def _settle(self, now: float) -> None:
        self._write_until(self._slot(now) - SETTLE)

    def _write_until(self, end: int) -> None:
        silent_caller, silent_agent = self.file.silence
        while self._written < end:
            slot = self._written
            agent = self._agent.pop(slot, silent_agent)
            caller = self._caller.pop(slot, silent_caller)
            self.file.write(caller, agent)
            self._written += 1

    def take(self) -> bytes:
        return self.file.take()

    def close(self, now: float) -> bytes:
        """The rest: every slot up to now (and any packet already placed past it)."""
        if not self.closed:
            last = max([self._slot(now), *self._caller, *self._agent], default=0)
            self._write_until(last + 1)
            self.file.close()
            self.closed = True
        return self.take()

    @property
    def seconds(self) -> float:
        return self._written * SLOT
