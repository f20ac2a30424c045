"""Transceiver lifecycle through a real relay: ICE restart mid-call, drain on SIGTERM,
parrot turn-taking and barge-in with a real parrot agent."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import time
from typing import Any

import aioice
import pytest
import trio
from aioice import stun as aioice_stun

from firsthop.services.call.caller import Caller, ToneTrack, dominant, tone_power
from tests.integration.test_transceiver import (
    CallerEvent,
    caller_events,
    heard,
    hears,
    ingress,
    signal_via,
)
from tests.support import (
    AgentProcess,
    RelayProcess,
    SignalingProcess,
    TransceiverProcess,
    eventually,
    start_all,
    wait_until,
)


def _ice_connection(caller: Caller) -> Any:
    pc: Any = caller.pc
    (transport,) = pc._RTCPeerConnection__iceTransports
    return transport._connection


def test_ice_restart_mid_call_through_the_relay() -> None:
    relay = RelayProcess().start()
    agent = AgentProcess("echo").start()
    tx = TransceiverProcess(agent_url=agent.url).start()
    try:

        async def main() -> None:
            c = Caller(ToneTrack(600))
            call: dict[str, str] = {}

            async def signal(offer: str) -> str:
                status, body = await asyncio.to_thread(tx.create_session, offer, ingress(relay))
                assert status == 201
                call["session"] = body["session_id"]
                return str(body["answer_sdp"])

            await c.start(signal)
            await asyncio.wait_for(c.wait_connected(), 10)
            conn = _ice_connection(c)
            old_server_ufrag = conn.remote_username
            new_ufrag = "rst" + base64.b64encode(os.urandom(6)).decode()
            new_pwd = base64.b64encode(os.urandom(18)).decode()
            frag = f"a=ice-ufrag:{new_ufrag}\r\na=ice-pwd:{new_pwd}\r\n".encode()
            status, body = await asyncio.to_thread(
                tx.request,
                "PATCH",
                f"/internal/v1/sessions/{call['session']}",
                frag,
                "application/trickle-ice-sdpfrag",
            )
            assert status == 200, body
            lines = dict(line.split(":", 1) for line in body.decode().split())
            server_ufrag, server_pwd = lines["a=ice-ufrag"], lines["a=ice-pwd"]
            assert server_ufrag != old_server_ufrag and len(server_ufrag) == 40
            # The caller switches to the new credentials (what a browser does on restart).
            conn._local_username, conn._local_password = new_ufrag, new_pwd
            conn.remote_username, conn.remote_password = server_ufrag, server_pwd
            pair = conn._nominated[1]
            request = conn.build_request(pair, nominate=True)
            response, _ = await pair.protocol.request(
                request, pair.remote_addr, integrity_key=server_pwd.encode()
            )
            assert response.message_class == aioice_stun.Class.RESPONSE
            # The old credentials no longer authenticate.
            conn.remote_username = old_server_ufrag
            stale = conn.build_request(pair, nominate=False)
            try:
                await pair.protocol.request(
                    stale, pair.remote_addr, integrity_key=server_pwd.encode(), retransmissions=1
                )
                raise AssertionError("stale credentials accepted")
            except aioice_stun.TransactionError:
                pass
            conn.remote_username = server_ufrag
            restarted = len(c.result.received)
            await eventually(lambda: hears(c, 600, since=restarted))  # media carries on
            assert dominant(heard(c, since=restarted), [400, 600, 800]) == 600
            await c.close()

        asyncio.run(main())
        # the relay learned the new token for the same flow without re-pointing
        assert relay.metric("firsthop_relay_flows") >= 1
    finally:
        tx.kill()
        agent.kill()
        relay.kill()


def test_sigterm_drains_then_ends_calls_with_a_reason() -> None:
    relay = RelayProcess().start()
    agent = AgentProcess("echo").start()
    tx = TransceiverProcess(agent_url=agent.url).start()  # --drain-seconds 3
    try:

        async def main() -> float:
            c = Caller(ToneTrack(440), data_channel=True)
            await c.start(signal_via(tx, ingress(relay)))
            await asyncio.wait_for(c.wait_connected(), 10)
            await eventually(lambda: hears(c, 440))  # a call in progress, its echo flowing
            assert tx.proc is not None
            t0 = time.monotonic()
            tx.proc.terminate()

            def draining() -> bool:
                status, body = tx.request("GET", "/healthz")
                return status == 200 and b'"draining": true' in body

            await asyncio.to_thread(wait_until, draining)
            # new calls are refused while draining
            status, _ = await asyncio.to_thread(tx.create_session, "v=0\r\n", ingress(relay))
            assert status == 503
            # the call in progress keeps working during the grace period
            before = len(c.result.received)
            await eventually(lambda: len(c.result.received) > before)
            await asyncio.to_thread(tx.proc.wait, 15)
            elapsed = time.monotonic() - t0
            await c.close()
            return elapsed

        elapsed = asyncio.run(main())
        assert 3.0 <= elapsed < 10.0
        assert tx.proc is not None and tx.proc.returncode == 0
    finally:
        tx.kill()
        agent.kill()
        relay.kill()


def _speech(seconds: float, freq: float = 300.0) -> bytes:
    import array
    import math

    n = int(48000 * seconds)
    return array.array(
        "h", (int(12000 * math.sin(2 * math.pi * freq * i / 48000)) for i in range(n))
    ).tobytes()


def test_parrot_repeats_after_a_pause_and_stops_on_barge_in() -> None:
    relay = RelayProcess().start()
    agent = AgentProcess("parrot").start()
    tx = TransceiverProcess(agent_url=agent.url).start()
    try:
        # 2.5 s of "speech" at 300 Hz, 1 s of silence (the parrot starts saying it back
        # 600 ms in), then we talk over it at 500 Hz: it must stop at once.
        script = _speech(2.5) + bytes(48000 * 2) + _speech(1.5, 500) + bytes(48000 * 2 * 4)

        def window(pcm: bytes, start: float, end: float) -> bytes:
            return pcm[int(48000 * start) * 2 : int(48000 * end) * 2]

        def told_all(c: Caller) -> bool:
            kinds = {e["type"] for e in caller_events(c)}
            return {
                "speech_started",
                "speech_stopped",
                "response_started",
                "response_done",
            } <= kinds

        async def main() -> tuple[bytes, list[CallerEvent]]:
            c = Caller(ToneTrack(pcm=script), data_channel=True)
            await c.start(signal_via(tx, ingress(relay)))
            await asyncio.wait_for(c.wait_connected(), 10)
            # the whole exchange: the agent has said all it will, and 5 s of audio (the
            # windows below) came back
            await eventually(lambda: told_all(c) and len(c.result.received) >= 48000 * 2 * 5, 15)
            await c.close()
            return bytes(c.result.received), caller_events(c)

        pcm, events = asyncio.run(main())
        kinds = [e.get("type") for e in events]
        for expected in ("speech_started", "speech_stopped", "response_started", "response_done"):
            assert expected in kinds, kinds
        done = [e for e in events if e.get("type") == "response_done"]
        assert done[0]["interrupted"] is True  # barge-in cut the first reply short
        assert tone_power(window(pcm, 0.0, 2.4), 300) < 0.0005  # silent while we spoke
        assert tone_power(window(pcm, 3.2, 3.5), 300) > 0.001  # then it said it back
        assert tone_power(window(pcm, 4.1, 5.0), 300) < 0.0005  # and stopped when we talked
    finally:
        tx.kill()
        agent.kill()
        relay.kill()


def test_hook_points_of_the_pinned_aiortc_and_aioice() -> None:
    from firsthop.services.transceiver.rtc import hook_points

    async def main() -> dict[str, bool]:
        return hook_points()

    points = asyncio.run(main())
    assert all(points.values()), {k: v for k, v in points.items() if not v}
    assert aioice.__version__.startswith("0.13")
    import aiortc

    assert aiortc.__version__.startswith("1.16")


def test_sigterm_after_an_api_drain_still_lets_calls_finish() -> None:
    """Kubernetes' preStop hook drains through the API, then the kubelet sends SIGTERM: the
    calls in progress must still get their grace period."""
    relay = RelayProcess().start()
    agent = AgentProcess("echo").start()
    tx = TransceiverProcess(agent_url=agent.url).start()  # --drain-seconds 3
    try:

        async def main() -> float:
            c = Caller(ToneTrack(440))
            await c.start(signal_via(tx, ingress(relay)))
            await asyncio.wait_for(c.wait_connected(), 10)
            status, _ = await asyncio.to_thread(tx.request, "POST", "/internal/v1/drain")
            assert status == 200
            assert tx.proc is not None
            t0 = time.monotonic()
            tx.proc.terminate()
            before = len(c.result.received)
            await eventually(lambda: len(c.result.received) > before)  # still talking
            await asyncio.to_thread(tx.proc.wait, 15)
            await c.close()
            return time.monotonic() - t0

        elapsed = asyncio.run(main())
        assert 1.5 <= elapsed < 10.0
    finally:
        tx.kill()
        agent.kill()
        relay.kill()


async def test_a_drained_call_hears_drain_not_transceiver_lost() -> None:
    """SIGTERM drains: the transceiver ends its calls with reason `drain`, then stays up
    until signaling has read that reason (not `transceiver_lost` because it was gone before
    the call watcher's next probe)."""
    from tests.integration.test_signaling import KEY, closed_code, open_ws, recv
    from tests.unit.test_signaling_app import OFFER

    tx = TransceiverProcess("--drain-seconds", "0.5")
    sig = SignalingProcess("--transceiver", tx.api, "--ingress", "127.0.0.1:3478")
    start_all(tx, sig)
    try:
        async with open_ws(sig, ("Authorization", f"Bearer {KEY}")) as ws:
            await ws.send_message(json.dumps({"type": "offer", "sdp": OFFER}))
            assert (await recv(ws))["type"] == "answer"
            assert await recv(ws) == {"type": "state", "state": "live"}
            assert tx.proc is not None
            tx.proc.terminate()
            assert await recv(ws) == {"type": "state", "state": "ended"}
            assert await recv(ws) == {"type": "bye", "reason": "drain"}
            assert await closed_code(ws) == 1000
        with trio.fail_after(10):
            await trio.to_thread.run_sync(tx.proc.wait)
        assert tx.proc.returncode == 0
    finally:
        tx.kill()
        sig.kill()


def test_after_a_drain_it_waits_for_the_drained_reasons_whatever_was_read_before() -> None:
    """An earlier call's end reason, read before the drain, once let the process exit at
    once after it (the wait's event was set for good): a drained call's reason, never read,
    and its caller heard `transceiver_lost`. Now it waits (up to END_REASON_GRACE, 5 s) for
    the drained one, and exits as soon as it is read."""
    import subprocess

    from tests.unit.test_signaling_app import OFFER

    tx = TransceiverProcess("--drain-seconds", "0.5").start()
    sdpfrag = "application/trickle-ice-sdpfrag"
    try:
        assert tx.proc is not None
        status, earlier = tx.create_session(OFFER, ["127.0.0.1:3478"])
        assert status == 201, earlier
        path = f"/internal/v1/sessions/{earlier['session_id']}"
        assert tx.request("DELETE", path)[0] == 204
        status, body = tx.request("PATCH", path, b"", sdpfrag)  # its reason, read
        assert status == 404 and b'"deleted"' in body, body
        status, drained = tx.create_session(OFFER, ["127.0.0.1:3478"])
        assert status == 201, drained
        tx.proc.terminate()
        # drained at 0.5 s; without a read of its reason, still up well after (it was gone
        # 0.5 s after the drain before)
        with pytest.raises(subprocess.TimeoutExpired):
            tx.proc.wait(2.5)
        path = f"/internal/v1/sessions/{drained['session_id']}"
        status, body = tx.request("PATCH", path, b"", sdpfrag)
        assert status == 404 and b'"drain"' in body, body
        assert tx.proc.wait(5) == 0  # and gone once it was read
    finally:
        tx.kill()
