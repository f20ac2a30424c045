"""Server-side noise suppression through the whole edge: an aiortc caller in a noisy room
calls the echo agent through signaling, the relay and a transceiver; with the native call's
`?noise_reduction=near_field` the transceiver runs RNNoise on what the agent hears (and so
on what the echo says back), without it the noise comes back as it went."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from firsthop.services.call.caller import Caller, ToneTrack
from tests.support import AgentProcess, MediaStack, SignalingProcess

pytestmark = pytest.mark.slow

KEY = SignalingProcess.API_KEY
SECONDS = 2.5


@pytest.fixture(scope="module")
def stack() -> Iterator[MediaStack]:
    echo = AgentProcess("echo")
    with MediaStack.running(echo, "echo", echo.url, api_keys=KEY) as s:
        yield s


def noise() -> bytes:
    samples = np.random.default_rng(11).normal(0, 2500, int(48000 * SECONDS) * 4)
    return samples.clip(-32768, 32767).astype("<i2").tobytes()


async def echo_of_noise(stack: MediaStack, query: str) -> tuple[float, httpx.Response | None]:
    caller = Caller(ToneTrack(pcm=noise()))
    refused: list[httpx.Response] = []

    def post(offer: str) -> str:
        r = httpx.post(
            f"{stack.sig.url}/v1/calls?agent=echo{query}",
            content=offer,
            headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {KEY}"},
        )
        if r.status_code != 201:
            refused.append(r)
            raise RuntimeError(r.text)
        return r.text

    try:
        await caller.start(lambda offer: asyncio.to_thread(post, offer))
    except RuntimeError:
        await caller.close()
        return math.nan, refused[0]
    await asyncio.wait_for(caller.wait_connected(), 10)
    await asyncio.sleep(SECONDS)
    await caller.close()
    heard = np.frombuffer(bytes(caller.result.received), "<i2").astype(np.float64)
    assert len(heard) > 48000, len(heard)  # over a second of echo
    tail = heard[len(heard) // 2 :]  # past RNNoise's first moments
    return float(np.sqrt(np.mean(tail**2))), None


def test_the_echo_of_a_noisy_room_is_quiet_only_when_the_call_asks(stack: MediaStack) -> None:
    def denoised() -> float:
        return stack.tx.event_count("frames_denoised")

    plain, _ = asyncio.run(echo_of_noise(stack, ""))
    assert denoised() == 0.0  # off unless asked
    quiet, _ = asyncio.run(echo_of_noise(stack, "&noise_reduction=near_field"))
    assert plain > 1000, plain  # the noise came back
    assert quiet < plain / 10, (quiet, plain)
    assert denoised() > 50  # the frames the agent heard went through RNNoise
    _, refused = asyncio.run(echo_of_noise(stack, "&noise_reduction=loud"))
    assert refused is not None and refused.status_code == 400
    assert "noise_reduction" in refused.text
    # (and this transceiver has no --record-dir: a call asking for a recording is refused)
    _, refused = asyncio.run(echo_of_noise(stack, "&record=true"))
    assert refused is not None and refused.status_code == 400
    assert "recording is off" in refused.text
