"""A standard WebRTC caller on aiortc: what `firsthop call` and the tests dial with.

Nothing firsthop-specific is on this side: a stock `RTCPeerConnection` sends an offer through
some signaling callable, applies the answer, plays a tone (or PCM), records what comes back
and notes the setup timeline. Audio analysis helpers (Goertzel tone power) live here too.
"""

from __future__ import annotations

import array
import asyncio
import fractions
import functools
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from av import AudioFrame

SAMPLE_RATE = 48000
FRAME_SAMPLES = 960


class ToneTrack(MediaStreamTrack):
    """A sine tone (or given PCM16 mono 48 kHz, then silence), paced at real time."""

    kind = "audio"

    def __init__(
        self,
        freq: float = 440.0,
        amplitude: float = 0.3,
        pcm: bytes | None = None,
        beep: tuple[float, float] | None = None,
    ):
        super().__init__()
        self.freq = freq
        self.amplitude = amplitude
        self.pcm = pcm
        self.beep = beep  # (every, length) seconds: tone only in short bursts
        self.beep_starts: list[float] = []  # monotonic time each burst's first frame left
        self._start: float | None = None
        self._pts = 0

    def _samples(self, start: int) -> bytes:
        if self.beep is not None:
            every, length = self.beep
            into = (start / SAMPLE_RATE) % every
            if into >= length:
                return bytes(FRAME_SAMPLES * 2)
            if into < FRAME_SAMPLES / SAMPLE_RATE:
                self.beep_starts.append(time.monotonic())
        if self.pcm is not None:
            chunk = self.pcm[start * 2 : (start + FRAME_SAMPLES) * 2]
            return chunk.ljust(FRAME_SAMPLES * 2, b"\0")
        if float(self.freq).is_integer():
            # A whole-hertz tone repeats every second: one second computed once, then sliced
            # (a frame computed sample by sample costs ~1 ms of a caller's loop; ten callers
            # in one process could not keep up).
            cycle = _tone_second(self.freq, self.amplitude)
            at = (start % SAMPLE_RATE) * 2
            end = at + FRAME_SAMPLES * 2
            return cycle[at:end] if end <= len(cycle) else cycle[at:] + cycle[: end - len(cycle)]
        return _tone(self.freq, self.amplitude, start, FRAME_SAMPLES)

    async def recv(self) -> AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += FRAME_SAMPLES
            wait = self._start + self._pts / SAMPLE_RATE - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(self._samples(self._pts))
        frame.pts = self._pts
        frame.sample_rate = SAMPLE_RATE
        frame.time_base = fractions.Fraction(1, SAMPLE_RATE)
        return frame


def _tone(freq: float, amplitude: float, start: int, samples: int) -> bytes:
    amp = 32767 * amplitude
    w = 2 * math.pi * freq / SAMPLE_RATE
    return array.array(
        "h", (int(amp * math.sin(w * (start + i))) for i in range(samples))
    ).tobytes()


@functools.cache
def _tone_second(freq: float, amplitude: float) -> bytes:
    return _tone(freq, amplitude, 0, SAMPLE_RATE)


AUDIBLE_RMS = 0.002  # of full scale (about -54 dBFS): above the codec's comfort noise


def audible(pcm: bytes) -> bool:
    """Whether a frame of PCM16 carries sound rather than (near-)silence."""
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    return bool(samples.size) and float(np.sqrt(np.mean(samples**2))) / 32768 > AUDIBLE_RMS


def to_mono(frame: AudioFrame) -> bytes:
    channels = len(frame.layout.channels)
    data = bytes(frame.planes[0])[: frame.samples * 2 * channels]
    if channels == 1:
        return data
    samples = array.array("h")
    samples.frombytes(data)
    return samples[::channels].tobytes()


def tone_power(pcm: bytes, freq: float, rate: int = SAMPLE_RATE) -> float:
    """Goertzel: normalised power of `freq` in PCM16 mono `pcm` (0..~0.5 for a full tone)."""
    samples = array.array("h")
    samples.frombytes(pcm[: len(pcm) // 2 * 2])
    n = len(samples)
    if n == 0:
        return 0.0
    coeff = 2 * math.cos(2 * math.pi * freq / rate)
    s1 = s2 = 0.0
    for x in samples:
        s0 = x / 32768.0 + coeff * s1 - s2
        s2, s1 = s1, s0
    power = s1 * s1 + s2 * s2 - coeff * s1 * s2
    return power / (n * n)


def dominant(pcm: bytes, candidates: list[float]) -> float:
    return max(candidates, key=lambda f: tone_power(pcm, f))


@dataclass
class CallResult:
    timeline: dict[str, float] = field(default_factory=dict)  # seconds since start
    received: bytearray = field(default_factory=bytearray)  # PCM16 mono 48 kHz
    frame_times: list[float] = field(default_factory=list)  # monotonic arrival of each frame
    events: list[Any] = field(default_factory=list)
    answer_sdp: str = ""


Signal = Callable[[str], Awaitable[str]]


class Caller:
    """One call: `await start(signal)`, then `await wait_connected()`, ..., `await close()`."""

    def __init__(
        self,
        track: MediaStreamTrack | None = None,
        *,
        data_channel: bool = False,
        pc: RTCPeerConnection | None = None,
    ):
        # `pc`: a new peer connection prepared by the caller (e.g. with its own certificate)
        self.pc = pc or RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.track = track or ToneTrack()
        self.pc.addTrack(self.track)
        self.result = CallResult()
        self.channel = self.pc.createDataChannel("oai-events") if data_channel else None
        self._t0 = time.monotonic()
        self._connected = asyncio.Event()
        self._failed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.pc.on("connectionstatechange", self._on_state)
        self.pc.on("track", self._on_track)
        if self.channel is not None:
            self.channel.on("message", lambda m: self.result.events.append(m))

    def mark(self, name: str) -> None:
        self.result.timeline.setdefault(name, time.monotonic() - self._t0)

    def _on_state(self) -> None:
        state = self.pc.connectionState
        self.mark(f"state_{state}")
        if state == "connected":
            self._connected.set()
        elif state in ("failed", "closed"):
            self._failed.set()

    def _on_track(self, track: MediaStreamTrack) -> None:
        self._tasks.append(asyncio.ensure_future(self._record(track)))

    async def _record(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            assert isinstance(frame, AudioFrame)
            self.mark("first_audio_in")  # the first packet, silent or not
            self.on_audio(frame)

    def on_audio(self, frame: AudioFrame) -> None:
        """One decoded frame: by default its PCM (mono) goes to `on_frame`, timed now; the
        first audible one marks `first_sound_in`."""
        pcm = to_mono(frame)
        if "first_sound_in" not in self.result.timeline and audible(pcm):
            self.mark("first_sound_in")
        self.on_frame(time.monotonic(), pcm)

    def on_frame(self, arrived: float, pcm: bytes) -> None:
        """One received frame (PCM16 mono): kept in `result`; subclasses may do otherwise."""
        self.result.frame_times.append(arrived)
        self.result.received += pcm

    async def start(self, signal: Signal) -> None:
        self._t0 = time.monotonic()
        offer = await self.pc.createOffer()
        await self.pc.setLocalDescription(offer)
        self.mark("offer_ready")
        answer = await signal(self.pc.localDescription.sdp)
        self.mark("answer")
        self.result.answer_sdp = answer
        await self.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))

    async def wait_connected(self) -> float:
        """Wait until connected (wrap in asyncio.wait_for); raise if the call failed."""
        waiters = [
            asyncio.ensure_future(self._connected.wait()),
            asyncio.ensure_future(self._failed.wait()),
        ]
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waiters:
                task.cancel()
        if not self._connected.is_set():
            raise ConnectionError(f"call did not connect (state {self.pc.connectionState})")
        return self.result.timeline["state_connected"]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.pc.close()


def beep_onsets(caller: Caller, threshold: float = 0.002) -> list[float]:
    """Mouth-to-ear delays: for each burst heard back, arrival of its first loud frame minus
    the time that burst's first frame left the caller's track (seconds)."""
    track = caller.track
    starts = getattr(track, "beep_starts", [])
    result = caller.result
    frame_bytes = FRAME_SAMPLES * 2
    delays: list[float] = []
    loud_before = False
    for i, arrived in enumerate(result.frame_times):
        chunk = bytes(result.received[i * frame_bytes : (i + 1) * frame_bytes])
        loud = tone_power(chunk, getattr(track, "freq", 440.0)) > threshold
        if loud and not loud_before:
            sent = [t for t in starts if t <= arrived]
            if sent:
                delays.append(arrived - sent[-1])
        loud_before = loud
    return delays
