"""The call's 20 ms frame (media/frames.py): the one frame cutter, and the one owner of the
frame's rate and size that the media core and the Realtime and Twilio bridges all use."""

from __future__ import annotations

import ast
import pathlib

from hypothesis import given
from hypothesis import strategies as st

import firsthop
from firsthop.services.transceiver.agents.events import CallInfo
from firsthop.services.transceiver.agents.realtime import RealtimeProtocol
from firsthop.services.transceiver.agents.twilio import TwilioProtocol
from firsthop.services.transceiver.media.core import CallMedia, MediaParams
from firsthop.services.transceiver.media.frames import FRAME_BYTES, FrameCutter


@given(st.lists(st.binary(max_size=5000).map(lambda b: b[: len(b) // 2 * 2]), max_size=12))
def test_cut_frames_are_whole_and_lose_nothing(chunks: list[bytes]) -> None:
    cutter = FrameCutter()
    frames = [f for chunk in chunks for f in cutter.cut(chunk)]
    assert all(len(f) == FRAME_BYTES for f in frames)
    assert b"".join(frames) + bytes(cutter.held) == b"".join(chunks)
    assert len(cutter.held) < FRAME_BYTES
    padded = cutter.pad()
    if padded is None:
        assert sum(map(len, chunks)) % FRAME_BYTES == 0
    else:
        assert len(padded) == FRAME_BYTES and not cutter.held
        assert padded.rstrip(b"\0") == b"".join(chunks)[len(frames) * FRAME_BYTES :].rstrip(b"\0")


def test_lead_makes_a_first_output_whole_in_front() -> None:
    assert FrameCutter.lead(b"\1" * 1900) == bytes(20) + b"\1" * 1900
    assert FrameCutter.lead(b"\1" * FRAME_BYTES) == b"\1" * FRAME_BYTES
    assert FrameCutter.lead(b"\1" * 300, unit=320) == bytes(20) + b"\1" * 300


def test_the_core_and_both_bridges_cut_with_it() -> None:
    call = CallInfo("s1", "c1", None, None)
    assert isinstance(RealtimeProtocol(call)._out, FrameCutter)
    assert isinstance(TwilioProtocol(call)._out, FrameCutter)
    assert isinstance(CallMedia(MediaParams(ssrc=1, cname="x"))._cutter, FrameCutter)


def test_the_frame_has_one_owner() -> None:
    """No module but media/frames.py sets the call's rate or frame size."""
    root = pathlib.Path(firsthop.__file__).parent / "services" / "transceiver"
    owners = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and target.id in (
                        "CALL_RATE",
                        "FRAME_BYTES",
                        "FRAME_SAMPLES",
                    ):
                        owners.append(f"{path.relative_to(root)}:{target.id}")
    assert sorted(owners) == [
        "media/frames.py:CALL_RATE",
        "media/frames.py:FRAME_BYTES",
        "media/frames.py:FRAME_SAMPLES",
    ]
