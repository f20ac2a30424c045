"""`firsthop call` against a real stack: HTTP and WebSocket signaling, timeline, echo delay,
and the reply saved as a WAV."""

from __future__ import annotations

import subprocess
import sys
import wave
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import (
    AgentProcess,
    RelayProcess,
    SignalingProcess,
    edge_for,
    service_env,
    start_all,
)


@pytest.fixture(scope="module")
def signaling() -> Iterator[SignalingProcess]:
    relay = RelayProcess()
    agent = AgentProcess("echo")
    start_all(relay, agent)
    tx, sig = edge_for(relay.listen, {"echo": agent})
    yield sig
    for p in (sig, tx, agent):
        p.kill()
    relay.kill()


@pytest.mark.parametrize("ws", [False, True])
def test_call_prints_the_timeline_and_echo_delay_and_saves_the_reply(
    signaling: SignalingProcess, tmp_path: Path, ws: bool
) -> None:
    out = tmp_path / "reply.wav"
    args = [
        sys.executable,
        "-m",
        "firsthop.services.cli",
        "call",
        signaling.url,
        "--api-key",
        signaling.API_KEY,
        "--seconds",
        "4",
        "--out",
        str(out),
    ]
    if ws:
        args.append("--ws")
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=service_env())
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout
    for line in (
        "answer from signaling",
        "ICE + DTLS connected",
        "first packet back",
        "first audio back",
        "echo delay (mouth to ear)",
        f"reply saved to {out}",
    ):
        assert line in text, text
    # the first audible frame, not the transceiver's first (silent) packet: the echo of the
    # first beep, which leaves after the call connects
    times = {
        key: float(line.split()[-2])
        for line in text.splitlines()
        for key in ("first packet back", "first audio back", "ICE + DTLS connected")
        if line.strip().startswith(key)
    }
    assert times["first audio back"] >= times["first packet back"], text
    assert times["first audio back"] > times["ICE + DTLS connected"], text
    with wave.open(str(out)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 48000)
        assert w.getnframes() > 48000 * 2  # more than 2 s of audio came back


def test_call_with_a_wrong_key_says_why(signaling: SignalingProcess) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "firsthop.services.cli",
            "call",
            signaling.url,
            "--api-key",
            "nope",
            "--seconds",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=service_env(),
    )
    assert done.returncode != 0
    assert "401" in done.stdout + done.stderr
