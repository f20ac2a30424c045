"""Trickle floods stop at signaling (docs/security.md): a real signaling, a real transceiver.

The transceiver is ICE-lite and ignores trickled candidates, counting them
(``firsthop_transceiver_events_total{event="trickle_candidates_ignored"}``): that count is
how this file sees whether any reached it. Before the fix a flood of 1000 WebSocket candidates
or PATCHes put all 1000 through its internal API. Bounds on what is let through are computed
from the time the flood took, so a slow machine only makes them looser.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter

import httpx
import trio
from trio_websocket import ConnectionClosed

from firsthop.services.signaling.trickle import MAX_CANDIDATES, MESSAGES, RESTARTS
from firsthop.shared.metrics import parse_text
from tests.integration.test_signaling import ServerMessage, open_ws, recv
from tests.support import SignalingProcess, TransceiverProcess
from tests.unit.test_signaling_app import OFFER

KEY = SignalingProcess.API_KEY
SDPFRAG = "application/trickle-ice-sdpfrag"
FLOOD = 1000
DEADLINE = 60


def ignored(tx: TransceiverProcess) -> float:
    """How many trickled candidates the transceiver has received (and ignored)."""
    status, body = tx.request("GET", "/metrics")
    assert status == 200
    key = (
        "firsthop_transceiver_events_total",
        frozenset({("event", "trickle_candidates_ignored")}),
    )
    return parse_text(body.decode()).get(key, 0.0)


def candidate(i: int) -> str:
    return f"candidate:{i} 1 udp 2130706431 198.51.100.7 {1024 + i} typ host"


def frag(*lines: str) -> str:
    return "".join(f"{line}\r\n" for line in lines)


async def new_call(http: httpx.AsyncClient, sig: SignalingProcess) -> str:
    resp = await http.post(
        f"{sig.url}/v1/calls",
        content=OFFER,
        headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {KEY}"},
    )
    assert resp.status_code == 201, resp.text
    return f"{sig.url}{resp.headers['location']}"


async def patch(http: httpx.AsyncClient, call: str, body: str) -> httpx.Response:
    headers = {"Content-Type": SDPFRAG, "Authorization": f"Bearer {KEY}"}
    return await http.patch(call, content=body, headers=headers)


async def test_a_websocket_candidate_flood_never_reaches_the_transceiver(
    signaling_stack: tuple[SignalingProcess, TransceiverProcess],
) -> None:
    sig, tx = signaling_stack
    before = ignored(tx)
    errors: list[ServerMessage] = []
    with trio.fail_after(DEADLINE):
        async with open_ws(sig, ("Authorization", f"Bearer {KEY}")) as ws:
            await ws.send_message(json.dumps({"type": "offer", "sdp": OFFER}))
            assert (await recv(ws))["type"] == "answer"
            assert await recv(ws) == {"type": "state", "state": "live"}
            try:
                for i in range(FLOOD):
                    message = {"type": "candidate", "candidate": candidate(i), "sdpMid": "0"}
                    await ws.send_message(json.dumps(message))
            except ConnectionClosed:
                pass  # the server had enough of it
            try:
                while True:
                    errors.append(await recv(ws))
            except ConnectionClosed as closed:
                assert closed.reason is not None and closed.reason.code == 1008
    assert errors and all(e["type"] == "error" and e["code"] == 429 for e in errors)
    assert errors[0]["retry_after"] >= 1 and "trickle messages" in errors[0]["message"]
    assert ignored(tx) == before  # nothing was forwarded


async def test_patch_floods_are_limited_per_call_and_candidates_capped(
    signaling_stack: tuple[SignalingProcess, TransceiverProcess],
) -> None:
    sig, tx = signaling_stack
    before = ignored(tx)
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(timeout=10) as http:
            call = await new_call(http, sig)
            statuses: Counter[int] = Counter()
            retry_after: set[str] = set()
            started = time.monotonic()

            async def flood(worker: int) -> None:
                for i in range(worker, FLOOD, 4):
                    resp = await patch(http, call, frag("a=mid:0", f"a={candidate(i)}"))
                    statuses[resp.status_code] += 1
                    if resp.status_code == 429:
                        retry_after.add(resp.headers["retry-after"])

            async with trio.open_nursery() as nursery:
                for worker in range(4):
                    nursery.start_soon(flood, worker)
            elapsed = time.monotonic() - started
            assert set(statuses) == {204, 429}, statuses
            allowed = MESSAGES.burst + MESSAGES.rate * elapsed + 1
            assert MESSAGES.burst <= statuses[204] <= allowed, (statuses, elapsed)
            assert retry_after and all(int(v) >= 1 for v in retry_after)

            # the candidate cap, on a fresh call: 100 in all, however they are packed
            call = await new_call(http, sig)
            many = [f"a={candidate(i)}" for i in range(MAX_CANDIDATES)]
            assert (await patch(http, call, frag(*many[:60]))).status_code == 204
            over = await patch(http, call, frag(*many[:41]))
            assert over.status_code == 429
            assert f"at most {MAX_CANDIDATES} candidates" in over.json()["error"]
            assert int(over.headers["retry-after"]) > 60  # the budget refills over hours
            assert (await patch(http, call, frag(*many[60:]))).status_code == 204  # 100th
            assert (await patch(http, call, frag(many[0]))).status_code == 429
            assert (await patch(http, call, frag("a=end-of-candidates"))).status_code == 204
            bad = await patch(http, call, frag("a=candidate:nonsense"))
            assert bad.status_code == 400 and "malformed candidate" in bad.json()["error"]
    assert ignored(tx) == before  # nothing was forwarded


async def test_ice_restarts_are_forwarded_and_rate_limited(
    signaling_stack: tuple[SignalingProcess, TransceiverProcess],
) -> None:
    sig, tx = signaling_stack
    before = ignored(tx)
    with trio.fail_after(DEADLINE):
        async with httpx.AsyncClient(timeout=10) as http:
            call = await new_call(http, sig)
            # the offer's own credentials (WHIP clients send them with each trickle): trickle
            same = frag(
                "a=ice-ufrag:abcd", "a=ice-pwd:abcdefghijklmnopqrstuvwx", f"a={candidate(1)}"
            )
            assert (await patch(http, call, same)).status_code == 204
            statuses = []
            started = time.monotonic()
            for i in range(2 * int(RESTARTS.burst) + 2):
                restart = frag(
                    f"a=ice-ufrag:new{i:04d}", "a=ice-pwd:" + "n" * 24, f"a={candidate(i)}"
                )
                resp = await patch(http, call, restart)
                statuses.append(resp.status_code)
                if resp.status_code == 200:
                    assert resp.headers["content-type"] == SDPFRAG
                    assert re.search(r"a=ice-ufrag:\S{40}\r\na=ice-pwd:\S{22,}", resp.text)
                    # the restarted credentials are now the call's: repeating them is trickle
                    again = frag(f"a=ice-ufrag:new{i:04d}", "a=ice-pwd:" + "n" * 24)
                    assert (await patch(http, call, again)).status_code == 204
            elapsed = time.monotonic() - started
            assert statuses[0] == 200 and set(statuses) == {200, 429}, statuses
            assert statuses.count(200) <= RESTARTS.burst + RESTARTS.rate * elapsed + 1
            half = await patch(http, call, frag("a=ice-ufrag:only"))
            assert half.status_code == 400 and "ice-pwd" in half.json()["error"]
            assert (
                await http.delete(call, headers={"Authorization": f"Bearer {KEY}"})
            ).status_code == 204
    assert ignored(tx) == before  # restarts go without their candidates
