"""Cheap aiortc callers for `bench sessions --knee`, and how their echo is judged.

A `RecordingCaller` encodes each 20 ms frame it sends (aiortc's encoder, on an executor) and
decodes each it hears (a decoder thread per call, aiortc's jitter buffer): at ~60 calls that
filled the callers' core before the transceiver's. These callers still set up as aiortc does
(ICE, DTLS, SRTP, RTCP: the real thing), but

* send: `BurstTrack` returns pre-encoded Opus packets (`av.Packet`: aiortc then only packs
  them, as the transceiver's own `AgentAudioTrack` does): one 1 s cycle of a tone burst and
  silence, coded once per frequency by aiortc's own encoder (what a stock caller sends), the
  second of two cycles coded in a row, so the loop carries a warmed-up encoder's state;
* hear: the receiver's RTP goes to `caller_hooks.tap_receiver`, which keeps (arrival, RTP
  sequence, payload) and decodes nothing while the window runs. The judging happens after
  the window, off the clock: `judge` decodes the whole recording with libopus and measures
  each frame's tone power.

Why bursts: the silence between them gives a capture at the transceiver an onset to match
each way (`echo.residence`), one a second per call. Loss is judged per burst, in RTP
sequence order (one packet per 20 ms slot of the transceiver's output clock). Two Opus
passes delay the tone by ~13 ms, so a burst of B frames comes back over B+1 slots, the first
with ~7 ms of tone, the last with ~13 ms; a slot counts as heard when more than about half of
it carries the tone (`HEARD_SLOT`): B heard slots a burst. From the burst's first heard slot
to its last: lost = max(span, B) - heard. A late echo the transceiver replaced by silence is
a hole inside the span (the frame itself plays a slot later); an echo that never came
shortens the span; a burst that never came back loses all B.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from aiortc import MediaStreamTrack
from aiortc.codecs.opus import OpusEncoder as AiortcOpusEncoder
from aiortc.mediastreams import MediaStreamError
from aiortc.rtp import RtpPacket
from av import AudioFrame, Packet

from firsthop.services.bench.caller_hooks import tap_receiver
from firsthop.services.call.caller import FRAME_SAMPLES, SAMPLE_RATE, Caller
from firsthop.services.transceiver.media.opus import OpusDecoder, OpusError

TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
FRAME_S = FRAME_SAMPLES / SAMPLE_RATE
AMPLITUDE = 0.3
# A slot is heard when more than about half of it carries the tone. Through the caller's stereo
# encoder, the transceiver's decoder (mono) and its encoder, a full frame has tone power
# ~0.011, a slot with 13 ms of tone ~0.005 and one with 7 ms ~0.0013 (power goes with the
# square of the tone's share): HEARD_SLOT splits them (`tests/unit/test_bench_knee.py` runs
# that codec chain).
HEARD_SLOT = 0.0025
PERIOD_FRAMES = 50  # one burst a second
BURST_FRAMES = 40  # 800 ms of tone, 200 ms of silence


# -- sending: a pre-encoded tone burst loop ------------------------------------------------


def encoded_cycle(
    freq: float, burst: int = BURST_FRAMES, period: int = PERIOD_FRAMES
) -> list[bytes]:
    """The Opus payloads of one cycle (`burst` frames of tone, then silence, `period` in
    all) as aiortc's encoder codes them for a stock caller: the second of two cycles."""
    encoder = AiortcOpusEncoder()
    n = np.arange(burst * FRAME_SAMPLES)
    tone = (32767 * AMPLITUDE * np.sin(2 * np.pi * freq / SAMPLE_RATE * n)).astype(np.int16)
    cycle = tone.tobytes() + bytes((period - burst) * FRAME_SAMPLES * 2)
    step = FRAME_SAMPLES * 2
    payloads: list[bytes] = []
    for i in range(2 * period):
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(cycle[(i % period) * step : (i % period + 1) * step])
        frame.pts = i * FRAME_SAMPLES
        frame.sample_rate = SAMPLE_RATE
        frame.time_base = TIME_BASE
        coded, _ = encoder.encode(frame)
        payloads += coded
    if len(payloads) < period:
        raise RuntimeError(f"the Opus encoder gave {len(payloads)} packets for {2 * period}")
    return payloads[-period:]


def burst_frames(freq: float) -> tuple[list[bytes], list[bytes]]:
    """The codec work of one caller's second (`sessions.codec_floor`'s frames): its cycle's
    packets, and their decodes, which the echo hands back to be encoded."""
    payloads = encoded_cycle(freq)
    decoder = OpusDecoder()
    return payloads, [decoder.decode(payload) for payload in payloads]


class BurstTrack(MediaStreamTrack):
    """Paced at real time, the pre-encoded cycle over and over; `onsets` are when each
    burst's first frame left (monotonic), from `arm()` on.

    Before each burst the clock slips by a fraction of a frame, as `echo.BurstTrack`'s does
    (and for its reason: aiortc starts the caller's clock and the transceiver's output clock
    both at the end of DTLS, so without it every burst would meet the transceiver's 20 ms
    tick at the same phase): burst k at phase frac(k / golden ratio) of a frame, from a
    phase of its own per call. The slip falls in the silence before the burst.
    """

    kind = "audio"

    def __init__(self, payloads: list[bytes], phase: float = 0.0) -> None:
        super().__init__()
        self.payloads = payloads
        self.armed = False
        self.onsets: list[float] = []
        self._start: float | None = None
        self._index = 0
        self._phase = phase  # of a frame, 0..1
        self._offset = 0.0  # the clock's total slip, modulo a frame (s)

    def arm(self) -> None:
        self.armed = True

    async def recv(self) -> Packet[Any]:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._index += 1
            if self._index % len(self.payloads) == 0:
                bursts = self._index // len(self.payloads)
                phase = FRAME_S * ((self._phase + bursts * 0.618034) % 1.0)
                self._start += (phase - self._offset) % FRAME_S
                self._offset = phase
            wait = self._start + self._index * FRAME_S - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        slot = self._index % len(self.payloads)
        if slot == 0 and self.armed:
            self.onsets.append(time.monotonic())
        packet = Packet(self.payloads[slot])
        packet.pts = self._index * FRAME_SAMPLES
        packet.time_base = TIME_BASE
        return packet


# -- hearing: RTP recorded, nothing decoded --------------------------------------------------


class TapCaller(Caller):
    """An aiortc caller sending `track` whose received RTP is kept as (arrival, sequence,
    payload) while `recording`, never decoded."""

    def __init__(self, track: BurstTrack) -> None:
        super().__init__(track)
        self.burst_track = track
        self.recording = False
        self.packets: list[tuple[float, int, bytes]] = []
        receiver = self.pc.getTransceivers()[0].receiver
        tap_receiver(receiver, self._on_rtp)

    def _on_rtp(self, packet: RtpPacket) -> None:
        if self.recording:
            self.packets.append((time.monotonic(), packet.sequence_number, packet.payload))


# -- judging, after the window ---------------------------------------------------------------


def tone_powers(pcm: np.ndarray, freq: float) -> np.ndarray:
    """Tone power of `freq` in each row of `pcm` (frames of PCM16 mono 48 kHz): the Goertzel
    power `echo.frame_power` computes, as one matrix product (0.0225 for a full 0.3 tone)."""
    n = pcm.shape[1]
    w = 2 * np.pi * freq / SAMPLE_RATE * np.arange(n)
    x = pcm.astype(np.float64) / 32768.0
    re, im = x @ np.cos(w), x @ np.sin(w)
    return np.asarray((re * re + im * im) / (n * n))


def decode_slots(
    packets: list[tuple[float, int, bytes]],
) -> tuple[list[float | None], list[int], np.ndarray]:
    """The recording as the transceiver's output slots, in RTP sequence order from the first
    packet: each slot's arrival (None: never came), payload bytes (0 if none) and decoded
    PCM (zeros if none)."""
    if not packets:
        return [], [], np.zeros((0, FRAME_SAMPLES), dtype=np.int16)
    first = packets[0][1]
    index: dict[int, tuple[float, bytes]] = {}
    for at, seq, payload in packets:
        index[(seq - first) & 0xFFFF] = (at, payload)  # fine below 65536 slots (21 min)
    slots = max(index) + 1
    arrivals: list[float | None] = [None] * slots
    sizes = [0] * slots
    pcm = np.zeros((slots, FRAME_SAMPLES), dtype=np.int16)
    decoder = OpusDecoder()
    try:
        for slot in range(slots):
            got = index.get(slot)
            if got is None:
                continue
            arrivals[slot], sizes[slot] = got[0], len(got[1])
            try:
                frame = np.frombuffer(decoder.decode(got[1]), dtype=np.int16)
            except OpusError:
                continue
            pcm[slot, : min(FRAME_SAMPLES, frame.size)] = frame[:FRAME_SAMPLES]
    finally:
        decoder.close()
    return arrivals, sizes, pcm


@dataclass
class Verdict:
    bursts: int  # bursts judged (sent whole inside the window)
    expected: int  # frames of tone expected back
    lost: int
    # per burst with a loss: [seconds into the window, frames lost, payload bytes of the slots
    # not heard inside its span (3: the transceiver's cached silence; 0: never came)]
    runs: list[list[Any]]
    heard_own: bool  # the caller's own frequency dominates the middle of a whole burst


def judge(
    packets: list[tuple[float, int, bytes]],
    onsets: list[float],
    freq: float,
    freqs: list[float],
    window: tuple[float, float],
    burst: int = BURST_FRAMES,
    period_s: float = PERIOD_FRAMES * FRAME_S,
) -> Verdict:
    """Loss per burst sent whole inside `window` (monotonic start, end): see the module
    docstring. A burst's echo is looked for among slots arriving from its onset to the next
    burst's (its 200 ms of trailing silence is the room for the echo's delay)."""
    start, end = window
    judged = [t for t in onsets if t >= start and t + period_s <= end]
    arrivals, sizes, pcm = decode_slots(packets)
    heard = tone_powers(pcm, freq) > HEARD_SLOT if len(arrivals) else np.zeros(0, dtype=bool)
    lost = 0
    runs: list[list[Any]] = []
    best: tuple[int, np.ndarray] | None = None  # (frames missed, the burst's middle 10 slots)
    for onset in judged:
        hits = [
            i
            for i, at in enumerate(arrivals)
            if at is not None and onset <= at < onset + period_s and heard[i]
        ]
        missed, holes = burst, []
        if hits:
            span = hits[-1] - hits[0] + 1
            missed = max(span, burst) - len(hits)
            holes = [sizes[i] for i in range(hits[0], hits[-1]) if not heard[i]]
            # whose tone this is, judged on the burst heard most whole: a frame lost is loss
            # (counted above), not a reason to say the caller heard someone else
            if len(hits) >= 10 and (best is None or missed < best[0]):
                centre = hits[len(hits) // 2]
                best = (missed, pcm[max(centre - 5, 0) : centre + 5].reshape(-1))
        if missed:
            lost += missed
            runs.append([round(onset - start, 2), missed, holes[:10]])
    heard_own = False
    if best is not None:
        row = best[1].reshape(1, -1)
        powers = {f: float(tone_powers(row, f)[0]) for f in freqs}
        heard_own = max(powers, key=lambda f: powers[f]) == freq and powers[freq] > HEARD_SLOT
    return Verdict(len(judged), len(judged) * burst, lost, runs[:10], heard_own)
