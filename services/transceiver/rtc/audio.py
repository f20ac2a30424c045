"""The agent's voice out to the caller (decoded audio in is `rtc/session.py`'s, `opus.py`).

* `AgentAudioTrack`: the agent's 20 ms frames, paced at real time from a bounded queue
  (`pacing.py`), Opus-encoded here (libopus, `opus.py`) and handed to aiortc as packets (a
  cached Opus silence frame while the agent is quiet): no resampling, executor hop or
  audio-level pass per frame.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Callable
from typing import Any

from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError
from av import Packet

from firsthop.services.transceiver.media.opus import OpusEncoder, OpusError
from firsthop.services.transceiver.media.pacing import FRAME_SAMPLES, SAMPLE_RATE, OutputQueue

TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
OPUS_BITRATE = 48000  # mono voice
LATE_GRACE = 0.008  # seconds a mid-speech frame may be late before silence fills its slot
OPUS_SILENCE = b"\xf8\xff\xfe"  # one 20 ms CELT frame of silence (RFC 6716 §3.1 TOC 0xf8)
# Silent slots encoded by the call's own encoder before the cached frame takes over. The
# decoder predicts each frame's energy from the last one: a silence frame the encoder never
# saw leaves the two apart, and the next ~3 frames of speech decode far too quiet (measured:
# a 440 Hz tone back to its level only at the 6th frame; encoded through, at the 2nd).
ENCODED_SILENCE = 3
SILENT_PCM = bytes(FRAME_SAMPLES * 2)


class AgentAudioTrack(MediaStreamTrack):
    """The agent's voice: 20 ms PCM16 mono frames paced at real time (see `pacing.py`),
    silence when the queue is empty."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.out: OutputQueue[object] = OutputQueue()
        self.frames_out = 0
        self.first_audio_at: float | None = None
        self.on_first_audio: Callable[[], None] | None = None
        self.on_played: Callable[[object], None] | None = None  # a tagged frame went out
        self._waiter: asyncio.Future[None] | None = None
        self._silent_run = 0  # silent slots in a row
        self._encoder = OpusEncoder(OPUS_BITRATE)

    @property
    def dropped(self) -> int:
        return self.out.dropped_full

    def push(self, pcm: bytes, tag: object = None) -> list[object]:
        """Queue `pcm` (whole 20 ms frames); the tags of frames dropped doing so."""
        dropped = self.out.push(pcm, tag)
        waiter = self._waiter
        if waiter is not None and not waiter.done() and self.out.frames:
            waiter.set_result(None)
        return dropped

    def clear(self) -> None:
        self.out.clear()

    async def recv(self) -> Packet[Any]:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        out = self.out
        deadline = out.next_deadline(loop.time())
        wait = deadline - loop.time()
        if wait > 0:
            if out.may_start_early():
                # Idle: sleep to the tick, but agent audio arriving first goes out at once.
                await self._wait_for_frame(loop, deadline)
                if out.frames and loop.time() < deadline:
                    out.rephase(loop.time())
            else:
                await asyncio.sleep(wait)
        if not out.frames and not out.idle:
            # Mid-speech and the next frame is not here yet: give it a moment before playing
            # silence (a gap), keeping the clock, so the next tick catches up.
            await self._wait_for_frame(loop, loop.time() + LATE_GRACE)
        pcm = out.pop()
        payload = OPUS_SILENCE
        if pcm is None:
            self._silent_run += 1
            if self._silent_run <= ENCODED_SILENCE:
                payload = self._encode(SILENT_PCM)  # keep the decoder in step
        else:
            self._silent_run = 0
            self.frames_out += 1
            if self.first_audio_at is None:
                self.first_audio_at = time.monotonic()
                if self.on_first_audio is not None:
                    self.on_first_audio()
            payload = self._encode(pcm)
            if out.played_tag is not None and self.on_played is not None:
                self.on_played(out.played_tag)
        # Hand aiortc an encoded packet: it then only packs it (no resampling, no executor
        # hop, no pure-Python audio-level pass over the frame).
        packet = Packet(payload)
        packet.pts = out.pts
        packet.time_base = TIME_BASE
        return packet

    async def _wait_for_frame(self, loop: asyncio.AbstractEventLoop, until: float) -> None:
        """Sleep until `until`, or until the agent's next frame arrives if sooner."""
        waiter = self._waiter = loop.create_future()
        timer = loop.call_at(until, _resolve, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    def _encode(self, pcm: bytes) -> bytes:
        """Opus-encode one mono 20 ms frame (a mono Opus stream is valid in the negotiated
        opus/48000/2, RFC 7587 §3.4)."""
        try:
            return self._encoder.encode(pcm)
        except OpusError:
            return OPUS_SILENCE


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
