"""A real Pipecat bot that Twilio would dial, for the Media Streams tests: `python -m
tests.pipecat_bot PORT`.

Written as Pipecat's own telephony examples are: a FastAPI WebSocket endpoint served by
uvicorn; the first messages parsed by the runner's `parse_telephony_websocket`; a
`TwilioFrameSerializer` made from the stream and call ids they carry, with
`auto_hang_up=False` (no Twilio REST API to call: the call ends when the socket closes); a
pipeline `transport.input() -> Echo -> transport.output()` that says back what it hears.
Nothing in it knows about firsthop.

A call whose `session` custom parameter (the caller's session config, as JSON) has
`{"pipecat": "speak-then-interrupt"}` gets `Speaker` instead of `Echo`: five seconds of a
600 Hz tone at once, then, 1.5 s in, Pipecat's own interruption (its transport drops what it
holds and the serializer sends Twilio's `clear`).

`GET /calls` answers the `start` messages' customParameters it has seen, so a test can check
what reached the bot.
"""

from __future__ import annotations

import array
import asyncio
import json
import math
import sys
from typing import Any

import uvicorn
from fastapi import FastAPI, WebSocket
from fastapi.responses import PlainTextResponse
from loguru import logger
from pipecat.frames.frames import Frame, InputAudioRawFrame, OutputAudioRawFrame, StartFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.runner.utils import parse_telephony_websocket
from pipecat.serializers.twilio import TwilioFrameSerializer
from pipecat.transports.websocket.fastapi import (
    FastAPIWebsocketParams,
    FastAPIWebsocketTransport,
)

app = FastAPI()
CALLS: list[dict[str, Any]] = []


class Echo(FrameProcessor):
    """The caller's audio, back to the caller."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, InputAudioRawFrame):
            out = OutputAudioRawFrame(frame.audio, frame.sample_rate, frame.num_channels)
            await self.push_frame(out, direction)
        else:
            await self.push_frame(frame, direction)


class Speaker(FrameProcessor):
    """An answer, cut short by Pipecat's barge-in."""

    TONE = 600.0

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
        if isinstance(frame, StartFrame):
            self.create_task(self._speak())

    async def _speak(self) -> None:
        w = 2 * math.pi * self.TONE / 8000
        for chunk in range(250):  # 5 s in 20 ms frames, handed to the transport at once
            samples = (int(9000 * math.sin(w * (chunk * 160 + i))) for i in range(160))
            pcm = array.array("h", samples).tobytes()
            await self.push_frame(OutputAudioRawFrame(pcm, 8000, 1))
        await asyncio.sleep(1.5)
        await self.broadcast_interruption()  # type: ignore[no-untyped-call]


@app.get("/calls")
async def calls() -> PlainTextResponse:
    return PlainTextResponse(json.dumps(CALLS))


@app.websocket("/ws")
async def media_stream(websocket: WebSocket) -> None:
    await websocket.accept()
    transport_type, call_data = await parse_telephony_websocket(websocket)
    assert transport_type == "twilio", transport_type
    CALLS.append(
        {"stream_sid": call_data.stream_id, "call_sid": call_data.call_id, "custom": call_data.body}
    )
    serializer = TwilioFrameSerializer(
        stream_sid=call_data.stream_id,
        call_sid=call_data.call_id,
        params=TwilioFrameSerializer.InputParams(auto_hang_up=False),
    )
    transport = FastAPIWebsocketTransport(
        websocket=websocket,
        params=FastAPIWebsocketParams(
            audio_in_enabled=True, audio_out_enabled=True, serializer=serializer
        ),
    )
    session = json.loads(call_data.body.get("session", "{}"))
    middle = Speaker() if session.get("pipecat") == "speak-then-interrupt" else Echo()
    pipeline = Pipeline([transport.input(), middle, transport.output()])
    task = PipelineTask(
        pipeline, params=PipelineParams(audio_in_sample_rate=8000, audio_out_sample_rate=8000)
    )

    @transport.event_handler("on_client_disconnected")  # type: ignore[untyped-decorator]
    async def on_client_disconnected(transport: Any, client: Any) -> None:
        await task.cancel()

    await PipelineRunner(handle_sigint=False).run(task)


if __name__ == "__main__":
    logger.remove()  # Pipecat logs every frame processor's life at DEBUG
    logger.add(sys.stderr, level="WARNING")
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
