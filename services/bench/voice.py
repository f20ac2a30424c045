"""`firsthop bench voice`: voice-to-voice latency of the assistant, through the edge and direct.

Spoken turns (speech made with espeak-ng) go to the same assistant process two ways, in the
same run, round by round:

* **edge**: an aiortc caller through the relay and a transceiver whose agent is the assistant
  behind the Realtime bridge (`realtime+ws://`), the `oai-events` data channel open; its
  frames are timed as their packets arrive (`ListeningCaller`);
* **direct**: a Realtime WebSocket client talking to the assistant itself, streaming the same
  speech at 24 kHz in 20 ms appends at real time (what the bridge sends);
* **direct-opus**: the same, with the audio through WebRTC's codec both ways (Opus encode and
  decode at 48 kHz, as the caller and the transceiver code it) but no network: what any
  WebRTC path to a model costs before firsthop's transport.

Per turn: voice-to-voice = end of the caller's speech (the last loud 20 ms frame leaving the
caller) to the first loud assistant audio at the caller: a decoded frame through the edge;
direct, when the first loud 20 ms of the `response.output_audio.delta`s would be played by a
client that plays them at real time from their arrival (the answers start with some quiet,
and arrive faster than real time). On the direct path the server events split it: VAD
hangover (end of speech -> `speech_stopped`), recognition (-> `transcription.completed`),
synthesis to the first chunk (-> first loud audio delta). The edge's cost is the difference of
the edge's and direct's medians, split into the codec's share (direct-opus - direct: Opus
delays the audio and smears the end of speech, which the VAD then hears later) and firsthop's
transport (edge - direct-opus: relay, transceiver, bridge, pacing, both directions).

Barge-in (edge only): while the assistant answers a long question the caller talks again; the
time from the interruption's onset until the caller is sure to hear no more of the answer:
the later of the end of the last loud frame it heard and the arrival of the bridge's
`output_audio_buffer.cleared` (sent as the queue is emptied: the answer may have been between
two clauses at the onset), split at the `input_audio_buffer.speech_started` it sees.

"The edge adds" is judged stage by stage, which the spread of synthesis time from turn to turn
(100 ms and more) does not blur: the end of speech seen later (`speech_stopped` after the end
of speech: the uplink, and the VAD's hangover, alike on every path) plus the audio later
behind its words (the assistant sends each sentence's transcript delta just before its
audio: the events come over the data channel or the WebSocket, the audio over the path
measured), each a median, against the direct path. The whole voice-to-voice medians' difference
is printed too.

Targets, printed not asserted: the edge adds <= 20 ms p50; barge-in <= 150 ms.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import base64
import collections
import fractions
import json
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiortc.codecs.opus import OpusDecoder, OpusEncoder
from aiortc.jitterbuffer import JitterFrame
from av import AudioFrame

from firsthop.services.bench.measure import BenchError, report, settings
from firsthop.services.bench.procs import Stack
from firsthop.services.call.caller import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    Caller,
    Signal,
    ToneTrack,
    to_mono,
)
from firsthop.services.transceiver.resample import Resampler, resample

REALTIME_RATE = 24000
PATHS = ("edge", "direct", "direct-opus")
AUDIO_DELTAS = ("response.output_audio.delta", "response.audio.delta")
TRANSCRIBED = "conversation.item.input_audio_transcription.completed"
WORDS = ("response.output_audio_transcript.delta", "response.audio_transcript.delta")
QUESTIONS = ("what time is it", "hello", "what did you hear")
LONG_QUESTION = "what can you do"
INTERRUPTION = "stop please"
SESSION = {"type": "realtime", "model": "assistant"}
LOUD_RMS = 300.0  # PCM16 RMS of a frame that carries speech (silence and comfort noise: < 50)
QUIET_AFTER = 0.6  # seconds without loud audio after response.done: the answer is over
TURN_TIMEOUT = 30.0
BARGE_AFTER = 0.6  # seconds into the answer when the caller talks over it
TARGET_EDGE_P50_MS = 20.0
TARGET_BARGE_IN_MS = 150.0
DEFAULTS: dict[str, Any] = {"turns": 6, "rounds": 2, "barge_ins": 3}
QUICK: dict[str, Any] = {"turns": 1, "rounds": 1, "barge_ins": 1}


# -- speech ------------------------------------------------------------------------------------


class OpusLink:
    """What WebRTC's codec does to audio on its way, without the network: 20 ms frames at
    48 kHz through an Opus encoder and decoder. `uplink()`: the caller's side (aiortc's
    encoder, as the bench's caller sends); `downlink()`: the transceiver's (its encoder for
    the agent's voice) to the caller's decoder."""

    def __init__(self, encode: Callable[[bytes, int], bytes]) -> None:
        self._encode = encode
        self._decoder = OpusDecoder()
        self._pts = 0

    @classmethod
    def uplink(cls) -> OpusLink:
        encoder = OpusEncoder()

        def encode(pcm: bytes, pts: int) -> bytes:
            frame = AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
            frame.planes[0].update(pcm)
            frame.sample_rate, frame.pts = SAMPLE_RATE, pts
            frame.time_base = fractions.Fraction(1, SAMPLE_RATE)
            payloads, _ = encoder.encode(frame)
            return payloads[0] if payloads else b""

        return cls(encode)

    @classmethod
    def downlink(cls) -> OpusLink:
        from firsthop.services.transceiver.media import opus
        from firsthop.services.transceiver.media.codecs import OPUS_BITRATE

        encoder = opus.OpusEncoder(OPUS_BITRATE)  # the one the agent's voice goes through
        return cls(lambda pcm, pts: encoder.encode(pcm))

    def packet(self, pcm: bytes) -> bytes:
        """One 20 ms frame (PCM16 mono 48 kHz) in, its Opus packet out (b"": none yet)."""
        data = self._encode(pcm, self._pts)
        self._pts += FRAME_SAMPLES
        return data

    def frame(self, pcm: bytes) -> bytes:
        """One 20 ms frame (PCM16 mono 48 kHz) in, the decoded frame out (mono)."""
        pts = self._pts
        data = self.packet(pcm)
        out = bytes(FRAME_SAMPLES * 2)
        if data:
            frames = self._decoder.decode(JitterFrame(data, pts))
            out = b"".join(to_mono(f) for f in frames if isinstance(f, AudioFrame))
        return out

    def run(self, pcm: bytes) -> bytes:
        return b"".join(self.frame(f) for f in frames_of(pcm, FRAME_SAMPLES * 2))


def speak(text: str, rate: int) -> bytes:
    """`text` said by espeak-ng, as PCM16 mono at `rate` (with espeak's own short silences
    either side: cutting them clips the first consonant, and recognition suffers)."""
    exe = shutil.which("espeak-ng")
    if exe is None:
        raise BenchError("espeak-ng is not installed (apt-get install espeak-ng)")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "speech.wav")
        subprocess.run([exe, "-v", "en-us", "-s", "140", "-w", path, text], check=True, timeout=20)
        with wave.open(path) as w:
            src, pcm = w.getframerate(), w.readframes(w.getnframes())
    if rms(pcm) < LOUD_RMS / 4:
        raise BenchError(f"espeak-ng said nothing for {text!r}")
    return resample(pcm, src, rate)


def rms(pcm: bytes) -> float:
    samples = array.array("h")
    samples.frombytes(pcm[: len(pcm) // 2 * 2])
    return math.sqrt(sum(x * x for x in samples) / len(samples)) if samples else 0.0


def frames_of(pcm: bytes, frame_bytes: int) -> list[bytes]:
    return [
        pcm[i : i + frame_bytes].ljust(frame_bytes, b"\0") for i in range(0, len(pcm), frame_bytes)
    ]


@dataclass
class Utterance:
    """When one utterance's loud frames left the caller (monotonic seconds)."""

    first_loud: float | None = None
    last_loud: float | None = None
    started: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def onset(self) -> float | None:  # the start of the first loud frame's audio
        return None if self.first_loud is None else self.first_loud - 0.02

    def sent(self, loud: bool) -> None:
        if loud:
            now = time.monotonic()
            self.first_loud = self.first_loud or now
            self.last_loud = now
            self.started.set()


class Speaker:
    """20 ms frames to say, in order, with silence between utterances."""

    def __init__(self, frame_bytes: int) -> None:
        self.frame_bytes = frame_bytes
        self.queue: collections.deque[tuple[bytes, Utterance, bool]] = collections.deque()

    def say(self, pcm: bytes, loud: list[bool] | None = None) -> Utterance:
        """Queue `pcm`; which of its frames are speech is theirs, or `loud` (the frames of
        the speech before a codec changed it: its timing is what is measured)."""
        utterance = Utterance()
        for i, frame in enumerate(frames_of(pcm, self.frame_bytes)):
            speech = rms(frame) > LOUD_RMS if loud is None else i < len(loud) and loud[i]
            self.queue.append((frame, utterance, speech))
        return utterance

    def next_frame(self) -> bytes:
        if not self.queue:
            return bytes(self.frame_bytes)
        frame, utterance, loud = self.queue.popleft()
        utterance.sent(loud)
        return frame


class SpeakingTrack(ToneTrack):
    """The caller's microphone: silence, and what `speaker` is given to say."""

    def __init__(self) -> None:
        super().__init__()
        self.speaker = Speaker(FRAME_SAMPLES * 2)

    def _samples(self, start: int) -> bytes:
        return self.speaker.next_frame()


# -- what a path saw in one turn ---------------------------------------------------------------


@dataclass
class Heard:
    """Server events (arrival time, event) and loud assistant audio arrivals of one path."""

    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    loud: list[float] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def event(self, raw: str | bytes, at: float | None = None) -> None:
        try:
            event = json.loads(raw)
        except ValueError:
            return
        if isinstance(event, dict):
            self.events.append((time.monotonic() if at is None else at, event))
            self.changed.set()

    def first(self, kind: str, after: float) -> float | None:
        return next((t for t, e in self.events if t >= after and e.get("type") == kind), None)

    def first_loud(self, after: float) -> float | None:
        return next((t for t in self.loud if t > after), None)

    async def wait_for(self, kind: str, after: float, within: float) -> float:
        deadline = time.monotonic() + within
        while (at := self.first(kind, after)) is None:
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"no {kind} within {within:g} s")
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except TimeoutError:
                pass
        return at

    async def wait_quiet(self, since: float, quiet: float) -> None:
        """Until no loud audio arrived for `quiet` seconds (after `since`)."""
        deadline = time.monotonic() + TURN_TIMEOUT
        while time.monotonic() < deadline:
            last = max([since, *self.loud[-1:]])
            if time.monotonic() - last >= quiet:
                return
            await asyncio.sleep(0.05)


def split_turn(heard: Heard, utterance: Utterance, *, edge: bool) -> dict[str, Any]:
    """One turn's figures. The turn's user item is the one whose transcript came after the
    speech ended (VAD may have cut a longer utterance in two: the item that was answered is
    the last); its `speech_stopped` is matched by item id."""
    end = utterance.last_loud
    if end is None:
        raise BenchError("the caller's speech had no loud frame")
    first_audio = heard.first_loud(end)
    transcribed, item, transcript = None, None, None
    for t, e in heard.events:
        if t >= end and e.get("type") == TRANSCRIBED:
            transcribed, item, transcript = t, e.get("item_id"), e.get("transcript")
            if first_audio is None or t <= first_audio:
                continue
            break
    stopped = next(
        (
            t
            for t, e in heard.events
            if e.get("type") == "input_audio_buffer.speech_stopped" and e.get("item_id") == item
        ),
        None,
    )

    def ms(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round((b - a) * 1000, 1)

    # The assistant sends each sentence's words just before its audio: on every path the
    # words come over the events (the data channel, or the WebSocket) while the audio takes
    # the audio path, so words -> audio is the downlink's share, free of synthesis time.
    words = next(
        (t for t, e in heard.events if t >= (transcribed or end) and e.get("type") in WORDS),
        None,
    )
    row: dict[str, Any] = {
        "voice_to_voice_ms": ms(end, first_audio),
        "transcript": transcript,
        "speech_stopped_ms": ms(end, stopped),  # the uplink's share (+ the VAD's hangover)
        "words_to_audio_ms": ms(words, first_audio),
    }
    if not edge:
        row["vad_hangover_ms"] = ms(end, stopped)
        row["recognition_ms"] = ms(stopped, transcribed)
        row["synthesis_first_chunk_ms"] = ms(transcribed, first_audio)
    return row


# -- the edge path -------------------------------------------------------------------------------


class ListeningCaller(Caller):
    """The edge's caller, a measuring instrument: a frame counts from the moment its RTP
    packet arrived (decrypted), not from when the caller's stack has decoded it, so what is
    timed is the edge and not the client (stock aiortc's jitter buffer alone holds audio
    80 ms: prefetch 4). Its receiver hands each packet to the decoder at once (the
    transceiver's own low-latency buffer, depth 0 on a clean link), noting the arrival by
    RTP timestamp; a decoded frame carries that timestamp as its pts."""

    def __init__(self, track: SpeakingTrack, heard: Heard) -> None:
        super().__init__(track, data_channel=True)
        self.heard = heard
        self.arrivals: dict[int, float] = {}  # a packet's (mapped) RTP timestamp -> arrival
        assert self.channel is not None
        self.channel.on("message", heard.event)

    async def start(self, signal: Signal) -> None:
        await super().start(signal)
        from firsthop.services.bench import caller_hooks

        for transceiver in self.pc.getTransceivers():
            if transceiver.kind == "audio":
                buffer = caller_hooks.low_latency_receiver(transceiver.receiver)
                buffer.sink = self._noting(buffer.sink)

    def _noting(self, sink: Callable[[Any], None] | None) -> Callable[[Any], None]:
        def note(frame: Any) -> None:
            arrived = time.monotonic()
            if sink is not None:
                sink(frame)  # maps frame.timestamp to the decoder's clock, as its pts
            self.arrivals[frame.timestamp] = arrived
            if len(self.arrivals) > 4096:
                self.arrivals.pop(next(iter(self.arrivals)))

        return note

    def on_audio(self, frame: AudioFrame) -> None:
        if rms(to_mono(frame)) > LOUD_RMS:
            arrived = self.arrivals.get(frame.pts or 0)
            self.heard.loud.append(time.monotonic() if arrived is None else arrived)


async def edge_round(stack: Stack, texts: list[bytes], barge: list[tuple[bytes, bytes]]) -> Any:
    track = SpeakingTrack()
    heard = Heard()
    caller = ListeningCaller(track, heard)

    async def signal(offer: str) -> str:
        return await asyncio.to_thread(stack.offer_to_firsthop, offer, session=dict(SESSION))

    turns: list[dict[str, Any]] = []
    barge_ins: list[dict[str, Any]] = []
    try:
        await caller.start(signal)
        await asyncio.wait_for(caller.wait_connected(), 15)
        await heard.wait_for("session.created", 0, 10)
        for pcm in texts:
            turns.append(await _edge_turn(track, heard, pcm))
        for question, interruption in barge:
            barge_ins.append(await _barge_in(track, heard, question, interruption))
    finally:
        await caller.close()
    return turns, barge_ins


async def _edge_turn(track: SpeakingTrack, heard: Heard, pcm: bytes) -> dict[str, Any]:
    said = time.monotonic()
    utterance = track.speaker.say(pcm)
    try:
        done = await heard.wait_for("response.done", said, TURN_TIMEOUT)
        # the answer arrives faster than real time: it has been heard when the bridge says
        # the caller's output buffer stopped
        await heard.wait_for("output_audio_buffer.stopped", done, TURN_TIMEOUT)
    except BenchError as exc:
        return {"error": str(exc)}
    await heard.wait_quiet(said, QUIET_AFTER)
    return split_turn(heard, utterance, edge=True)


async def _barge_in(
    track: SpeakingTrack, heard: Heard, question: bytes, interruption: bytes
) -> dict[str, Any]:
    said = time.monotonic()
    asked = track.speaker.say(question)
    deadline = time.monotonic() + TURN_TIMEOUT
    while asked.last_loud is None or heard.first_loud(asked.last_loud) is None:
        if time.monotonic() > deadline:
            return {"error": "no answer to interrupt"}
        await asyncio.sleep(0.02)
    await asyncio.sleep(BARGE_AFTER)
    cut = track.speaker.say(interruption)
    await asyncio.wait_for(cut.started.wait(), TURN_TIMEOUT)
    assert cut.onset is not None
    onset = cut.onset
    try:
        started = await heard.wait_for("input_audio_buffer.speech_started", onset, TURN_TIMEOUT)
    except BenchError as exc:
        return {"error": str(exc)}
    # The cut answer's last frame heard: the last loud frame before the answer to the
    # interruption begins (a pause between clauses does not count as stopping: the clauses
    # after it were queued, and would have been heard had the bridge not cleared them).
    try:
        answered = await heard.wait_for("response.created", started, TURN_TIMEOUT)
    except BenchError:
        answered = started + 3.0
    last = max([onset, *(t for t in heard.loud if onset <= t < answered)])
    # Silent from the later of: the end of the last loud frame heard, and the moment the
    # bridge's clear reached the caller (`output_audio_buffer.cleared`, sent right after the
    # queue was emptied). The answer may have been between two clauses at the onset: then
    # nothing more was heard, but only the clear made sure of it.
    cleared = heard.first("output_audio_buffer.cleared", onset)
    silent = max(last + 0.02, cleared or 0.0)
    await heard.wait_for("response.done", said, TURN_TIMEOUT)
    await heard.wait_quiet(time.monotonic(), QUIET_AFTER)
    return {
        "barge_in_ms": round((silent - onset) * 1000, 1),
        "heard_after_onset_ms": round((last + 0.02 - onset) * 1000, 1),
        "onset_to_speech_started_ms": round((started - onset) * 1000, 1),
        "speech_started_to_silence_ms": round((silent - started) * 1000, 1),
        "cleared_seen": cleared is not None,
    }


# -- the direct path ------------------------------------------------------------------------


@dataclass
class Said:
    """One question for the direct path: 24 kHz audio, and which of its 20 ms frames are
    speech (of the question as said, before any codec)."""

    pcm: bytes
    loud: list[bool]


def direct_speech(speech48: bytes, *, opus: bool) -> Said:
    loud = [rms(f) > LOUD_RMS for f in frames_of(speech48, FRAME_SAMPLES * 2)]
    if not opus:
        return Said(resample(speech48, SAMPLE_RATE, REALTIME_RATE), loud)
    tail = bytes(FRAME_SAMPLES * 2 * 25)  # the codec's tail after the speech: 0.5 s
    coded = OpusLink.uplink().run(speech48 + tail)
    return Said(resample(coded, SAMPLE_RATE, REALTIME_RATE), loud)


async def direct_round(url: str, said: list[Said], *, opus: bool) -> list[dict[str, Any]]:
    """The same questions straight to the assistant's WebSocket; with `opus`, through
    WebRTC's codec both ways (`OpusLink`) but no network: the edge less its transport."""
    from websockets.asyncio.client import connect

    heard = Heard()
    speaker = Speaker(REALTIME_RATE // 50 * 2)
    turns: list[dict[str, Any]] = []
    playout = [0.0]  # when what has arrived so far will have been played
    down = OpusLink.downlink() if opus else None
    upsample = Resampler(REALTIME_RATE, SAMPLE_RATE)
    pending = bytearray()  # 48 kHz audio short of a whole frame
    async with connect(url, max_size=1 << 22) as ws:

        async def read() -> None:
            async for message in ws:
                arrived = time.monotonic()
                heard.event(message, arrived)
                at, event = heard.events[-1] if heard.events else (0.0, {})
                if at != arrived or event.get("type") not in AUDIO_DELTAS:
                    continue
                # played at real time from its arrival, after what is queued before it:
                # each loud 20 ms frame is heard when a client with no jitter buffer
                # would play it (what the edge's caller hears)
                pending.extend(upsample.push(base64.b64decode(str(event.get("delta", "")))))
                whole = len(pending) // (FRAME_SAMPLES * 2) * FRAME_SAMPLES * 2
                audio, pending[:whole] = bytes(pending[:whole]), b""
                starts = max(arrived, playout[0])
                for i, frame in enumerate(frames_of(audio, FRAME_SAMPLES * 2)):
                    if rms(down.frame(frame) if down else frame) > LOUD_RMS:
                        heard.loud.append(starts + i * 0.02)
                playout[0] = starts + len(audio) / (2 * SAMPLE_RATE)

        async def pace() -> None:
            start = time.monotonic()
            n = 0
            while True:
                frame = speaker.next_frame()
                audio = base64.b64encode(frame).decode()
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
                n += 1
                await asyncio.sleep(max(0.0, start + n * 0.02 - time.monotonic()))

        reader = asyncio.ensure_future(read())
        pacer = asyncio.ensure_future(pace())
        try:
            await ws.send(json.dumps({"type": "session.update", "session": SESSION}))
            await heard.wait_for("session.updated", 0, 10)
            for question in said:
                asked = time.monotonic()
                utterance = speaker.say(question.pcm, question.loud)
                try:
                    await heard.wait_for("response.done", asked, TURN_TIMEOUT)
                except BenchError as exc:
                    turns.append({"error": str(exc)})
                    continue
                # as the edge's caller does, listen to the whole answer before the next
                await asyncio.sleep(max(0.0, playout[0] - time.monotonic()) + QUIET_AFTER)
                turns.append(split_turn(heard, utterance, edge=False))
        finally:
            for task in (reader, pacer):
                task.cancel()
    return turns


# -- the run -----------------------------------------------------------------------------------


def run(*, turns: int, rounds: int, barge_ins: int, recognizer: str = "whisper") -> dict[str, Any]:
    questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(turns)]
    speech48 = [speak(q, SAMPLE_RATE) for q in questions]
    raw = [direct_speech(pcm, opus=False) for pcm in speech48]
    coded = [direct_speech(pcm, opus=True) for pcm in speech48]
    barge = [(speak(LONG_QUESTION, SAMPLE_RATE), speak(INTERRUPTION, SAMPLE_RATE))] * barge_ins
    stack = Stack(agent_kind="assistant", agent_extra=("--recognizer", recognizer))
    rows: list[dict[str, Any]] = []
    barges: list[dict[str, Any]] = []
    try:
        stack.start()
        direct_url = f"ws://127.0.0.1:{stack.agent_port}/v1/realtime"
        for rnd in range(1, rounds + 1):
            cuts = barge if rnd == 1 else []
            edge, cut = asyncio.run(edge_round(stack, speech48, cuts))
            direct = asyncio.run(direct_round(direct_url, raw, opus=False))
            opus = asyncio.run(direct_round(direct_url, coded, opus=True))
            for path, results in (("edge", edge), ("direct", direct), ("direct-opus", opus)):
                for question, row in zip(questions, results, strict=True):
                    rows.append({"path": path, "round": rnd, "question": question, **row})
            barges.extend(cut)
    finally:
        stack.stop()
    config = {
        "turns": turns,
        "rounds": rounds,
        "barge_ins": barge_ins,
        "questions": questions,
        "recognizer": recognizer,
    }
    return {"config": config, "rows": rows, "barge_ins": barges, "summary": summarize(rows, barges)}


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)], 1)


def _stats(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50": round(statistics.median(values), 1) if values else None,
        "p95": _pct(values, 0.95),
    }


def summarize(rows: list[dict[str, Any]], barges: list[dict[str, Any]]) -> dict[str, Any]:
    def gather(path: str, key: str) -> list[float]:
        return [r[key] for r in rows if r["path"] == path and r.get(key) is not None]

    summary: dict[str, Any] = {}
    for path in PATHS:
        summary[path] = {"voice_to_voice_ms": _stats(gather(path, "voice_to_voice_ms"))}
        summary[path]["failed_turns"] = sum(
            1 for r in rows if r["path"] == path and r.get("voice_to_voice_ms") is None
        )
    for key in ("vad_hangover_ms", "recognition_ms", "synthesis_first_chunk_ms"):
        summary["direct"][key] = _stats(gather("direct", key))
    edge_p50 = summary["edge"]["voice_to_voice_ms"]["p50"]
    direct_p50 = summary["direct"]["voice_to_voice_ms"]["p50"]
    whole = None if edge_p50 is None or direct_p50 is None else round(edge_p50 - direct_p50, 1)
    summary["edge_added_p50_ms"] = whole
    # Stage by stage, free of the turn-to-turn spread of synthesis time: the end of speech
    # seen later (uplink) plus the audio later behind its words (downlink), against a path.
    for path in PATHS:
        for key in ("speech_stopped_ms", "words_to_audio_ms"):
            summary[path][key] = _stats(gather(path, key))

    def added(path: str, reference: str) -> float | None:
        total = 0.0
        for key in ("speech_stopped_ms", "words_to_audio_ms"):
            a, b = summary[path][key]["p50"], summary[reference][key]["p50"]
            if a is None or b is None:
                return None
            total += float(a) - float(b)
        return round(total, 1)

    by_stage = summary["edge_added_by_stage_ms"] = added("edge", "direct")
    summary["codec_by_stage_ms"] = added("direct-opus", "direct")
    transport = summary["transport_by_stage_ms"] = added("edge", "direct-opus")
    summary["edge_target_met"] = by_stage is not None and by_stage <= TARGET_EDGE_P50_MS
    summary["transport_target_met"] = transport is not None and transport <= TARGET_EDGE_P50_MS
    cut = [b["barge_in_ms"] for b in barges if b.get("barge_in_ms") is not None]
    summary["barge_in_ms"] = _stats(cut)
    for key in ("onset_to_speech_started_ms", "speech_started_to_silence_ms"):
        summary[key] = _stats([b[key] for b in barges if b.get(key) is not None])
    summary["barge_in_target_met"] = bool(cut) and max(cut) <= TARGET_BARGE_IN_MS
    return summary


def _fmt(stats: dict[str, Any]) -> str:
    def one(v: float | None) -> str:
        return "–" if v is None else f"{v:.0f}"

    return f"p50 {one(stats['p50'])} ms, p95 {one(stats['p95'])} ms (n={stats['n']})"


def render(result: dict[str, Any]) -> str:
    s = result["summary"]
    lines = [
        f"firsthop bench voice: {result['config']['turns']} turns x "
        f"{result['config']['rounds']} rounds, {result['config']['barge_ins']} barge-ins, "
        f"recognizer {result['config'].get('recognizer', 'whisper')}",
        f"  voice-to-voice, through the edge   {_fmt(s['edge']['voice_to_voice_ms'])}",
        f"  voice-to-voice, direct WebSocket   {_fmt(s['direct']['voice_to_voice_ms'])}",
        f"  ... direct, through Opus both ways {_fmt(s['direct-opus']['voice_to_voice_ms'])}",
        f"    VAD hangover                     {_fmt(s['direct']['vad_hangover_ms'])}",
        f"    recognition                      {_fmt(s['direct']['recognition_ms'])}",
        f"    synthesis to first chunk         {_fmt(s['direct']['synthesis_first_chunk_ms'])}",
        f"  the edge adds, stage by stage      {s['edge_added_by_stage_ms']} ms "
        f"(target <= {TARGET_EDGE_P50_MS:.0f}: {'met' if s['edge_target_met'] else 'NOT met'}); "
        f"p50 edge - direct: {s['edge_added_p50_ms']} ms",
        f"    of it WebRTC's codec             {s['codec_by_stage_ms']} ms (direct-opus - direct)",
        f"    of it firsthop's transport       {s['transport_by_stage_ms']} ms "
        f"(edge - direct-opus; within the target: {'yes' if s['transport_target_met'] else 'NO'})",
        *(
            f"    {path:<12} speech end seen   {_fmt(s[path]['speech_stopped_ms'])}; "
            f"words -> audio {_fmt(s[path]['words_to_audio_ms'])}"
            for path in PATHS
        ),
        f"  barge-in to silence at the caller  {_fmt(s['barge_in_ms'])} "
        f"(target <= {TARGET_BARGE_IN_MS:.0f}: {'met' if s['barge_in_target_met'] else 'NOT met'})",
        f"    onset -> speech_started          {_fmt(s['onset_to_speech_started_ms'])}",
        f"    speech_started -> silence        {_fmt(s['speech_started_to_silence_ms'])}",
        "  failed turns: " + ", ".join(f"{p} {s[p]['failed_turns']}" for p in PATHS),
    ]
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    chosen = settings(args, QUICK if args.quick else DEFAULTS)
    return report(
        "voice",
        args,
        lambda: run(
            turns=int(chosen["turns"]),
            rounds=int(chosen["rounds"]),
            barge_ins=int(chosen["barge_ins"]),
            recognizer=args.recognizer,
        ),
        render,
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("voice", help="assistant voice-to-voice latency: through the edge vs direct")
    p.add_argument("--turns", type=int, help="spoken questions per call")
    p.add_argument("--rounds", type=int, help="interleaved rounds of the two paths")
    p.add_argument("--barge-ins", type=int, help="interruptions in the first edge call")
    p.add_argument("--quick", action="store_true", help="1 turn, 1 round, 1 barge-in")
    p.add_argument(
        "--recognizer", default="whisper", help="the assistant's: whisper | pocketsphinx"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_main)
