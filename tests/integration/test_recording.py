"""Call recording through the whole edge: an aiortc caller beeps at the echo agent through
signaling, the relay and a transceiver with `--record-dir`; the call asked (`?record=true`).
The file is fetched from signaling by the caller's credential once the call has ended, and
read by ffprobe and ffmpeg (Debian's): two channels, the call's length, the caller's beeps on
the left where they were said, the echo's on the right just after them (what the caller
heard). Refused: while the call lasts (409), to another credential (403), for a call that did
not ask (404: nothing was written for it)."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from firsthop.services.call.caller import Caller, ToneTrack
from tests.support import (
    AgentProcess,
    MediaStack,
    onsets,
    peak_hz,
    probe_recording,
    wait_until,
)

# (serial: its echo's lag is bounded at 0.25 s, about 50 ms alone: not beside another test's load)
pytestmark = [pytest.mark.slow, pytest.mark.serial]

KEY, OTHER = "recording-key", "someone-else"
SECONDS = 3.0
BEEP = (0.5, 0.2)  # every 0.5 s, 0.2 s of 440 Hz


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[MediaStack, Path]]:
    for tool in ("ffprobe", "ffmpeg"):
        assert shutil.which(tool), f"{tool} is not installed: run `make test` (it installs ffmpeg)"
    with tempfile.TemporaryDirectory(prefix="firsthop-rec-") as directory:
        echo = AgentProcess("echo")
        with MediaStack.running(
            echo, "echo", echo.url, api_keys=f"{KEY},{OTHER}", tx_args=("--record-dir", directory)
        ) as s:
            yield s, Path(directory)


def headers(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def beeping_call(stack: MediaStack, query: str, during: list[int]) -> tuple[str, Caller]:
    """A call of `SECONDS` beeps; `during`: the recording's status asked while it lasts."""
    caller = Caller(ToneTrack(beep=BEEP))
    placed: list[str] = []

    def post(offer: str) -> str:
        r = httpx.post(
            f"{stack.sig.url}/v1/calls?agent=echo{query}",
            content=offer,
            headers={"Content-Type": "application/sdp", **headers()},
        )
        assert r.status_code == 201, r.text
        placed.append(r.headers["Location"].rsplit("/", 1)[1])
        return r.text

    await caller.start(lambda offer: asyncio.to_thread(post, offer))
    await asyncio.wait_for(caller.wait_connected(), 10)
    await asyncio.sleep(SECONDS)
    (call_id,) = placed
    url = f"{stack.sig.url}/v1/calls/{call_id}/recording"
    during.append((await asyncio.to_thread(httpx.get, url, headers=headers())).status_code)
    await asyncio.to_thread(httpx.delete, f"{stack.sig.url}/v1/calls/{call_id}", headers=headers())
    await caller.close()
    return call_id, caller


def fetch(stack: MediaStack, call_id: str, key: str = KEY) -> httpx.Response:
    return httpx.get(f"{stack.sig.url}/v1/calls/{call_id}/recording", headers=headers(key))


def test_a_recorded_call_has_both_sides_aligned_for_its_owner_only(
    stack: tuple[MediaStack, Path],
) -> None:
    edge, directory = stack
    during: list[int] = []
    began = time.monotonic()
    call_id, caller = asyncio.run(beeping_call(edge, "&record=true", during))
    lasted = time.monotonic() - began
    assert during == [409]  # not while the call lasts
    wait_until(lambda: fetch(edge, call_id).status_code == 200, timeout=10)
    assert fetch(edge, call_id, OTHER).status_code == 403
    stream, pcm = probe_recording(fetch(edge, call_id).content, ".opus", 48000)
    assert stream["codec_name"] == "opus" and stream["channels"] == 2
    duration = stream["duration"]
    meta = json.loads((directory / f"{call_id}.json").read_text())
    assert abs(duration - meta["seconds"]) <= 0.02  # the file says what it holds, to a frame
    assert SECONDS < duration < lasted + 1.0, (duration, lasted)
    left, right = pcm[:, 0], pcm[:, 1]
    assert abs(peak_hz(left, 48000) - 440) < 5 and abs(peak_hz(right, 48000) - 440) < 5
    said, echoed = onsets(left, 48000), onsets(right, 48000)
    assert len(said) >= 5 and len(echoed) >= 5, (said, echoed)
    # the echo's beeps follow the caller's by the edge's round trip, not before, not later
    lags = [min((e - s for e in echoed if e >= s - 0.02), default=9.0) for s in said[:-1]]
    assert all(-0.021 <= lag <= 0.25 for lag in lags), lags
    # the caller heard as many beeps as the right channel holds (its playout: the same)
    heard = np.frombuffer(bytes(caller.result.received), "<i2").astype(np.float64)
    assert abs(len(onsets(heard, 48000)) - len(echoed)) <= 1


def test_no_recording_unless_asked_and_not_for_a_bad_word(stack: tuple[MediaStack, Path]) -> None:
    edge, directory = stack
    before = set(directory.iterdir())
    call_id, _ = asyncio.run(beeping_call(edge, "", []))
    assert fetch(edge, call_id).status_code == 404
    assert set(directory.iterdir()) == before  # nothing written for it
    r = httpx.post(
        f"{edge.sig.url}/v1/calls?agent=echo&record=maybe",
        content=b"v=0",
        headers={"Content-Type": "application/sdp", **headers()},
    )
    assert r.status_code == 400
