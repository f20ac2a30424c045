"""`firsthop bench hearing`: how well the assistant hears open speech through the edge.

An aiortc caller (`voice.ListeningCaller`) calls the offline assistant through the relay, a
transceiver and its Realtime bridge, and says `SENTENCES` one by one (most of them off the
assistant's script) in a session that only transcribes (`create_response: false`); each
`conversation.item.input_audio_transcription.completed` after a sentence is what was heard.
Headless Chromium (Debian's, its fake microphone playing a WAV of the sentences, `getUserMedia`
with an app's defaults: its own echo cancelling, noise suppression and gain control on) makes
the same call once per condition; its transcripts are scored as one text against the
sentences as one (the VAD may cut or join turns; the words' order is what is compared).
Word error rate (substitutions + deletions + insertions over the reference's words, after
`normalize`) per recognizer (Whisper tiny.en, the default, against pocketsphinx, the same run,
each its own assistant process) and per condition:

* `piper/clean` (the neural voice), `espeak/clean` (espeak-ng, en-us);
* `piper/noisy`: the same speech with pink noise at `SNR_DB` (10 dB, over the speech's power,
  from half a second before the sentence to a second after);
* `piper/noisy+nr`: that, with `audio.input.noise_reduction: near_field` in the session (the
  transceiver runs RNNoise before the bridge).

Noise suppression is also measured off the edge, on the noisy set itself: the SNR before and
after RNNoise (speech power where the clean sentence is loud, noise power where it is silent,
both read from the same signal) and its CPU per call (time per 20 ms frame over 20 ms).

Targets (printed, not asserted): Whisper through the edge, WER <= 10 % for the neural voice
and <= 25 % for espeak-ng, clean; <= 30 % for the neural voice at 10 dB SNR; RNNoise +6 dB or
more, <= 1 % of a core per call.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from firsthop.services.bench.measure import BenchError, report, settings
from firsthop.services.bench.procs import Stack
from firsthop.services.bench.voice import (
    TRANSCRIBED,
    Heard,
    ListeningCaller,
    SpeakingTrack,
    speak,
)
from firsthop.services.call.caller import SAMPLE_RATE
from firsthop.services.transceiver.resample import resample

SENTENCES = (
    "What time is it?",
    "What is the date today?",
    "What can you do?",
    "What is your name?",
    "Can you book a table for two tonight?",
    "I would like to know the weather in Paris tomorrow.",
    "Please remind me to call my mother at six.",
    "How far is the moon from the earth?",
    "My flight leaves early on Monday morning.",
    "Could you turn off the lights in the kitchen?",
    "I need to buy milk, eggs and bread.",
    "The meeting has been moved to Thursday afternoon.",
    "Where is the nearest train station?",
    "My phone battery is almost empty.",
    "Can you recommend a good book to read?",
    "The children are playing in the garden.",
    "I forgot my password again.",
    "Please send the report before lunch.",
    "How much does a ticket to London cost?",
    "We are going hiking this weekend.",
    "The coffee machine is broken.",
    "Tell me something interesting about space.",
    "I would like to cancel my order.",
    "The package should arrive next week.",
    "Is the museum open on Sundays?",
    "Let us start the presentation now.",
    "My favourite colour is green.",
    "The bus was twenty minutes late today.",
    "Can you help me find my keys?",
    "I am looking for a quiet place to work.",
    "Thank you very much.",
    "Hello there.",
)
RECOGNIZERS = ("whisper", "pocketsphinx")
CALLERS = ("aiortc", "chromium")
CONDITIONS = ("piper/clean", "espeak/clean", "piper/noisy", "piper/noisy+nr")
SNR_DB = 10.0
LEAD_S, TAIL_S = 0.5, 1.0  # noise before and after a sentence (the room is noisy throughout)
HEARD_WITHIN = 8.0  # seconds after a sentence for its transcript
TARGETS = {"piper/clean": 10.0, "espeak/clean": 25.0, "piper/noisy": 30.0}
DEFAULTS: dict[str, Any] = {"sentences": len(SENTENCES)}
QUICK: dict[str, Any] = {"sentences": 6}

# What spelling and number words differ by, on either side (Whisper writes "6", "colour" or
# "color"; the references spell out).
_SAME = {
    "favorite": "favourite",
    "color": "colour",
    "let's": "let us",
    "where's": "where is",
    "what's": "what is",
    "i'm": "i am",
    "it's": "it is",
    "6": "six",
    "20": "twenty",
    "2": "two",
    "ok": "okay",
}


def normalize(text: str) -> list[str]:
    words: list[str] = []
    for word in re.findall(r"[a-z0-9']+", text.lower()):
        words += _SAME.get(word, word).split()
    return words


def word_errors(reference: str, heard: str) -> tuple[int, int]:
    """(edit distance in words, words in the reference)."""
    ref, hyp = normalize(reference), normalize(heard)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        diagonal, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (r != h))
    return row[len(hyp)], len(ref)


def pink_noise(samples: int, seed: int) -> np.ndarray:
    """1/f noise (power falls 3 dB an octave), unit RMS: a room's hum and bustle."""
    spectrum = np.fft.rfft(np.random.default_rng(seed).normal(size=samples))
    spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1.0))
    pink = np.fft.irfft(spectrum, samples)
    return np.asarray(pink / np.sqrt(np.mean(pink**2)))


def loud_mask(clean: np.ndarray, frame: int = 960) -> np.ndarray:
    """Per 20 ms frame: does the clean signal speak there."""
    frames = clean[: len(clean) // frame * frame].reshape(-1, frame)
    return np.asarray(np.sqrt(np.mean(frames**2, axis=1)) > 300.0)


def in_noise(speech: bytes, snr_db: float, seed: int) -> tuple[bytes, np.ndarray]:
    """`speech` (48 kHz PCM16) with noise `snr_db` under its speaking frames' power, from
    `LEAD_S` before to `TAIL_S` after; and the clean signal padded the same way."""
    lead, tail = int(LEAD_S * SAMPLE_RATE), int(TAIL_S * SAMPLE_RATE)
    clean = np.frombuffer(speech, "<i2").astype(np.float64)
    clean = np.concatenate((np.zeros(lead), clean, np.zeros(tail)))
    mask = np.repeat(loud_mask(clean), 960)
    power = float(np.mean(clean[: len(mask)][mask] ** 2)) if mask.any() else 1.0
    noise = pink_noise(len(clean), seed) * np.sqrt(power / 10 ** (snr_db / 10))
    noisy = (clean + noise).clip(-32768, 32767).astype("<i2").tobytes()
    return noisy, clean


def snr_db(signal: np.ndarray, clean: np.ndarray) -> float:
    """Speech over noise as read off `signal`: its power in the frames where `clean` speaks,
    less its power where it does not (the noise), over that noise power."""
    mask = loud_mask(clean)
    frames = signal[: len(mask) * 960].reshape(-1, 960)
    power = np.mean(frames**2, axis=1)
    noise = float(np.mean(power[~mask])) if (~mask).any() else 0.0
    speech = float(np.mean(power[mask])) - noise
    return float(10 * np.log10(max(speech, 1e-9) / max(noise, 1e-9)))


def denoised(noisy: bytes) -> tuple[np.ndarray, float]:
    """RNNoise over `noisy` as the transceiver runs it (20 ms frames); (output, seconds a
    frame)."""
    from firsthop.services.transceiver.media.denoise import Denoiser

    denoiser = Denoiser()
    out = bytearray()
    started = time.process_time()
    frames = 0
    for i in range(0, len(noisy) - 1919, 1920):
        out += denoiser.process(noisy[i : i + 1920])
        frames += 1
    took = (time.process_time() - started) / max(frames, 1)
    denoiser.close()
    return np.frombuffer(bytes(out), "<i2").astype(np.float64), took


def shipped_library() -> Any:
    """The library pyrnnoise ships (the same RNNoise and model, built with the weights' float
    copies, so on its float path), its entry points typed."""
    import ctypes
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("pyrnnoise")
    if spec is None or not spec.submodule_search_locations:
        raise BenchError("the reference needs pyrnnoise: pip install firsthop[noise]")
    lib = ctypes.CDLL(str(Path(next(iter(spec.submodule_search_locations))) / "librnnoise.so"))
    lib.rnnoise_create.argtypes, lib.rnnoise_create.restype = [ctypes.c_void_p], ctypes.c_void_p
    lib.rnnoise_destroy.argtypes = [ctypes.c_void_p]
    lib.rnnoise_process_frame.argtypes = [ctypes.c_void_p] * 3
    lib.rnnoise_process_frame.restype = ctypes.c_float
    return lib


def shipped_denoised(noisy: bytes) -> tuple[np.ndarray, float]:
    """The reference: `denoised` by the library pyrnnoise ships, called the same way."""
    lib = shipped_library()
    state = lib.rnnoise_create(None)
    out = np.empty(960, dtype=np.float32)
    pieces = []
    started = time.process_time()
    frames = 0
    for i in range(0, len(noisy) - 1919, 1920):
        block = np.frombuffer(noisy[i : i + 1920], "<i2").astype(np.float32)
        for half in (0, 480):
            lib.rnnoise_process_frame(
                state, out.ctypes.data + 4 * half, block.ctypes.data + 4 * half
            )
        pieces.append(out.clip(-32768, 32767).astype("<i2").tobytes())
        frames += 1
    took = (time.process_time() - started) / max(frames, 1)
    lib.rnnoise_destroy(state)
    return np.frombuffer(b"".join(pieces), "<i2").astype(np.float64), took


@dataclass
class Said:
    text: str
    pcm: bytes  # 48 kHz PCM16, as the caller's microphone gives it


def piper_speech(texts: list[str]) -> list[bytes]:
    from firsthop.services.agent.assistant.voice import PiperVoice, VoiceError

    try:
        voice = PiperVoice()
    except VoiceError as exc:
        raise BenchError(str(exc)) from exc
    return [resample(voice.synthesize(t), 24000, SAMPLE_RATE) for t in texts]


async def _call(stack: Stack, said: list[Said], noise_reduction: bool) -> list[str]:
    track = SpeakingTrack()
    heard = Heard()
    caller = ListeningCaller(track, heard)
    session = _session(noise_reduction)

    async def signal(offer: str) -> str:
        return await asyncio.to_thread(stack.offer_to_firsthop, offer, session=session)

    transcripts: list[str] = []
    try:
        await caller.start(signal)
        await asyncio.wait_for(caller.wait_connected(), 15)
        await heard.wait_for("session.created", 0, 10)
        for one in said:
            utterance = track.speaker.say(one.pcm)
            await asyncio.sleep(len(one.pcm) / (2 * SAMPLE_RATE) + 0.1)  # said at real time
            end = utterance.last_loud or time.monotonic()
            try:
                await heard.wait_for(TRANSCRIBED, end, HEARD_WITHIN)
            except BenchError:
                pass  # heard as nothing
            await asyncio.sleep(0.3)  # (a sentence the VAD cut in two: its second part)
            parts = [e.get("transcript") for _, e in heard.events if e.get("type") == TRANSCRIBED]
            transcripts.append(" ".join(p for p in parts if isinstance(p, str) and p))
            heard.events.clear()  # (what is left is this sentence's)
    finally:
        await caller.close()
    return transcripts


# -- the Chromium caller ---------------------------------------------------------------------

CHROMIUM_LEAD_S = 2.0  # the fake microphone plays from getUserMedia on: the call is up by then
CHROMIUM_GAP_S = 3.0  # between sentences: a turn ends, is transcribed, before the next
OFFER_JS = """
async () => {
  const pc = new RTCPeerConnection({iceServers: []});
  window.pc = pc;
  window.events = [];
  const mic = await navigator.mediaDevices.getUserMedia({audio: true});  // an app's defaults
  mic.getTracks().forEach((t) => pc.addTrack(t, mic));
  const dc = pc.createDataChannel("oai-events");
  dc.onmessage = (e) => window.events.push(JSON.parse(e.data));
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((res) => {
    if (pc.iceGatheringState === "complete") return res();
    pc.onicegatheringstatechange = () => pc.iceGatheringState === "complete" && res();
  });
  return pc.localDescription.sdp;
}
"""
HEARD_JS = (
    f'() => window.events.filter((e) => e.type === "{TRANSCRIBED}").map((e) => e.transcript || "")'
)


def _wav(path: str, said: list[Said]) -> float:
    """The sentences as one WAV for Chromium's fake microphone; its length in seconds."""
    import wave

    gap = bytes(int(CHROMIUM_GAP_S * SAMPLE_RATE) * 2)
    pcm = bytes(int(CHROMIUM_LEAD_S * SAMPLE_RATE) * 2) + b"".join(s.pcm + gap for s in said)
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm)
    return len(pcm) / (2 * SAMPLE_RATE)


def _chromium_call(stack: Stack, said: list[Said], noise_reduction: bool) -> list[str]:
    """Headless Chromium says every sentence in one call (its fake microphone plays a WAV of
    them); what the assistant transcribed, in order (the sentences are scored together)."""
    import tempfile

    from playwright.sync_api import sync_playwright

    from firsthop.services.bench.setup import CHROMIUM, CHROMIUM_ARGS

    with tempfile.TemporaryDirectory(prefix="firsthop-hearing-") as scratch:
        wav = f"{scratch}/said.wav"
        seconds = _wav(wav, said)
        args = [*CHROMIUM_ARGS, f"--use-file-for-fake-audio-capture={wav}"]
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=args)
            try:
                page = browser.new_page()
                page.route(
                    "http://localhost/",  # (a secure context: getUserMedia works there)
                    lambda route: route.fulfill(body="<!doctype html>", content_type="text/html"),
                )
                page.goto("http://localhost/")
                started = time.monotonic()
                offer = page.evaluate(OFFER_JS)
                answer = stack.offer_to_firsthop(offer, session=_session(noise_reduction))
                page.evaluate(
                    "(sdp) => window.pc.setRemoteDescription({type: 'answer', sdp})", answer
                )
                time.sleep(max(0.0, seconds - 0.5 - (time.monotonic() - started)))
                heard: list[str] = page.evaluate(HEARD_JS)
            finally:
                browser.close()
    return heard


def _session(noise_reduction: bool) -> dict[str, Any]:
    audio_in: dict[str, Any] = {"turn_detection": {"type": "server_vad", "create_response": False}}
    if noise_reduction:
        audio_in["noise_reduction"] = {"type": "near_field"}
    return {"type": "realtime", "model": "assistant", "audio": {"input": audio_in}}


def run(*, sentences: int, callers: tuple[str, ...] = CALLERS) -> dict[str, Any]:
    texts = list(SENTENCES[:sentences])
    piper = piper_speech(texts)
    espeak = [speak(t.rstrip(".?!"), SAMPLE_RATE) for t in texts]
    noisy, cleans = zip(*(in_noise(p, SNR_DB, i) for i, p in enumerate(piper)), strict=True)
    sets = {
        "piper/clean": [Said(t, p) for t, p in zip(texts, piper, strict=True)],
        "espeak/clean": [Said(t, p) for t, p in zip(texts, espeak, strict=True)],
        "piper/noisy": [Said(t, p) for t, p in zip(texts, noisy, strict=True)],
    }
    sets["piper/noisy+nr"] = sets["piper/noisy"]
    rows: list[dict[str, Any]] = []
    for recognizer in RECOGNIZERS:
        stack = Stack(agent_kind="assistant", agent_extra=("--recognizer", recognizer))
        try:
            stack.start()
            for caller in callers:
                for condition in CONDITIONS:
                    said = sets[condition]
                    nr = condition.endswith("+nr")
                    key = {"recognizer": recognizer, "caller": caller, "condition": condition}
                    if caller == "chromium":  # scored as one text: VAD may cut or join turns
                        heard = " ".join(_chromium_call(stack, said, nr))
                        reference = " ".join(one.text for one in said)
                        errors, words = word_errors(reference, heard)
                        rows.append({**key, "said": reference, "heard": heard, "errors": errors,
                                     "words": words, "sentences": len(said)})  # fmt: skip
                        continue
                    for one, text in zip(said, asyncio.run(_call(stack, said, nr)), strict=True):
                        errors, words = word_errors(one.text, text)
                        rows.append({**key, "said": one.text, "heard": text, "errors": errors,
                                     "words": words, "sentences": 1})  # fmt: skip
        finally:
            stack.stop()
    # Noise suppression off the edge, on the same noisy set.
    before, after, per_frame, shipped = [], [], [], []
    for pcm, clean in zip(noisy, cleans, strict=True):
        out, took = denoised(pcm)
        signal = np.frombuffer(pcm, "<i2").astype(np.float64)
        before.append(snr_db(signal, clean))
        after.append(snr_db(out, clean))
        per_frame.append(took)
        shipped.append(shipped_denoised(pcm)[1])
    suppression = {
        "snr_before_db": round(float(np.median(before)), 1),
        "snr_after_db": round(float(np.median(after)), 1),
        "snr_gain_db": round(float(np.median(np.array(after) - np.array(before))), 1),
        "us_per_frame": round(float(np.median(per_frame)) * 1e6, 1),
        "core_share_per_call": round(float(np.median(per_frame)) / 0.02, 4),
        "shipped_us_per_frame": round(float(np.median(shipped)) * 1e6, 1),
        "shipped_over_ours": round(float(np.median(shipped) / np.median(per_frame)), 2),
    }
    return {
        "config": {"sentences": texts, "snr_db": SNR_DB, "callers": list(callers)},
        "rows": rows,
        "summary": summarize(rows),
        "noise_suppression": suppression,
    }


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for recognizer in RECOGNIZERS:
        for caller in CALLERS:
            for condition in CONDITIONS:
                which = (recognizer, caller, condition)
                mine = [r for r in rows if (r["recognizer"], r["caller"], r["condition"]) == which]
                if not mine:
                    continue
                words = sum(r["words"] for r in mine)
                errors = sum(r["errors"] for r in mine)
                out[" ".join(which)] = {
                    "wer_pct": round(100 * errors / words, 1) if words else None,
                    "sentences": sum(r["sentences"] for r in mine),
                    "word_for_word": sum(
                        1 for r in mine if r["errors"] == 0 and r["sentences"] == 1
                    ),
                    "unheard": sum(1 for r in mine if not r["heard"]),
                }
    return out


def render(result: dict[str, Any]) -> str:
    s, ns = result["summary"], result["noise_suppression"]
    lines = [
        f"firsthop bench hearing: {len(result['config']['sentences'])} sentences, "
        f"{' and '.join(result['config']['callers'])} callers through relay + transceiver + "
        "Realtime bridge to the assistant",
        "  WER (word for word / sentences, unheard; chromium: all its sentences as one text)",
    ]
    for key, row in s.items():
        condition = key.rsplit(" ", 1)[1]
        target = TARGETS.get(condition) if key.startswith("whisper") else None
        goal = ""
        if target is not None:
            met = row["wer_pct"] is not None and row["wer_pct"] <= target
            goal = f"  (target <= {target:.0f} %: {'met' if met else 'MISSED'})"
        lines.append(
            f"    {key:<38} {row['wer_pct'] or 0:>6.1f} %  "
            f"({row['word_for_word']}/{row['sentences']}, {row['unheard']} unheard){goal}"
        )
    lines += [
        f"  RNNoise on the noisy set (pink noise, {result['config']['snr_db']:.0f} dB):",
        f"    SNR {ns['snr_before_db']} dB -> {ns['snr_after_db']} dB (median gain "
        f"{ns['snr_gain_db']} dB; target >= 6)",
        f"    CPU {ns['us_per_frame']} us per 20 ms frame = "
        f"{100 * ns['core_share_per_call']:.2f} % of a core per call (target <= 1 %); "
        f"pyrnnoise's own library {ns['shipped_us_per_frame']} us "
        f"({ns['shipped_over_ours']}x ours)",
    ]
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    chosen = settings(args, QUICK if args.quick else DEFAULTS)
    callers = CALLERS if args.caller == "both" else (args.caller,)
    return report(
        "hearing", args, lambda: run(sentences=int(chosen["sentences"]), callers=callers), render
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("hearing", help="the assistant's word error rate through the edge")
    p.add_argument("--sentences", type=int, help=f"how many of the {len(SENTENCES)} to say")
    p.add_argument("--quick", action="store_true", help="6 sentences")
    p.add_argument("--caller", default="both", help="aiortc | chromium | both")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_main)
