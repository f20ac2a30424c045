"""`firsthop signaling` as a real process against a real Redis and real transceivers.

The API contract (codes, headers, Location, PATCH trickle / ICE restart, DELETE), client
secrets (single use across two replicas, bound to their call), failover past a dead
transceiver, 503/429 with Retry-After, Redis down, and the WebSocket flows. No media flows
here (the ingress is a placeholder address): `test_signaling_e2e.py` places real calls.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, Required, TypedDict

import httpx
import pytest
import redis as redis_lib
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection, wrap_client_stream

from firsthop.services.signaling.config import SignalingConfig
from firsthop.services.signaling.main import serve_signaling
from firsthop.shared.metrics import parse_text
from tests.support import (
    RedisServer,
    SignalingProcess,
    TransceiverProcess,
    free_tcp_port,
    redis_server,
    start_all,
    wait_until,
)
from tests.unit.test_signaling_app import OFFER

KEY = SignalingProcess.API_KEY
INGRESS = "127.0.0.1:3478"  # advertised only: nothing sends media in this file
SDP = "application/sdp"
SDPFRAG = "application/trickle-ice-sdpfrag"


class ServerMessage(TypedDict, total=False):
    """A message signaling sends on its WebSocket (services/signaling/ws.py)."""

    type: Required[str]  # answer, state, bye or error
    sdp: str  # answer
    call_id: str  # answer
    state: str  # state: live, unreachable, ended
    reason: str  # bye
    code: int  # error: an HTTP status
    message: str  # error
    retry_after: int  # error, when waiting helps


@dataclass
class Stack:
    redis: RedisServer
    r: redis_lib.Redis
    tx: TransceiverProcess  # region a
    tx_z: TransceiverProcess  # region z: the one that gets killed
    sig: SignalingProcess
    replica: SignalingProcess  # a second replica on the same Redis
    misc: SignalingProcess  # Redis down, low rate limits, short WS auth deadline


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with redis_server() as redis:
        dead_redis = f"redis://127.0.0.1:{free_tcp_port()}/0"
        tx = TransceiverProcess("--redis", redis.url, "--region", "a", tx_id="tx-a")
        tx_z = TransceiverProcess("--redis", redis.url, "--region", "z", tx_id="tx-z")
        common = ["--redis", redis.url, "--ingress", f"a={INGRESS}", "--ingress", f"z={INGRESS}"]
        sig = SignalingProcess(*common, "--ip-rate", "0", "--agent-url", "echo=ws://127.0.0.1:9")
        replica = SignalingProcess(*common, "--ip-rate", "0")
        misc = SignalingProcess(
            *["--redis", dead_redis, "--transceiver", f"b={tx.api}", "--ingress", f"b={INGRESS}"],
            *["--ip-rate", "0.001", "--ip-burst", "6", "--ws-auth-timeout", "0.5"],
        )
        procs = [tx, tx_z, sig, replica, misc]
        start_all(*procs)
        r = redis_lib.Redis.from_url(redis.url, decode_responses=True)
        try:
            for s in (sig, replica):  # both registered, and seen by both replicas
                wait_until(partial(transceivers_seen, s, 2))
            yield Stack(redis, r, tx, tx_z, sig, replica, misc)
        finally:
            r.close()
            for p in procs:
                p.kill()


def transceivers_seen(sig: SignalingProcess, n: int) -> bool:
    """Whether `sig`'s health check counts `n` live transceivers."""
    return bool(httpx.get(f"{sig.url}/healthz").json()["transceivers"] == n)


def post_call(
    sig: SignalingProcess,
    offer: str | bytes | Iterator[bytes] = OFFER,
    *,
    token: str | None = KEY,
    ctype: str = SDP,
    query: str = "",
    **headers: str,
) -> httpx.Response:
    hdrs = {"Content-Type": ctype, **headers}
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    return httpx.post(f"{sig.url}/v1/calls{query}", content=offer, headers=hdrs, timeout=20)


def call_request(
    sig: SignalingProcess, method: str, location: str, body: str = "", token: str = KEY
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": SDPFRAG}
    return httpx.request(method, sig.url + location, content=body, headers=headers, timeout=10)


def mint_secret(sig: SignalingProcess) -> str:
    resp = httpx.post(f"{sig.url}/v1/client_secrets", headers={"Authorization": f"Bearer {KEY}"})
    assert resp.status_code == 201, resp.text
    return str(resp.json()["value"])


def metric(sig: SignalingProcess, name: str, **labels: str) -> float:
    text = httpx.get(f"{sig.url}/metrics").text
    return parse_text(text).get((name, frozenset(labels.items())), 0.0)


def test_call_lifecycle(stack: Stack) -> None:
    resp = post_call(stack.sig, query="?agent=echo")
    assert resp.status_code == 201, resp.text
    assert resp.headers["content-type"] == SDP
    location = resp.headers["location"]
    assert re.fullmatch(r"/v1/calls/[A-Za-z0-9_-]{22}", location)
    answer = resp.text
    assert answer.startswith("v=0") and "a=ice-lite" in answer
    assert f" {INGRESS.split(':')[1]} typ host" in answer  # the ingress, not the transceiver
    call = stack.r.hgetall("firsthop:call:" + location.rsplit("/", 1)[1])
    assert call["transceiver_id"] == "tx-a" and call["session_id"]
    assert 0 < stack.r.ttl("firsthop:call:" + location.rsplit("/", 1)[1]) <= 4 * 3600

    trickle = "a=mid:0\r\na=candidate:1 1 udp 2130706431 198.51.100.7 5000 typ host\r\n"
    assert call_request(stack.sig, "PATCH", location, trickle).status_code == 204
    restart = "a=ice-ufrag:newU\r\na=ice-pwd:" + "n" * 24 + "\r\n" + trickle
    resp = call_request(stack.sig, "PATCH", location, restart)
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"] == SDPFRAG
    new_ufrag = re.search(r"a=ice-ufrag:(\S+)", resp.text)
    assert new_ufrag and len(new_ufrag.group(1)) == 40  # a fresh route token
    assert re.search(r"a=ice-pwd:\S{22,}", resp.text)
    half = call_request(stack.sig, "PATCH", location, "a=ice-ufrag:only\r\n")
    assert half.status_code == 400 and "ice-pwd" in half.json()["error"]

    # any replica can change the call: the call map lives in Redis
    assert call_request(stack.replica, "PATCH", location, trickle).status_code == 204
    assert call_request(stack.replica, "DELETE", location).status_code == 204
    assert call_request(stack.sig, "DELETE", location).status_code == 404
    assert call_request(stack.sig, "PATCH", location, trickle).status_code == 404
    assert not stack.r.exists("firsthop:call:" + location.rsplit("/", 1)[1])


def test_bad_requests(stack: Stack) -> None:
    sig = stack.sig
    assert post_call(sig, ctype="text/plain").status_code == 415
    big = OFFER + "a=x-pad:" + "y" * 70_000 + "\r\n"
    assert post_call(sig, big).status_code == 413

    def chunked() -> Iterator[bytes]:  # no Content-Length: caught while reading
        for _ in range(20):
            yield b"a" * 8192

    resp = post_call(sig, chunked())
    assert resp.status_code == 413 and resp.json() == {"error": "body over 65536 bytes"}
    resp = post_call(sig, "v=0\r\nm=video 9 RTP/AVP 0\r\n")
    assert resp.status_code == 400 and "audio" in resp.json()["error"]
    resp = post_call(sig, OFFER.replace("opus/48000/2", "foo/8000"))
    assert resp.status_code == 400 and "no opus" in resp.json()["error"].lower()
    resp = post_call(sig, OFFER.replace("opus/48000/2", "opus/16000/2"))  # no common codec
    assert resp.status_code == 400 and "offer rejected" in resp.json()["error"]  # the tx's
    assert post_call(sig, token=None).status_code == 401
    assert post_call(sig, token="wrong").status_code == 401
    resp = post_call(sig, query="?agent=parrot")
    assert resp.status_code == 400 and "unknown agent" in resp.json()["error"]
    assert httpx.get(f"{sig.url}/v1/dev/secret").status_code == 404  # not --dev
    assert httpx.get(f"{sig.url}/nope").json() == {"error": "not found"}


def test_client_secret_is_single_use_across_replicas_and_bound_to_its_call(
    stack: Stack,
) -> None:
    secret = mint_secret(stack.sig)
    resp = post_call(stack.replica, token=secret)  # minted on one replica, used on another
    assert resp.status_code == 201, resp.text
    location = resp.headers["location"]
    again = post_call(stack.sig, token=secret)
    assert again.status_code == 403 and again.json() == {"error": "secret already used"}
    # a secret cannot mint secrets
    resp = httpx.post(
        f"{stack.sig.url}/v1/client_secrets", headers={"Authorization": f"Bearer {secret}"}
    )
    assert resp.status_code == 403
    # the secret may change its own call; the API key that minted it may not (other owner)
    assert call_request(stack.sig, "PATCH", location, "", token=secret).status_code == 204
    assert call_request(stack.sig, "DELETE", location, token=KEY).status_code == 403
    other_secret = mint_secret(stack.sig)
    other = post_call(stack.sig, token=other_secret).headers["location"]
    assert call_request(stack.sig, "DELETE", other, token=secret).status_code == 403
    assert call_request(stack.sig, "DELETE", location, token=secret).status_code == 204
    assert call_request(stack.sig, "DELETE", other, token=KEY).status_code == 403
    assert call_request(stack.sig, "DELETE", other, token=other_secret).status_code == 204
    forged = secret[:-4] + ("AAAA" if not secret.endswith("AAAA") else "BBBB")
    assert post_call(stack.sig, token=forged).status_code == 401


def register_dead_transceiver(stack: Stack, tx_id: str, **fields: str) -> None:
    """A registry entry (region a, for 30 s) for a transceiver nobody listens for."""
    mapping: dict[Any, Any] = {
        "api_url": f"http://127.0.0.1:{free_tcp_port()}",
        "media_addr": "127.0.0.1:1",
    }
    mapping |= {"region": "a", "cluster": "1", "sessions": "0", "capacity": "1000"}
    mapping |= {"draining": "0", **fields}
    stack.r.hset(f"firsthop:transceiver:{tx_id}", mapping=mapping)
    stack.r.expire(f"firsthop:transceiver:{tx_id}", 30)
    stack.r.zadd("firsthop:transceivers", {tx_id: time.time() + 30})


def test_a_dead_transceiver_is_skipped_for_the_next(stack: Stack) -> None:
    # Load the real transceiver a little, so two dead entries with no load rank first.
    held = post_call(stack.sig).headers["location"]
    wait_until(lambda: int(stack.r.hget("firsthop:transceiver:tx-a", "sessions") or 0) >= 1)
    for tx_id, draining in (("dead", "0"), ("dead-draining", "1")):
        register_dead_transceiver(stack, tx_id, draining=draining)
    wait_until(partial(transceivers_seen, stack.sig, 4))
    before = metric(stack.sig, "firsthop_signaling_events_total", event="transceiver_failures")
    try:
        resp = post_call(stack.sig)
        assert resp.status_code == 201, resp.text
        call_id = resp.headers["location"].rsplit("/", 1)[1]
        assert stack.r.hget(f"firsthop:call:{call_id}", "transceiver_id") == "tx-a"
        after = metric(stack.sig, "firsthop_signaling_events_total", event="transceiver_failures")
        assert after == before + 1  # the dead one was tried once; the draining one never
    finally:
        stack.r.delete("firsthop:transceiver:dead", "firsthop:transceiver:dead-draining")
    for location in (held, resp.headers["location"]):
        assert call_request(stack.sig, "DELETE", location).status_code == 204


def test_a_call_to_record_goes_only_to_a_transceiver_that_records(stack: Stack) -> None:
    assert stack.r.hget("firsthop:transceiver:tx-a", "records") == "0"  # no --record-dir
    wait_until(partial(transceivers_seen, stack.sig, 2))  # (no other test's entries left)
    refused = post_call(stack.sig, query="?record=true")
    assert refused.status_code == 400 and "recording is off here" in refused.text
    assert metric(stack.sig, "firsthop_signaling_placement_failures_total", reason="no_recorder")
    # A transceiver that records (here a dead one): it alone is asked.
    register_dead_transceiver(stack, "rec", records="1")
    try:
        wait_until(partial(transceivers_seen, stack.sig, 3))
        resp = post_call(stack.sig, query="?record=true")
        # The recorder failed and nothing else was asked (tx-a would have answered 400,
        # "recording is off on this transceiver").
        assert resp.status_code == 503 and "could take" in resp.text, resp.text
        plain = post_call(stack.sig)  # a call that does not ask goes anywhere
        assert plain.status_code == 201, plain.text
        assert call_request(stack.sig, "DELETE", plain.headers["location"]).status_code == 204
    finally:
        stack.r.delete("firsthop:transceiver:rec")


def test_redis_down_no_capacity_and_rate_limits(stack: Stack) -> None:
    misc = stack.misc  # its Redis is unreachable; its static list has one region-b entry
    resp = post_call(misc)  # own region "a" has no transceiver at all
    assert resp.status_code == 503 and int(resp.headers["retry-after"]) >= 1
    assert resp.json() == {"error": "no transceiver available"}
    resp = post_call(misc, **{"X-Client-Region": "b"})  # steered to b: works, Redis or not
    assert resp.status_code == 201, resp.text
    assert call_request(misc, "DELETE", resp.headers["location"]).status_code == 204
    assert metric(misc, "firsthop_signaling_events_total", event="redis_errors") > 0
    # per-IP burst of 6: 2 spent above; from another source address the bucket is fresh
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.9")) as other:
        statuses = []
        for _ in range(7):
            r = other.post(
                f"{misc.url}/v1/calls",
                content=OFFER,
                headers={"Content-Type": SDP, "Authorization": "Bearer nope"},
            )
            statuses.append(r.status_code)
        assert statuses == [401] * 6 + [429]
        assert int(r.headers["retry-after"]) >= 1
    assert metric(misc, "firsthop_signaling_rate_limited_total", scope="ip") == 1


# -- WebSocket ------------------------------------------------------------------------------


@asynccontextmanager
async def open_ws(
    sig: SignalingProcess, *headers: tuple[str, str]
) -> AsyncIterator[WebSocketConnection]:
    """A WebSocket client whose TCP stream the test owns: trio-websocket leaves a client's
    stream open when the server closes first (a ResourceWarning, an error here)."""
    async with trio.open_nursery() as nursery:
        stream = await trio.open_tcp_stream("127.0.0.1", sig.port)
        try:
            ws = await wrap_client_stream(
                nursery,
                stream,
                f"127.0.0.1:{sig.port}",
                "/v1/ws",
                extra_headers=[(k.encode(), v.encode()) for k, v in headers],
            )
            try:
                yield ws
            finally:
                await ws.aclose()
        finally:
            await stream.aclose()


async def recv(ws: WebSocketConnection, within: float = 10) -> ServerMessage:
    with trio.fail_after(within):
        message: ServerMessage = json.loads(await ws.get_message())
    assert isinstance(message, dict) and isinstance(message.get("type"), str), message
    return message


async def closed_code(ws: WebSocketConnection, within: float = 10) -> int | None:
    with trio.fail_after(within):
        try:
            while True:
                await ws.get_message()
        except ConnectionClosed as exc:
            return None if exc.reason is None else exc.reason.code


async def test_ws_offer_answer_candidate_bye(stack: Stack) -> None:
    async with open_ws(stack.sig) as ws:
        await ws.send_message("{not json")
        assert (await recv(ws))["code"] == 400  # and the socket stays open
        await ws.send_message(json.dumps({"type": "auth", "token": KEY}))
        await ws.send_message(json.dumps({"type": "offer", "sdp": OFFER, "agent": "echo"}))
        answer = await recv(ws)
        assert answer["type"] == "answer" and answer["sdp"].startswith("v=0")
        call_id = answer["call_id"]
        assert stack.r.hget(f"firsthop:call:{call_id}", "transceiver_id") == "tx-a"
        assert await recv(ws) == {"type": "state", "state": "live"}
        candidate = "candidate:1 1 udp 2130706431 198.51.100.7 5000 typ host"
        await ws.send_message(json.dumps({"type": "candidate", "candidate": candidate}))
        await ws.send_message(json.dumps({"type": "offer", "sdp": OFFER}))
        assert (await recv(ws))["code"] == 409  # one call per socket; the candidate was fine
        await ws.send_message(json.dumps({"type": "bye"}))
        assert await recv(ws) == {"type": "bye", "reason": "client_bye"}
        assert await closed_code(ws) == 1000
    assert call_request(stack.sig, "DELETE", f"/v1/calls/{call_id}").status_code == 404


async def test_ws_bearer_header_and_server_side_end(stack: Stack) -> None:
    async with open_ws(stack.sig, ("Authorization", f"Bearer {KEY}")) as ws:
        await ws.send_message(json.dumps({"type": "offer", "sdp": OFFER}))
        answer = await recv(ws)
        assert answer["type"] == "answer"
        assert await recv(ws) == {"type": "state", "state": "live"}
        # ended elsewhere (REST DELETE): the watcher notices the session is gone, and the
        # transceiver remembers why (here "deleted"; a drain says "drain", ...)
        resp = call_request(stack.sig, "DELETE", f"/v1/calls/{answer['call_id']}")
        assert resp.status_code == 204
        assert await recv(ws) == {"type": "state", "state": "ended"}
        assert await recv(ws) == {"type": "bye", "reason": "deleted"}
        assert await closed_code(ws) == 1000


async def test_ws_transceiver_lost(stack: Stack) -> None:
    headers = [("Authorization", f"Bearer {KEY}"), ("X-Client-Region", "z")]
    async with open_ws(stack.sig, *headers) as ws:
        await ws.send_message(json.dumps({"type": "offer", "sdp": OFFER}))
        call_id = (await recv(ws))["call_id"]
        assert stack.r.hget(f"firsthop:call:{call_id}", "transceiver_id") == "tx-z"
        assert await recv(ws) == {"type": "state", "state": "live"}
        stack.tx_z.kill()  # SIGKILL: no goodbye, no registry clean-up
        assert await recv(ws) == {"type": "state", "state": "unreachable"}
        stack.r.delete("firsthop:transceiver:tx-z")  # its heartbeat key expires (5 s TTL)
        assert await recv(ws) == {"type": "state", "state": "ended"}
        assert await recv(ws) == {"type": "bye", "reason": "transceiver_lost"}
        assert await closed_code(ws) == 1000
    assert not stack.r.exists(f"firsthop:call:{call_id}")


async def test_ws_auth_failures_and_deadline(stack: Stack) -> None:
    async with open_ws(stack.sig) as ws:
        await ws.send_message(json.dumps({"type": "offer", "sdp": OFFER}))
        assert (await recv(ws))["code"] == 401  # the first message must be auth
        assert await closed_code(ws) == 1008
    async with open_ws(stack.sig) as ws:
        await ws.send_message(json.dumps({"type": "auth", "token": "wrong"}))
        assert await recv(ws) == {"type": "error", "code": 401, "message": "unknown API key"}
        assert await closed_code(ws) == 1008
    async with open_ws(stack.misc) as ws:  # 0.5 s auth deadline
        error = await recv(ws, within=3)
        assert error["code"] == 401 and "deadline" in error["message"]
        assert await closed_code(ws) == 1008


async def test_ws_hostile_messages_get_errors_not_crashes(stack: Stack) -> None:
    async with open_ws(stack.sig) as ws:
        await ws.send_message('{"type": "auth", "token": "\\udc80"}')  # a lone surrogate
        assert (await recv(ws))["code"] == 401
        assert await closed_code(ws) == 1008
    async with open_ws(stack.sig, ("Authorization", f"Bearer {KEY}")) as ws:
        for hostile in ("[" * 30_000, "[]", '{"type": 7}', '{"type": "nope"}', "\u0000"):
            await ws.send_message(hostile)
            assert (await recv(ws))["code"] == 400
        await ws.send_message(json.dumps({"type": "candidate", "candidate": "x"}))
        assert (await recv(ws))["code"] == 409  # no call yet
        await ws.send_message(json.dumps({"type": "offer", "sdp": "v=0\r\n"}))
        assert (await recv(ws))["code"] == 400
        await ws.send_message("{")  # the 8th bad message: enough
        assert (await recv(ws))["code"] == 400
        assert await closed_code(ws) == 1008
    async with open_ws(stack.sig, ("Authorization", f"Bearer {KEY}")) as ws:
        await ws.send_message(json.dumps({"type": "offer", "sdp": OFFER}))
        assert (await recv(ws))["type"] == "answer"
        assert (await recv(ws))["type"] == "state"
        await ws.send_message('{"type": "candidate", "candidate": "candidate:\\udc80"}')
        assert (await recv(ws))["code"] == 400
        await ws.send_message(json.dumps({"type": "candidate", "candidate": "a\r\nb"}))
        assert (await recv(ws))["code"] == 400
        await ws.send_message(json.dumps({"type": "bye"}))
        assert (await recv(ws))["type"] == "bye"


async def test_ws_oversized_message_closes(stack: Stack) -> None:
    async with open_ws(stack.sig) as ws:
        await ws.send_message(json.dumps({"type": "auth", "token": KEY}))
        await ws.send_message(json.dumps({"type": "offer", "sdp": "x" * 70_000}))
        assert await closed_code(ws) == 1009


async def test_serve_signaling_in_process_reports_its_address() -> None:
    config = SignalingConfig(listen=("127.0.0.1", 0), region="a", api_keys=["k"])
    async with trio.open_nursery() as nursery:
        host, port = await nursery.start(serve_signaling, config)
        assert host == "127.0.0.1" and port > 0
        async with httpx.AsyncClient() as http:
            resp = await http.get(f"http://{host}:{port}/healthz")
            assert resp.json() == {"ok": True, "region": "a", "transceivers": 0}
            resp = await http.post(
                f"http://{host}:{port}/v1/calls",
                content=OFFER,
                headers={"Content-Type": SDP, "Authorization": "Bearer k"},
            )
            assert resp.status_code == 503 and resp.headers["retry-after"] == "2"
        nursery.cancel_scope.cancel()
