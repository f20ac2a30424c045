"""The agent's outgoing track: what the caller's decoder makes of it around silences."""

from __future__ import annotations

import asyncio
import math

import numpy as np

from firsthop.services.call.caller import tone_power
from firsthop.services.transceiver.media.opus import OpusDecoder
from firsthop.services.transceiver.media.pacing import FRAME_SAMPLES
from firsthop.services.transceiver.rtc.audio import OPUS_SILENCE, AgentAudioTrack

TONE = (0.3 * 32767 * np.sin(2 * math.pi * 440 * np.arange(48000) / 48000)).astype(np.int16)


def tone_frame(i: int) -> bytes:
    at = (i * FRAME_SAMPLES) % (48000 - FRAME_SAMPLES)
    return TONE[at : at + FRAME_SAMPLES].tobytes()


async def play(script: list[bool]) -> list[bytes]:
    """Run the track through `script` (True: the agent's tone frame is there for this tick,
    False: nothing) and return the payloads it sent."""
    track = AgentAudioTrack()
    sent: list[bytes] = []
    for i, speaks in enumerate(script):
        if speaks:
            track.push(tone_frame(i))
        packet = await track.recv()
        sent.append(bytes(packet))
    track.stop()
    return sent


def levels(payloads: list[bytes]) -> list[float]:
    decoder = OpusDecoder()
    return [tone_power(decoder.decode(p), 440.0) for p in payloads]


def test_speech_after_a_gap_or_a_pause_decodes_at_its_level_at_once() -> None:
    script = [True] * 10 + [False] + [True] * 6 + [False] * 15 + [True] * 6
    sent = asyncio.run(play(script))
    power = levels(sent)
    full = min(power[5:10])
    assert full > 0.01
    after_gap = power[11:17]
    assert min(after_gap[1:]) > 0.5 * full, after_gap  # from the second frame on
    after_pause = power[32:38]
    assert min(after_pause[1:]) > 0.5 * full, after_pause
    # a long pause is the cached silence frame after the first few, encoded ones
    assert sent[20:32] == [OPUS_SILENCE] * 12
