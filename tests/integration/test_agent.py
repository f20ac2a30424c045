"""The reference agents over their WebSocket protocol (§8), in process, on loopback."""

from __future__ import annotations

import json

import httpx
import trio
from trio_websocket import open_websocket_url

from firsthop.services.agent.server import serve_agent


async def test_echo_returns_frames_and_answers_events_and_counts_them() -> None:
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(serve_agent, "echo", ("127.0.0.1", 0), ("127.0.0.1", 0))
        with trio.fail_after(10):
            async with open_websocket_url(f"ws://{host}:{port}") as ws:
                await ws.send_message(json.dumps({"type": "session.start", "session_id": "s1"}))
                for i in range(5):
                    frame = bytes([i]) * 1920
                    await ws.send_message(frame)
                    assert await ws.get_message() == frame
                event = {"type": "client.event", "data": {"hello": 1}}
                await ws.send_message(json.dumps(event))
                reply = json.loads(await ws.get_message())
                assert reply == {
                    "type": "agent.event",
                    "data": {"type": "echo", "event": {"hello": 1}},
                }
                await ws.send_message(json.dumps({"type": "session.end"}))
        nursery.cancel_scope.cancel()


def test_metrics_endpoint_over_a_real_process() -> None:
    import subprocess
    import sys

    from tests.support import free_tcp_port, wait_until

    port, metrics = free_tcp_port(), free_tcp_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "firsthop.services.cli",
            "agent",
            "--kind",
            "echo",
            "--listen",
            f"127.0.0.1:{port}",
            "--metrics",
            f"127.0.0.1:{metrics}",
        ],
    )
    url = f"http://127.0.0.1:{metrics}/metrics"

    def answers() -> bool:
        try:
            httpx.get(url, timeout=1)
        except httpx.HTTPError:
            return False
        return True

    try:
        wait_until(answers, 15)
        resp = httpx.get(url, timeout=1)
        assert resp.status_code == 200
        assert 'firsthop_agent_sessions{kind="echo"} 0' in resp.text
        assert httpx.get(f"http://127.0.0.1:{metrics}/healthz").json()["ok"] is True
    finally:
        proc.terminate()
        proc.wait(10)


async def test_a_message_the_agent_cannot_use_ends_that_session_not_the_server() -> None:
    """JSON that is not an object (here a number, to the echo agent and to the parrot) is
    skipped like text that is not JSON; and whatever one connection's handler raises ends that
    connection alone: the server goes on serving the next."""
    for kind in ("echo", "parrot"):
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve_agent, kind, ("127.0.0.1", 0))
            with trio.fail_after(10):
                for _ in range(2):
                    async with open_websocket_url(f"ws://{host}:{port}") as ws:
                        await ws.send_message(json.dumps({"type": "session.start"}))
                        await ws.send_message("5")
                        await ws.send_message("[]")
                        await ws.ping(b"still there")
            nursery.cancel_scope.cancel()
