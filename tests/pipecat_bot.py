"""A real Pipecat bot that Twilio would dial, for the Media Streams tests: `python -m
tests.pipecat_bot PORT`.

Written as Pipecat's own telephony examples are: a FastAPI WebSocket endpoint served by
uvicorn; the first messages parsed by the runner's `parse_telephony_websocket`; a
`TwilioFrameSerializer` made from the stream and call ids they carry, with
`auto_hang_up=False` (no Twilio REST API to call: the call ends when the socket closes); a
pipeline `transport.input() -> Echo -> transport.output()` that says back what it hears.
Nothing in it knows about firsthop.

`GET /calls` answers the `start` messages' customParameters it has seen, so a test can check
what reached the bot.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import uvicorn
from fastapi import FastAPI, WebSocket
from fastapi.responses import PlainTextResponse
from loguru import logger
from pipecat.frames.frames import Frame, InputAudioRawFrame, OutputAudioRawFrame
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
    pipeline = Pipeline([transport.input(), Echo(), transport.output()])
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
