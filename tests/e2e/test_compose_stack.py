"""`docker compose up` for real: compose.yaml and the Dockerfile on a real engine, called from
this host the way a user would.

The image is built from the Dockerfile on a local Python base (`FIRSTHOP_PYTHON_IMAGE`: no
registry is reachable here); an override replaces only what cannot be pulled: Redis (Debian's
redis-server) and Jaeger (an idle stand-in, while every service exports its spans to a real
OTLP receiver in this test). The stack runs with every published port moved to a free one,
its own /24, FIRSTHOP_BIND=0.0.0.0 and FIRSTHOP_PUBLIC_HOST on the host side of a veth pair,
so callers reach it across a network namespace through the engine's DNAT, as a LAN caller
would: `firsthop call` (aiortc) from this host, headless Chromium in the namespace over UDP
and, with the namespace's UDP dropped, over ICE-TCP. Then a transceiver is stopped (its calls
end with `bye: drain`, new calls go to the other), Redis restarts (calls go on), and
`docker compose down` ends it all.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.docker_engine import base_images, builder_image, docker, engine
from tests.e2e.test_browser import demo_call
from tests.e2e.test_browser_ice_tcp import SELECTED_PAIR_JS, chromium_in
from tests.otlp import OtlpCollector
from tests.sip_phone import Phone, power_at, tone
from tests.support import (
    Namespace,
    free_tcp_port,
    free_udp_port,
    network_namespace,
    service_env,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
API_KEY = "dev-key-change-me"  # compose.yaml's dev default
OURS = ("relay", "transceiver-1", "transceiver-2", "signaling", "agent-echo", "agent-parrot",
        "agent-assistant")  # fmt: skip
TRACED = {"firsthop-signaling", "firsthop-relay", "firsthop-transceiver", "firsthop-agent-echo"}
DRAIN_S = 4  # the transceivers' --drain-seconds here (compose's default: 10)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def free_net() -> str:
    """A /24 (first three octets) no interface or route of this host uses."""
    used = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    used += subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    cidrs = re.findall(r"\d+\.\d+\.\d+\.\d+/\d+", used)
    nets = [ipaddress.ip_network(n, strict=False) for n in cidrs]
    for i in range(1, 255):
        candidate = ipaddress.ip_network(f"10.201.{i}.0/24")
        if not any(candidate.overlaps(n) for n in nets):
            return f"10.201.{i}"
    raise RuntimeError("no free 10.201.x.0/24 for the compose network")


@dataclass
class Stack:
    ns: Namespace
    otlp: OtlpCollector
    env: dict[str, str]
    override: Path
    ports: dict[str, int]
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def host(self) -> str:
        return self.ns.host

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.ports['signaling']}"

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        files = ["-f", str(ROOT / "compose.yaml"), "-f", str(self.override)]
        return docker("compose", *files, *args, timeout=timeout, env=self.env, cwd=ROOT)

    def logs(self) -> str:
        try:
            return self.compose("logs", "--no-color", "--tail", "40", timeout=60).stdout
        except Exception as exc:  # noqa: BLE001 - a diagnostic only
            return f"(no logs: {exc})"

    def exec_py(self, service: str, code: str) -> str:
        return self.compose("exec", "-T", service, "python", "-c", code, timeout=60).stdout

    def tx_sessions(self, service: str, ip: str) -> int:
        """The transceiver's live sessions, read from its /metrics inside its container."""
        text = self.exec_py(
            service,
            "import urllib.request as u; "
            f"print(u.urlopen('http://{ip}:8081/metrics', timeout=5).read().decode())",
        )
        m = re.search(r"^firsthop_transceiver_sessions(?:\{[^}]*\})? (\S+)$", text, re.M)
        return int(float(m[1])) if m else 0

    def call(self, *args: str, seconds: float = 3.0) -> str:
        """`firsthop call` from this host (aiortc) to the echo agent; its output."""
        done = subprocess.run(
            [sys.executable, "-m", "firsthop.services.cli", "call", self.url, "--api-key",
             API_KEY, "--seconds", str(seconds), *args],
            capture_output=True, text=True, timeout=120, env=service_env(),
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr + self.logs()
        return done.stdout


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    print(engine())
    python_image, redis_image = base_images()
    with network_namespace() as ns, OtlpCollector(host="0.0.0.0") as otlp:
        net = free_net()
        ports = {
            "relay": free_udp_port("0.0.0.0"),
            "relay_tcp": free_tcp_port("0.0.0.0"),
            "signaling": free_tcp_port("0.0.0.0"),
            "jaeger": free_tcp_port("0.0.0.0"),
            "sip": free_udp_port("0.0.0.0"),
        }
        env = {
            **os.environ,
            "COMPOSE_PROJECT_NAME": f"firsthop-test-{os.getpid()}",
            "FIRSTHOP_PYTHON_IMAGE": python_image,
            "FIRSTHOP_BUILDER_IMAGE": builder_image(),
            "FIRSTHOP_BIND": "0.0.0.0",
            "FIRSTHOP_PUBLIC_HOST": ns.host,
            "FIRSTHOP_NET": net,
            "FIRSTHOP_DRAIN_SECONDS": str(DRAIN_S),
            "FIRSTHOP_RELAY_PORT": str(ports["relay"]),
            "FIRSTHOP_RELAY_TCP_PORT": str(ports["relay_tcp"]),
            "FIRSTHOP_SIGNALING_PORT": str(ports["signaling"]),
            "FIRSTHOP_JAEGER_PORT": str(ports["jaeger"]),
            "FIRSTHOP_SIP_PORT": str(ports["sip"]),
            "FIRSTHOP_SIP_TRUNKS": f"veth={ns.host}/32",  # the phone below calls from there
        }
        # the spans go to this test's receiver, on the edge network's gateway (this host)
        endpoint = f"http://{net}.1:{otlp.port}"
        override: dict[str, Any] = {
            "services": {
                "redis": {"image": redis_image},
                "jaeger": {"image": python_image, "command": ["sleep", "infinity"], "init": True},
                **{s: {"environment": {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}} for s in OURS},
            }
        }
        path = tmp_path_factory.mktemp("compose") / "override.yaml"
        path.write_text(yaml.safe_dump(override))
        s = Stack(ns, otlp, env, path, ports)
        try:
            t0 = time.monotonic()
            s.compose("build", timeout=1200)
            s.figures["build_s"] = round(time.monotonic() - t0, 1)
            size = docker("image", "inspect", "-f", "{{.Size}}", "firsthop:dev").stdout
            s.figures["image_mb"] = round(int(size) / 1e6)
            t0 = time.monotonic()
            try:
                s.compose("up", "-d", "--wait", "--wait-timeout", "240", timeout=300)
            except Exception as exc:
                raise AssertionError(f"{exc}\n{s.logs()}") from exc
            s.figures["up_wait_s"] = round(time.monotonic() - t0, 1)
            yield s
        finally:
            try:
                if "down_s" not in s.figures:
                    s.compose("down", "-t", "20", "--remove-orphans", timeout=120)
            finally:
                print(f"compose figures: {json.dumps(s.figures)}")


def test_every_service_is_up_and_healthy_from_the_one_image(stack: Stack) -> None:
    listing = stack.compose("ps", "--format", "json").stdout
    rows = [json.loads(line) for line in listing.splitlines() if line.strip()]
    state = {r["Service"]: (r["State"], r.get("Health", "")) for r in rows}
    assert set(state) == {*OURS, "redis", "jaeger"}, state
    assert all(s == "running" for s, _ in state.values()), state
    assert all(state[name][1] == "healthy" for name in (*OURS, "redis")), state
    images = {r["Service"]: r["Image"] for r in rows}
    assert {images[name] for name in OURS} == {"firsthop:dev"}
    # read-only roots, yet the assistant (whose models want a temp dir) is up: /tmp is tmpfs
    out = stack.exec_py("agent-assistant", "import tempfile; print(tempfile.mkstemp()[1])")
    assert out.startswith("/tmp/")
    denied = stack.compose("exec", "-T", "relay", "sh", "-c", "touch /x 2>&1 || true").stdout
    assert "Read-only file system" in denied
    # the image's relay runs the C data path (built in the builder stage, which has gcc)
    assert "data path c" in stack.compose("logs", "relay").stdout


def test_a_caller_from_this_host_hears_its_echo_and_the_call_is_one_trace(stack: Stack) -> None:
    out = stack.call()
    m = re.search(r"^call /v1/calls/(\S+) via", out, re.M)
    assert m, out
    call_id = m[1]
    delay = re.search(r"echo delay \(mouth to ear\) p50 ([\d.]+) ms", out)
    assert delay, out
    stack.figures["echo_p50_ms"] = float(delay[1])
    first = re.search(r"first audio back\s+([\d.]+) ms", out)
    assert first, out
    stack.figures["first_audio_ms"] = float(first[1])

    def spans_of_the_call() -> list[Any]:
        mine = [
            s
            for s in stack.otlp.named("transceiver.session")
            if s.attributes.get("firsthop.call_id") == call_id
        ]
        if len(mine) != 1:
            return []
        trace = [s for s in stack.otlp.spans if s.trace_id == mine[0].trace_id]
        return trace if TRACED <= {s.service for s in trace} else []

    try:
        wait_until(spans_of_the_call, timeout=30)
    except AssertionError as exc:
        seen = sorted({(s.service, s.name, s.trace_id[:8]) for s in stack.otlp.spans})
        raise AssertionError(f"the call's trace is not whole: {call_id}; spans: {seen}") from exc
    trace = spans_of_the_call()
    names = {s.name for s in trace}
    assert {"signaling.place_call", "transceiver.session", "relay.flow", "agent.session"} <= names
    (place,) = [s for s in trace if s.name == "signaling.place_call"]
    assert place.service == "firsthop-signaling"
    # one trace per call: no other trace holds this call's spans
    others = {
        s.trace_id for s in stack.otlp.spans if s.attributes.get("firsthop.call_id") == call_id
    }
    assert others == {place.trace_id}


def test_chromium_across_the_veth_hears_its_echo_over_udp_and_over_ice_tcp(stack: Stack) -> None:
    origin = stack.url
    for udp_blocked, proto, port in (
        (False, "udp", stack.ports["relay"]),
        (True, "tcp", stack.ports["relay_tcp"]),
    ):
        stack.ns.block_udp(udp_blocked)
        try:
            with chromium_in(stack.ns, origin) as page:
                timeline = demo_call(page, origin + "/", API_KEY)
                local, remote, remote_port = page.evaluate(SELECTED_PAIR_JS)
                assert (local, remote, remote_port) == (proto, proto, port), timeline
                stack.figures[f"chromium_{proto}"] = timeline
                page.click("#stop")
                page.wait_for_function("document.getElementById('state').textContent === 'idle'")
        finally:
            stack.ns.block_udp(False)


def test_a_phone_across_the_veth_hears_its_echo_through_the_relay(stack: Stack) -> None:
    """SIP on signaling's published port, plain RTP through the relay's (the engine's DNAT
    keeps the phone's address, so its media comes from where its SDP says)."""
    phone = Phone((stack.host, stack.ports["sip"]), host=stack.host)
    try:
        t0 = time.monotonic()
        _, responses = phone.invite("echo")
        assert responses[-1].status == 200, stack.logs()
        stack.figures["sip_invite_to_200_s"] = round(time.monotonic() - t0, 3)
        assert phone.media_target == (stack.host, stack.ports["relay"])
        heard = phone.talk(tone(650.0, 3.0))
        assert power_at(heard[-8000:], 650.0) > 0.5, stack.logs()
        phone.send(phone.request("BYE"))
        assert phone.responses_until_final()[-1].status == 200
    finally:
        phone.close()


async def _ws_call(stack: Stack) -> tuple[Any, Any, Any]:
    """A call placed over the WebSocket from this host: (caller, websocket, its call_id)."""
    import websockets

    from firsthop.services.call.caller import Caller, ToneTrack

    ws = await websockets.connect(stack.url.replace("http", "ws", 1) + "/v1/ws")
    await ws.send(json.dumps({"type": "auth", "token": API_KEY}))
    caller = Caller(ToneTrack(440))
    answered: dict[str, Any] = {}

    async def signal(offer: str) -> str:
        await ws.send(json.dumps({"type": "offer", "sdp": offer, "agent": "echo"}))
        while True:
            msg = json.loads(await ws.recv())
            if msg["type"] == "answer":
                answered.update(msg)
                return str(msg["sdp"])
            assert msg["type"] not in ("error", "bye"), msg

    await caller.start(signal)
    await asyncio.wait_for(caller.wait_connected(), 15)
    assert json.loads(await asyncio.wait_for(ws.recv(), 5)) == {"type": "state", "state": "live"}
    return caller, ws, answered["call_id"]


def test_a_stopped_transceiver_drains_its_calls_and_new_ones_go_to_the_other(
    stack: Stack,
) -> None:
    tx1_ip = f"{stack.env['FIRSTHOP_NET']}.21"

    async def main() -> dict[str, Any]:
        calls = []
        # (a session of an earlier test may still be ending there: count ours only)
        baseline = await asyncio.to_thread(stack.tx_sessions, "transceiver-1", tx1_ip)
        # calls until one is on transceiver-1 (placement spreads them; the bound is generous)
        for _ in range(8):
            calls.append(await _ws_call(stack))
            if await asyncio.to_thread(stack.tx_sessions, "transceiver-1", tx1_ip) > baseline:
                break
        on_tx1 = await asyncio.to_thread(stack.tx_sessions, "transceiver-1", tx1_ip) - baseline
        assert on_tx1 > 0, "no call was placed on transceiver-1"
        t0 = time.monotonic()
        stop = asyncio.create_task(asyncio.to_thread(stack.compose, "stop", "transceiver-1"))

        async def bye_of(ws: Any) -> Any:
            while True:  # a call on transceiver-1 ends; one on transceiver-2 stays quiet
                msg = json.loads(await ws.recv())
                if msg["type"] == "bye":
                    return msg

        pending = {asyncio.create_task(bye_of(ws)) for _, ws, _ in calls}
        byes: list[Any] = []
        deadline = time.monotonic() + DRAIN_S + 15  # the drain and a margin
        while pending and len(byes) < on_tx1 and time.monotonic() < deadline:
            done, pending = await asyncio.wait(
                pending, timeout=deadline - time.monotonic(), return_when=asyncio.FIRST_COMPLETED
            )
            byes += [d.result() for d in done]
        for task in pending:
            task.cancel()
        drained_s = time.monotonic() - t0
        # while it is stopped, a new call is placed, and it is on transceiver-2
        new_out = await asyncio.to_thread(stack.call)
        await stop
        for caller, ws, _ in calls:
            await ws.close()
            await caller.close()
        return {
            "byes": byes,
            "on_tx1": on_tx1,
            "calls": [call_id for _, _, call_id in calls],
            "drained_s": drained_s,
            "new": new_out,
        }

    result = asyncio.run(main())
    # each call on transceiver-1 heard why it ended; those on transceiver-2 heard nothing
    assert result["byes"] and len(result["byes"]) >= result["on_tx1"], result
    assert len(result["byes"]) < len(result["calls"]) or result["on_tx1"] == len(result["calls"])
    assert all(b == {"type": "bye", "reason": "drain"} for b in result["byes"]), result
    assert "echo delay (mouth to ear)" in result["new"], result["new"]
    stack.figures["drain_s"] = round(result["drained_s"], 1)
    stack.compose("start", "transceiver-1")
    stack.compose("up", "-d", "--wait", "--wait-timeout", "120", timeout=180)


def test_calls_go_on_across_a_redis_restart(stack: Stack) -> None:
    async def main() -> tuple[int, int]:
        caller, ws, _ = await _ws_call(stack)
        before = len(caller.result.received)
        await asyncio.to_thread(stack.compose, "restart", "redis")
        await asyncio.sleep(1.0)  # media of the call in progress keeps flowing meanwhile
        during = len(caller.result.received)
        await ws.send(json.dumps({"type": "bye"}))
        await ws.close()
        await caller.close()
        return before, during

    before, during = asyncio.run(main())
    assert during > before + 48000  # more than half a second of PCM16 heard after the restart
    stack.compose("up", "-d", "--wait", "--wait-timeout", "120", timeout=180)
    out = stack.call()  # and a new call after it
    assert "echo delay (mouth to ear)" in out, out


def test_compose_down_ends_it_all_within_ten_seconds(stack: Stack) -> None:
    t0 = time.monotonic()
    stack.compose("down", "--remove-orphans", timeout=120)
    stack.figures["down_s"] = round(time.monotonic() - t0, 1)
    project = f"label=com.docker.compose.project={stack.env['COMPOSE_PROJECT_NAME']}"
    left = docker("ps", "-a", "-q", "--filter", project).stdout.split()
    assert left == []
    assert stack.figures["down_s"] < 10, stack.figures
