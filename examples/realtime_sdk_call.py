"""A whole OpenAI Realtime WebRTC call through firsthop, with the official `openai` SDK.

    make up                                   # prints the demo URL and a dev API key
    .venv/bin/python examples/realtime_sdk_call.py http://127.0.0.1:8080 <the dev key>

What an app does against OpenAI, with only the base URL changed: the server mints an
ephemeral key (`client_secrets.create`) with its API key; the client places the WebRTC call
with that key (`calls.create` with its SDP offer) and reads the `oai-events` data channel; the
server hangs up (`calls.hangup`). The client here is aiortc playing a 440 Hz tone; `--model
echo` (the default) sends it to the echo agent, so the tone comes back; `--model
gpt-realtime` goes to the offline assistant (firsthop's default agent).
"""

from __future__ import annotations

import argparse
import asyncio
import json

import openai
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from firsthop.services.call.caller import ToneTrack, audible, to_mono


async def call(base: str, api_key: str, model: str, seconds: float) -> None:
    server = openai.OpenAI(base_url=f"{base}/v1", api_key=api_key)
    # 1. server side: an ephemeral key for this one client (an `ek_...`, short-lived)
    secret = server.realtime.client_secrets.create(session={"type": "realtime", "model": model})
    print(f"ephemeral key {secret.value[:12]}... for session {secret.session.id}")

    # 2. client side: a standard WebRTC offer, placed with the ephemeral key
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))  # no public STUN server
    pc.addTrack(ToneTrack(440.0))
    events = pc.createDataChannel("oai-events")
    heard = {"frames": 0, "audible": 0}

    @events.on("message")
    def on_event(message: str) -> None:
        event = json.loads(message)
        print(f"  event {event['type']}")

    @pc.on("track")
    def on_track(track: object) -> None:
        async def listen() -> None:
            while True:
                frame = await track.recv()  # type: ignore[attr-defined]
                heard["frames"] += 1
                heard["audible"] += audible(to_mono(frame))

        asyncio.ensure_future(listen())

    await pc.setLocalDescription(await pc.createOffer())
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=secret.value)
    raw = await asyncio.to_thread(
        client.realtime.calls.with_raw_response.create,
        sdp=pc.localDescription.sdp,
        session={"type": "realtime", "model": model},
    )
    call_id = raw.headers["location"].rsplit("/", 1)[1]
    await pc.setRemoteDescription(RTCSessionDescription(raw.http_response.text, "answer"))
    print(f"call {call_id}: answered")

    await asyncio.sleep(seconds)
    total, loud = heard["frames"] * 0.02, heard["audible"] * 0.02  # 20 ms frames
    print(f"heard {total:.1f} s of audio, {loud:.1f} s of it audible")

    # 3. server side: end the call
    await asyncio.to_thread(server.realtime.calls.hangup, call_id)
    await pc.close()
    print(f"call {call_id}: hung up")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("url", nargs="?", default="http://127.0.0.1:8080", help="signaling base URL")
    p.add_argument("api_key", help="a signaling API key (make up prints a dev one)")
    p.add_argument("--model", default="echo", help="echo, or gpt-realtime for the assistant")
    p.add_argument("--seconds", type=float, default=4.0, help="how long to stay on the call")
    args = p.parse_args()
    asyncio.run(call(args.url.rstrip("/"), args.api_key, args.model, args.seconds))


if __name__ == "__main__":
    main()
