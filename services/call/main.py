"""`firsthop call`: dial a firsthop signaling server like any WebRTC client would.

Sends a WAV file or a beeping tone, records the reply to a WAV, and prints the setup
timeline (signaling answer, ICE+DTLS connected, first packet and first audible audio back),
against the echo agent the mouth-to-ear echo delay of each beep (sent frame -> its echo
heard), and against a Realtime agent (the assistant) what each side said.
Signaling over HTTP (WHIP-style `POST /v1/calls`) by default, or the WebSocket with `--ws`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import urllib.error
import urllib.request
import wave
from typing import Any

from firsthop.services.call.caller import SAMPLE_RATE, Caller, ToneTrack, beep_onsets
from firsthop.shared.config import add_option

BEEP_EVERY = 1.0
BEEP_LENGTH = 0.1


def load_wav(path: str) -> bytes:
    """PCM16 mono 48 kHz from any audio file av can read."""
    import av

    out = bytearray()
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    with av.open(path) as container:
        for frame in container.decode(audio=0):
            for res in resampler.resample(frame):
                out += bytes(res.planes[0])[: res.samples * 2]
    return bytes(out)


def save_wav(path: str, pcm: bytes) -> None:
    with wave.open(path, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm)


def http_signal(base: str, token: str, agent: str, info: dict[str, str]) -> Any:
    def post(offer: str) -> str:
        req = urllib.request.Request(
            f"{base}/v1/calls?agent={agent}",
            data=offer.encode(),
            method="POST",
            headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {token}"},
        )
        try:
            with urllib.request.urlopen(req, timeout=15) as resp:
                info["location"] = resp.headers.get("Location", "")
                info["transceiver"] = resp.headers.get("X-Firsthop-Transceiver", "")
                return str(resp.read().decode())
        except urllib.error.HTTPError as exc:
            raise SystemExit(
                f"signaling refused the call: {exc.code} {exc.read().decode()}"
            ) from exc

    async def signal(offer: str) -> str:
        return await asyncio.to_thread(post, offer)

    return signal


def ws_signal(base: str, token: str, agent: str, info: dict[str, str]) -> Any:
    async def signal(offer: str) -> str:
        import websockets

        url = base.replace("http", "ws", 1) + "/v1/ws"
        ws = await websockets.connect(url, max_size=1 << 16)
        info["_ws"] = ws  # type: ignore[assignment]
        await ws.send(json.dumps({"type": "auth", "token": token}))
        await ws.send(json.dumps({"type": "offer", "sdp": offer, "agent": agent}))
        while True:
            msg = json.loads(await ws.recv())
            if msg.get("type") == "answer":
                info["call_id"] = msg.get("call_id", "")
                return str(msg["sdp"])
            if msg.get("type") in ("error", "bye"):
                raise SystemExit(f"signaling refused the call: {msg}")

    return signal


# What a Realtime agent (the assistant, a Realtime backend) says on `oai-events`, as one line
SAID = {
    "conversation.item.input_audio_transcription.completed": "you said",
    "response.output_audio_transcript.done": "agent said",
    "response.audio_transcript.done": "agent said",  # the beta protocol's name
}


def transcript_lines(events: list[Any]) -> list[str]:
    """The lines worth printing from data-channel events: what each side said, and errors.
    Anything else (deltas, session and buffer events, what is not JSON) is skipped."""
    lines = []
    for raw in events:
        try:
            event = json.loads(raw)
        except (TypeError, ValueError):
            continue
        if not isinstance(event, dict):
            continue
        kind = event.get("type")
        if kind in SAID and isinstance(event.get("transcript"), str):
            lines.append(f"{SAID[kind]}: {event['transcript'].strip()}")
        elif kind == "error" and isinstance(event.get("error"), dict):
            lines.append(f"error: {event['error'].get('message', '')}")
    return lines


async def place_call(args: argparse.Namespace) -> int:
    pcm = load_wav(args.wav) if args.wav else None
    track = ToneTrack(args.tone, pcm=pcm, beep=None if pcm else (BEEP_EVERY, BEEP_LENGTH))
    caller = Caller(track, data_channel=True)
    info: dict[str, str] = {}
    base = args.url.rstrip("/")
    make = ws_signal if args.ws else http_signal
    t0 = time.monotonic()
    await caller.start(make(base, args.api_key, args.agent, info))
    await asyncio.wait_for(caller.wait_connected(), 15)
    tl = caller.result.timeline
    print(f"call {info.get('location') or info.get('call_id', '?')} via {args.url}")
    print(f"  answer from signaling  {tl['answer'] * 1000:7.1f} ms")
    print(f"  ICE + DTLS connected   {tl['state_connected'] * 1000:7.1f} ms")
    deadline = t0 + args.seconds
    shown = 0  # events of the data channel printed so far
    while time.monotonic() < deadline:
        await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        heard = len(caller.result.received) / 2 / SAMPLE_RATE
        print(f"  ... {time.monotonic() - t0:4.1f} s: heard {heard:4.1f} s of audio", flush=True)
        events, shown = caller.result.events[shown:], len(caller.result.events)
        for line in transcript_lines(events):
            print(f"  {line}", flush=True)
    if "first_audio_in" in tl:
        print(f"  first packet back      {tl['first_audio_in'] * 1000:7.1f} ms")
    if "first_sound_in" in tl:  # the first audible frame: what a listener hears first
        print(f"  first audio back       {tl['first_sound_in'] * 1000:7.1f} ms")
    else:
        print("  first audio back       (nothing audible came back)")
    if pcm is None and args.agent == "echo":
        delays = beep_onsets(caller)
        if delays:
            p50, lo, hi = statistics.median(delays), min(delays), max(delays)
            print(
                f"  echo delay (mouth to ear) p50 {p50 * 1000:.1f} ms, min {lo * 1000:.1f}, "
                f"max {hi * 1000:.1f} over {len(delays)} beeps"
            )
    if args.out:
        save_wav(args.out, bytes(caller.result.received))
        print(f"  reply saved to {args.out}")
    ws = info.get("_ws")
    if ws is not None:
        await ws.send(json.dumps({"type": "bye"}))  # type: ignore[attr-defined]
        await ws.close()  # type: ignore[attr-defined]
    elif info.get("location"):
        req = urllib.request.Request(
            base + info["location"],
            method="DELETE",
            headers={"Authorization": f"Bearer {args.api_key}"},
        )
        try:
            await asyncio.to_thread(urllib.request.urlopen, req, None, 5)
        except urllib.error.URLError:
            pass
    await caller.close()
    return 0


def run(args: argparse.Namespace) -> int:
    if not args.api_key:
        raise SystemExit("firsthop call: --api-key (or FIRSTHOP_API_KEY) is required")
    try:
        return asyncio.run(place_call(args))
    except (ConnectionError, TimeoutError) as exc:
        print(f"call failed: {exc}", file=sys.stderr)
        return 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], help: str) -> None:
    p = sub.add_parser("call", help=help)
    p.add_argument("url", nargs="?", default="http://127.0.0.1:8080", help="signaling base URL")
    add_option(p, "--api-key", default=None, help="API key or client secret")
    add_option(
        p,
        "--agent",
        default="echo",
        help="the agent signaling names: echo, parrot, assistant (firsthop up) or any "
        "--agent-url of yours",
    )
    add_option(p, "--wav", default=None, help="audio file to send (default: beeping tone)")
    add_option(p, "--tone", default=440.0, type=float, help="tone frequency, Hz")
    add_option(p, "--seconds", default=6.0, type=float, help="call length")
    add_option(p, "--out", default=None, help="save what comes back to this WAV file")
    add_option(p, "--ws", action="store_true", help="signal over the WebSocket")
    p.set_defaults(func=run)
