"""`firsthop bench recording`: what recording a call costs, per call-minute.

A minute of a call's two sides, as the media core hands them to the recorder: the caller's
Opus (speech from espeak-ng, coded by aiortc's encoder as an aiortc caller sends it: stereo,
VoIP; or by libopus at 32 kb/s mono, as browsers send) and the agent's (the transceiver's own
encoder, 48 kb/s), into `media/recorder.py`, pages written to a file as the transceiver writes
them. Reported: CPU per call-minute and as a share of a core while the call lasts, bytes per
call-minute, and, as the reference in the same run, the CPU the same minute costs the media
core to decode the caller's side and encode the agent's (what every call costs anyway). A
phone call's row (`phone-g711`): the same speech as a trunk's PCMU both ways into the WAVE
file, against G.711's own decode and encode (with the resampling to and from 48 kHz).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from firsthop.services.bench.measure import report
from firsthop.services.bench.voice import OpusLink, speak
from firsthop.services.transceiver.media.codecs import make_codec
from firsthop.services.transceiver.media.frames import FRAME_BYTES
from firsthop.services.transceiver.media.opus import OpusDecoder, OpusEncoder
from firsthop.services.transceiver.media.recorder import (
    CallRecorder,
    OggOpus,
    RecordingFormat,
    WavG711,
)

SAMPLE_RATE = 48000
MINUTE = 3000  # 20 ms slots


def _speech_minute() -> bytes:
    words = "the quick brown fox jumps over the lazy dog and asks what time it is"
    said = speak(words, SAMPLE_RATE)
    pcm = bytearray()
    while len(pcm) < MINUTE * FRAME_BYTES:
        pcm += said + bytes(FRAME_BYTES * 25)
    return bytes(pcm[: MINUTE * FRAME_BYTES])


def _packets(pcm: bytes, encode: Any) -> list[bytes]:
    return [encode(pcm[i : i + FRAME_BYTES]) for i in range(0, len(pcm), FRAME_BYTES)]


def _record(
    caller: list[bytes], agent: list[bytes], directory: str, file: RecordingFormat
) -> tuple[float, int]:
    """(CPU seconds, bytes) of recording one minute into `file`."""
    path = os.path.join(directory, f"minute{file.suffix}")
    started = time.process_time()
    with open(path, "wb") as f:
        recorder = CallRecorder(0.0, file)
        now = 0.0
        for i in range(MINUTE):
            recorder.caller(caller[i], i * file.frame, now + 0.002)
            recorder.agent(agent[i], now, now)
            f.write(recorder.take())
            now += 0.02
        f.write(recorder.close(now))
    return time.process_time() - started, os.path.getsize(path)


def _codec_minute(caller: list[bytes], agent_pcm: bytes, codec: str) -> float:
    """CPU seconds the call's own codec work takes for the minute: the caller's packets
    decoded and the agent's 48 kHz frames coded (for G.711: with its resampling both ways)."""
    decode: Callable[[bytes], object]
    if codec == "opus":
        decoder, encoder = OpusDecoder(), OpusEncoder(48000)
        decode, encode = decoder.decode, encoder.encode
    else:
        call = make_codec(codec)
        decode, encode = call.decode, call.encode
    started = time.process_time()
    for i in range(MINUTE):
        decode(caller[i])
        encode(agent_pcm[i * FRAME_BYTES : (i + 1) * FRAME_BYTES])
    return time.process_time() - started


def run(rounds: int = 3) -> dict[str, Any]:
    pcm = _speech_minute()
    agent = _packets(pcm, OpusEncoder(48000).encode)
    uplink = OpusLink.uplink()
    phone = _packets(pcm, make_codec("pcmu").encode)  # a trunk's PCMU, 20 ms a packet
    # (caller's packets, agent's packets, the file, the call's codec)
    calls: dict[str, tuple[list[bytes], list[bytes], Any, str]] = {
        "aiortc": (
            [
                uplink.packet(pcm[i : i + FRAME_BYTES]) or b"\xf8\xff\xfe"
                for i in range(0, len(pcm), FRAME_BYTES)
            ],
            agent,
            lambda: OggOpus(1),
            "opus",
        ),
        "browser-like": (
            _packets(pcm, OpusEncoder(32000).encode),
            agent,
            lambda: OggOpus(1),
            "opus",
        ),
        "phone-g711": (phone, phone, lambda: WavG711("pcmu"), "pcmu"),
    }
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="firsthop-bench-rec-") as directory:
        for name, (caller, sent, file, codec_name) in calls.items():
            cpu = [_record(caller, sent, directory, file()) for _ in range(rounds)]
            codec = [_codec_minute(caller, pcm, codec_name) for _ in range(rounds)]
            best, size = min(cpu)
            out[name] = {
                "cpu_ms_per_call_minute": round(best * 1000, 1),
                "core_share_while_recording": round(best / 60, 5),
                "bytes_per_call_minute": size,
                "codec_cpu_ms_per_call_minute": round(min(codec) * 1000, 1),
                "over_codec": round(best / min(codec), 3),
            }
    return out


def render(result: dict[str, Any]) -> str:
    lines = [
        "firsthop bench recording: one call-minute, both sides as carried (no re-encode): "
        "Ogg/Opus, a phone call's G.711 WAVE"
    ]
    for name, r in result.items():
        lines.append(
            f"  {name:<13} CPU {r['cpu_ms_per_call_minute']} ms a call-minute "
            f"({100 * r['core_share_while_recording']:.3f} % of a core), "
            f"{r['bytes_per_call_minute'] / 1e6:.2f} MB a call-minute; "
            f"the call's own decode + encode {r['codec_cpu_ms_per_call_minute']} ms "
            f"(recording = {r['over_codec']:.3f}x of it)"
        )
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    return report("recording", args, lambda: run(args.rounds), render)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("recording", help="a call recording's CPU and bytes per call-minute")
    p.add_argument("--rounds", type=int, default=3, help="minutes recorded (the best counts)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_main)
