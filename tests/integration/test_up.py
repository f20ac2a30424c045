"""`firsthop up` runs the whole stack: the demo page is served, a call works, and Ctrl-C
leaves no process behind."""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from firsthop.services.call.caller import Caller, ToneTrack, dominant
from tests.integration.test_transceiver import heard, hears
from tests.sip_phone import Phone, power_at, tone
from tests.support import UpStack, eventually


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
    up = UpStack()
    proc, lines, port = up.proc, up.lines, up.port
    try:
        up.start()
        key = up.said("dev API key")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
            assert r.status == 200 and b"firsthop" in r.read()
        # the relay takes ICE-TCP callers too, and the answers offer it (below UDP)
        tcp_port = int(up.said("relay ICE-TCP").rsplit(":", 1)[1])
        socket.create_connection(("127.0.0.1", tcp_port), timeout=5).close()
        # the relay's ready line says which address is UDP and which ICE-TCP
        ready = next(line for line in lines if "worker(s) on" in line)
        udp_tcp = rf"127\.0\.0\.1:\d+ UDP, 127\.0\.0\.1:{tcp_port} TCP \(ICE-TCP\)"
        assert re.search(udp_tcp, ready), ready

        answers: list[str] = []

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
                    answers.append(resp.read().decode())
                    return answers[-1]

            async def signal_(offer: str) -> str:
                return await asyncio.to_thread(post, offer)

            await c.start(signal_)
            await asyncio.wait_for(c.wait_connected(), 10)
            await eventually(lambda: hears(c, 550))
            loudest = dominant(heard(c), [350.0, 550.0, 750.0])
            await c.close()
            return loudest

        assert asyncio.run(call()) == 550.0
        assert " tcp " in answers[0] and f" {tcp_port} typ host tcptype passive" in answers[0]
        # a phone call too: up says where, and the echo agent answers it through the relay
        phones = up.said_all("phone (SIP)")
        assert f"sip:echo@127.0.0.1:{up.sip_port}" in phones
        assert f"sip:assistant@127.0.0.1:{up.sip_port}" in phones
        phone = Phone(("127.0.0.1", up.sip_port))
        try:
            assert phone.invite("echo")[1][-1].status == 200
            assert power_at(phone.talk(tone(800.0, 2.0))[-4000:], 800.0) > 0.5
            phone.send(phone.request("BYE"))
            assert phone.responses_until_final()[-1].status == 200
        finally:
            phone.close()
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
        up.reader.join(5)
        assert [p for p in children if _alive(p)] == []
    finally:
        up.kill()
