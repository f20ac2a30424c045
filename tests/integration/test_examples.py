"""The README's examples run as shown: examples/realtime_sdk_call.py (the official `openai`
SDK's Realtime WebRTC flow) against a real stack, its call to the echo agent heard."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.integration.test_call_cli import signaling  # noqa: F401 - the stack fixture
from tests.support import SignalingProcess, service_env

ROOT = Path(__file__).resolve().parents[2]


def test_the_sdk_example_mints_a_key_calls_hears_its_echo_and_hangs_up(
    signaling: SignalingProcess,  # noqa: F811
) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "realtime_sdk_call.py"), signaling.url,
         signaling.API_KEY, "--seconds", "3"],
        capture_output=True, text=True, timeout=90, env=service_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert re.search(r"^ephemeral key ek_", out, re.M), out
    (call_id,) = re.findall(r"^call (\S+): answered$", out, re.M)
    assert f"call {call_id}: hung up" in out
    heard = re.search(r"heard ([\d.]+) s of audio, ([\d.]+) s of it audible", out)
    assert heard and float(heard[2]) > 1.0, out  # the tone came back from the echo agent
