"""`firsthop up` runs the whole stack: the demo page is served, a call works, and Ctrl-C
leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

from firsthop.services.call.caller import Caller, ToneTrack, dominant
from tests.integration.test_transceiver import heard, hears
from tests.support import eventually, free_tcp_port, free_udp_port, wait_until


def _children(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    tree: dict[int, list[int]] = {}
    for line in out.splitlines():
        child, parent = map(int, line.split())
        tree.setdefault(parent, []).append(child)
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def test_up_serves_the_demo_a_call_works_and_ctrl_c_stops_everything() -> None:
    port, metrics = free_tcp_port(), free_tcp_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "firsthop.services.cli",
            "up",
            "--port",
            str(port),
            "--relay-port",
            str(free_udp_port()),
            "--relay-metrics-port",
            str(metrics),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("FIRSTHOP_")},
        start_new_session=True,  # so a failing test can take the whole tree down
    )
    lines: list[str] = []
    up = threading.Event()

    def drain() -> None:  # keep the pipe flowing: `up` logs for every service
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "firsthop is up" in line:
                up.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        assert up.wait(40), "".join(lines[-30:])
        # the summary lines follow the headline; the last one says how to stop
        wait_until(lambda: any("Ctrl-C stops everything" in line for line in lines), 5)
        key = next(line.split()[-1] for line in lines if "dev API key" in line)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
            assert r.status == 200 and b"firsthop" in r.read()

        async def call() -> float:
            c = Caller(ToneTrack(550))

            def post(offer: str) -> str:
                req = urllib.request.Request(
                    f"http://127.0.0.1:{port}/v1/calls?agent=echo",
                    data=offer.encode(),
                    method="POST",
                    headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {key}"},
                )
                with urllib.request.urlopen(req, timeout=10) as resp:
                    assert resp.status == 201
                    return str(resp.read().decode())

            async def signal_(offer: str) -> str:
                return await asyncio.to_thread(post, offer)

            await c.start(signal_)
            await asyncio.wait_for(c.wait_connected(), 10)
            await eventually(lambda: hears(c, 550))
            loudest = dominant(heard(c), [350.0, 550.0, 750.0])
            await c.close()
            return loudest

        assert asyncio.run(call()) == 550.0
        # up generated an internal token: the call went through, and without it a
        # transceiver's internal API refuses
        tx_url = next(line.split()[1] for line in lines if line.strip().startswith("transceivers"))
        unauthorized = urllib.request.Request(
            f"{tx_url}/internal/v1/drain", data=b"", method="POST"
        )
        try:
            urllib.request.urlopen(unauthorized, timeout=5)
            raise AssertionError("the internal API answered without a token")
        except urllib.error.HTTPError as exc:
            assert exc.code == 401
        children = _children(proc.pid)
        assert len(children) >= 7  # redis, relay (+worker), 2 transceivers, 2 agents, signaling
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=20)
        reader.join(5)
        assert [p for p in children if _alive(p)] == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # `up` and every service it started
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
