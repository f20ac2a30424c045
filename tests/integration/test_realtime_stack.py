"""The whole Realtime path with real parts only: the official `openai` SDK places the call on
signaling, an aiortc caller's media goes through the relay to a transceiver whose Realtime
bridge talks to the real offline assistant (`firsthop agent --kind assistant`), and the
sideband (`realtime.connect(call_id=...)`) reaches the real transceiver.

* a spoken question is transcribed and answered: events on the caller's `oai-events` channel
  in OpenAI's order, the answer heard as audio; the app's server drives the same call from
  the sideband (a text item and `response.create`); hangup ends it;
* the assistant killed mid-call: the caller gets an `error` event, the call stays up in
  silence, and once the assistant is back the bridge reconnects and the call talks again.
"""

from __future__ import annotations

import array
import asyncio
import json
import math
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from firsthop.services.call.caller import Caller, ToneTrack
from firsthop.services.transceiver.resample import resample
from tests.support import (
    AgentProcess,
    MediaStack,
    SignalingProcess,
    eventually,
    spoken,
)

pytestmark = pytest.mark.slow

KEY = SignalingProcess.API_KEY
Event = dict[str, Any]


Stack = MediaStack


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    assistant = AgentProcess("assistant")
    backend = f"realtime+ws://127.0.0.1:{assistant.port}/v1/realtime"
    with MediaStack.running(assistant, "assistant", backend, api_keys=KEY) as s:
        yield s


def events(caller: Caller) -> list[Event]:
    return [json.loads(m) for m in caller.result.events if isinstance(m, str)]


def of(caller: Caller, kind: str) -> list[Event]:
    return [e for e in events(caller) if e.get("type") == kind]


def loud_frames(caller: Caller) -> int:
    """20 ms frames the caller heard with speech in them (RMS over 300)."""
    samples = array.array("h")
    samples.frombytes(bytes(caller.result.received))
    n = 0
    for i in range(0, len(samples) - 959, 960):
        frame = samples[i : i + 960]
        n += math.sqrt(sum(x * x for x in frame) / 960) > 300
    return n


async def place_call(client: openai.OpenAI, question: str | None) -> tuple[Caller, str]:
    """An aiortc caller (saying `question` once, then silence) placed with the SDK's
    multipart `calls.create`, as an app's server does for a phone-like client."""
    pcm = resample(spoken(question), 24000, 48000) if question else None
    caller = Caller(ToneTrack(pcm=pcm) if pcm else ToneTrack(amplitude=0.0), data_channel=True)
    call_id: list[str] = []

    def create(offer: str) -> str:
        raw = client.realtime.calls.with_raw_response.create(
            sdp=offer, session={"type": "realtime", "model": "gpt-realtime"}
        )
        assert raw.http_response.status_code == 201
        call_id.append(raw.headers["location"].rsplit("/", 1)[1])
        return raw.text

    async def signal(offer: str) -> str:
        return await asyncio.to_thread(create, offer)

    await caller.start(signal)
    await asyncio.wait_for(caller.wait_connected(), 15)
    return caller, call_id[0]


def sdk(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.sig.url}/v1", api_key=KEY, max_retries=0, timeout=20)


def test_a_spoken_question_is_answered_and_the_sideband_drives_the_call(stack: Stack) -> None:
    client = sdk(stack)

    async def main() -> None:
        caller, call_id = await place_call(client, "what time is it")
        try:
            transcribed = "conversation.item.input_audio_transcription.completed"
            await eventually(lambda: of(caller, "output_audio_buffer.stopped"), 40)
            seen = [e["type"] for e in events(caller)]
            assert seen[0] == "session.created", seen
            assert all(isinstance(e.get("event_id"), str) for e in events(caller))
            order = [
                "input_audio_buffer.speech_started",
                "input_audio_buffer.speech_stopped",
                "input_audio_buffer.committed",
                transcribed,
                "response.created",
                "output_audio_buffer.started",
                "response.done",
                "output_audio_buffer.stopped",
            ]
            assert [seen.index(k) for k in order] == sorted(seen.index(k) for k in order), seen
            assert "time" in of(caller, transcribed)[0]["transcript"].lower()
            said = of(caller, "response.output_audio_transcript.done")[0]["transcript"]
            assert "time" in said.lower() or ":" in said, said
            # audio deltas are played, not sent on the channel (as OpenAI's WebRTC does)
            assert "response.output_audio.delta" not in seen
            assert loud_frames(caller) > 10  # the answer was heard: more than 0.2 s of speech
            # the app's server drives the same call from the sideband
            heard_before = loud_frames(caller)

            def sideband() -> list[str]:
                kinds: list[str] = []
                with client.realtime.connect(call_id=call_id) as conn:
                    conn.send(
                        {
                            "type": "conversation.item.create",
                            "item": {
                                "type": "message",
                                "role": "user",
                                "content": [{"type": "input_text", "text": "hello"}],
                            },
                        }
                    )
                    conn.send({"type": "response.create"})
                    for event in conn:
                        kinds.append(event.type)
                        if event.type == "response.done":
                            return kinds
                return kinds

            kinds = await asyncio.to_thread(sideband)
            assert "response.created" in kinds and kinds[-1] == "response.done", kinds
            await eventually(lambda: loud_frames(caller) > heard_before + 10, 20)
            # hangup: the transceiver closes the session, the caller's connection ends
            await asyncio.to_thread(client.realtime.calls.hangup, call_id)
            await eventually(lambda: caller.pc.connectionState != "connected", 1.0)
        finally:
            await caller.close()

    asyncio.run(main())
    client.close()


@pytest.mark.timeout(180)
def test_the_assistant_killed_mid_call_is_reported_and_reconnected(stack: Stack) -> None:
    client = sdk(stack)

    def ask(caller: Caller) -> None:
        assert caller.channel is not None
        text = {"type": "input_text", "text": "what can you do"}
        item = {"type": "message", "role": "user", "content": [text]}
        caller.channel.send(json.dumps({"type": "conversation.item.create", "item": item}))
        caller.channel.send(json.dumps({"type": "response.create"}))

    async def main() -> None:
        caller, _ = await place_call(client, None)
        try:
            await eventually(lambda: of(caller, "session.created"), 15)
            stack.agent.kill()
            await eventually(lambda: of(caller, "error"), 10)
            error = of(caller, "error")[0]["error"]
            assert error["type"] == "server_error", error
            # bad client events while it is gone: errors, and the call goes on
            assert caller.channel is not None
            caller.channel.send("not json")
            caller.channel.send(json.dumps({"type": "no.such.event"}))
            await eventually(lambda: len(of(caller, "error")) >= 3, 10)
            assert caller.pc.connectionState == "connected"
            await asyncio.to_thread(stack.agent.start, 60)
            # the bridge reconnects (backoff up to 5 s) and re-sends the session; then a
            # question typed on the channel is answered aloud
            done_before = len(of(caller, "response.done"))
            heard_before = loud_frames(caller)

            async def answered() -> bool:
                ask(caller)
                for _ in range(40):
                    if len(of(caller, "response.done")) > done_before:
                        return True
                    await asyncio.sleep(0.1)
                return False

            for _ in range(10):
                if await answered():
                    break
            else:
                raise AssertionError(f"no answer after the restart: {events(caller)[-5:]}")
            await eventually(lambda: loud_frames(caller) > heard_before + 10, 20)
            assert caller.pc.connectionState == "connected"
        finally:
            await caller.close()

    asyncio.run(main())
    client.close()
