"""OpenAI's Realtime WebRTC API on signaling, driven by the official `openai` SDK.

The stack: a real relay, echo agent, transceiver and signaling (``--default-agent echo``);
aiortc callers whose media goes through the relay. The SDK (`openai.OpenAI` pointed at
signaling's ``/v1``) mints ephemeral keys, places calls with ``calls.create`` (multipart) and
ends them with ``calls.hangup``; a browser-style raw SDP POST uses the ephemeral key. The
sideband (``realtime.connect(call_id=...)``) is tested against a stand-in transceiver served
by the test itself (its events endpoint lands from another branch), which also shows the
``session`` the create body carries.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, cast

import httpx
import openai
import pytest
import redis as redis_lib
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from quart import Response, request, websocket
from quart_trio import QuartTrio
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection
from websockets.sync.client import connect as ws_connect

from firsthop.services.call.caller import Caller, ToneTrack
from firsthop.services.signaling.realtime_api import MAX_SIDEBANDS_PER_KEY
from tests.integration.test_transceiver import hears
from tests.support import (
    INTERNAL_TOKEN,
    AgentProcess,
    MediaStack,
    SignalingProcess,
    TransceiverProcess,
    eventually,
    free_tcp_port,
    redis_server,
    start_all,
    wait_until,
)
from tests.unit.test_signaling_app import OFFER

KEY = SignalingProcess.API_KEY
MAX_STANDIN_SIDEBANDS = 1  # sidebands the stand-in takes per session
OTHER_KEY = "other-api-key"
ORIGIN = "https://app.example"


Stack = MediaStack


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    agent = AgentProcess("echo")
    extra = ("--cors-origin", ORIGIN)
    with MediaStack.running(agent, "echo", agent.url, *extra, api_keys=f"{KEY},{OTHER_KEY}") as s:
        yield s


CLIENTS: list[openai.OpenAI] = []


def sdk(sig: SignalingProcess, key: str = KEY) -> openai.OpenAI:
    """An SDK client on signaling (closed after the test)."""
    client = openai.OpenAI(base_url=f"{sig.url}/v1", api_key=key, max_retries=0, timeout=20)
    CLIENTS.append(client)
    return client


@pytest.fixture(autouse=True)
def close_clients() -> Iterator[None]:
    yield
    while CLIENTS:
        CLIENTS.pop().close()


def call_id_of(location: str) -> str:
    assert location.startswith("/v1/realtime/calls/")
    return location.rsplit("/", 1)[1]


def openai_error(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"}
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_sdk_mints_an_ek_places_a_multipart_call_and_hangs_up(stack: Stack) -> None:
    client = sdk(stack.sig)
    secret = client.realtime.client_secrets.create(
        expires_after={"anchor": "created_at", "seconds": 60},
        session={"type": "realtime", "model": "gpt-realtime", "instructions": "Be brief."},
    )
    assert secret.value.startswith("ek_")
    session = secret.session
    assert session.type == "realtime" and session.id.startswith("sess_")
    assert session.model == "gpt-realtime" and session.instructions == "Be brief."
    assert session.audio is not None and session.audio.input is not None

    async def main() -> tuple[Caller, str]:
        caller = Caller(ToneTrack(550.0), data_channel=True)
        call_id = ""

        async def signal(offer: str) -> str:
            nonlocal call_id
            raw = await asyncio.to_thread(
                client.realtime.calls.with_raw_response.create,
                sdp=offer,
                session={"type": "realtime", "model": "echo"},
            )
            assert raw.http_response.status_code == 201
            assert raw.headers["content-type"].startswith("application/sdp")
            call_id = call_id_of(raw.headers["location"])
            return raw.http_response.text

        try:
            await caller.start(signal)
            await asyncio.wait_for(caller.wait_connected(), 15)
            await eventually(lambda: hears(caller, 550.0))  # the echo agent, via model "echo"
            await asyncio.to_thread(client.realtime.calls.hangup, call_id)
            # the transceiver closed the session: the caller's connection leaves "connected"
            await eventually(lambda: caller.pc.connectionState != "connected", timeout=5)
        finally:
            await caller.close()
        return caller, call_id

    caller, call_id = asyncio.run(main())
    assert "a=msid:" in caller.result.answer_sdp  # the browser's ontrack gets a stream
    with pytest.raises(openai.NotFoundError):  # over: gone
        client.realtime.calls.hangup(call_id)


def test_browser_flow_raw_sdp_with_a_reusable_ek(stack: Stack) -> None:
    client = sdk(stack.sig)
    ek = client.realtime.client_secrets.create(session={"type": "realtime", "model": "echo"}).value
    with httpx.Client(base_url=stack.sig.url, timeout=20) as http:
        auth = {"Authorization": f"Bearer {ek}", "Origin": ORIGIN}
        call_ids = []
        for _ in range(2):  # reusable until it expires
            resp = http.post(
                "/v1/realtime/calls",
                content=OFFER,
                headers={"Content-Type": "application/sdp", **auth},
            )
            assert resp.status_code == 201, resp.text
            assert resp.headers["content-type"].startswith("application/sdp")
            assert "Location" in resp.headers["access-control-expose-headers"]
            call_ids.append(call_id_of(resp.headers["location"]))
        # the ek's call: not another ek's, not another key's; the minting key's: yes
        other_ek = sdk(stack.sig, OTHER_KEY).realtime.client_secrets.create().value
        for key in (other_ek, OTHER_KEY):
            resp = http.post(
                f"/v1/realtime/calls/{call_ids[0]}/hangup",
                headers={"Authorization": f"Bearer {key}"},
            )
            assert resp.status_code == 404 and openai_error(resp)["code"] == "not_found"
        resp = http.post(f"/v1/realtime/calls/{call_ids[0]}/hangup", headers=auth)
        assert (resp.status_code, resp.json()) == (200, {})
        client.realtime.calls.hangup(call_ids[1])  # the key that minted the ek
        # calls.create with no session sends the offer raw (application/sdp)
        raw = client.realtime.calls.with_raw_response.create(sdp=OFFER)
        assert raw.http_response.status_code == 201
        client.realtime.calls.hangup(call_id_of(raw.headers["location"]))
        # an ek on the native API, a native secret on the realtime one: 403
        resp = http.post(
            "/v1/calls", content=OFFER, headers={"Content-Type": "application/sdp", **auth}
        )
        assert resp.status_code == 403
        fhcs = http.post("/v1/client_secrets", headers={"Authorization": f"Bearer {KEY}"})
        resp = http.post(
            "/v1/realtime/calls",
            content=OFFER,
            headers={
                "Content-Type": "application/sdp",
                "Authorization": f"Bearer {fhcs.json()['value']}",
            },
        )
        assert resp.status_code == 403 and "ek_" in openai_error(resp)["message"]


def test_older_form_and_refusals_in_openai_shape(stack: Stack) -> None:
    with httpx.Client(base_url=stack.sig.url, timeout=20) as http:
        key = {"Authorization": f"Bearer {KEY}"}
        resp = http.post(
            "/v1/realtime?model=gpt-realtime",
            content=OFFER,
            headers={"Content-Type": "application/sdp", **key},
        )
        assert resp.status_code == 201, resp.text
        call_id = call_id_of(resp.headers["location"])
        assert http.post(f"/v1/realtime/calls/{call_id}/hangup", headers=key).status_code == 200
        resp = http.post(
            "/v1/realtime/calls",
            content=b"--x\r\nno\r\n--x--\r\n",
            headers={"Content-Type": "multipart/form-data; boundary=x", **key},
        )
        assert resp.status_code == 400 and openai_error(resp)["type"] == "invalid_request_error"
        files: dict[str, tuple[None, bytes | str, str]] = {
            "sdp": (None, OFFER.encode(), "application/sdp"),
            "session": (None, json.dumps({"instructions": "x" * 20_000}), "application/json"),
        }
        resp = http.post("/v1/realtime/calls", files=files, headers=key)
        assert resp.status_code == 413 and openai_error(resp)
        resp = http.options(
            "/v1/realtime/calls",
            headers={
                "Origin": ORIGIN,
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type,openai-beta,"
                "x-stainless-lang,x-stainless-retry-count,x-openai-agents-sdk",
            },
        )
        assert resp.status_code == 204
        allowed = resp.headers["access-control-allow-headers"].lower()
        for header in ("authorization", "openai-beta", "x-stainless-lang", "x-openai-agents-sdk"):
            assert header in allowed
    with pytest.raises(openai.AuthenticationError):
        sdk(stack.sig, "wrong-key").realtime.calls.create(
            sdp=OFFER, session={"type": "realtime", "model": "x"}
        )
    with pytest.raises(openai.BadRequestError):
        sdk(stack.sig).realtime.client_secrets.create(expires_after={"seconds": 7201})


# --- the sideband, against a stand-in transceiver ---------------------------------------------

ANSWER = "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"


@dataclass
class Standin:
    created: list[dict[str, Any]]
    open_sockets: int = 0
    sidebands_per_session: int = MAX_STANDIN_SIDEBANDS


def standin_transceiver(state: Standin) -> QuartTrio:
    """The internal API's create/delete, and the sideband events endpoint: it greets with
    ``session.created`` and answers every client event with an event naming it."""
    app = QuartTrio("standin-transceiver", static_folder=None)
    sessions: set[str] = set()
    created = state.created

    def authorized(headers: Any) -> bool:
        return bool(headers.get("Authorization") == f"Bearer {INTERNAL_TOKEN}")

    @app.post("/internal/v1/sessions")
    async def create() -> Response:
        body = await request.get_json()
        created.append(body)
        session_id = f"s{len(created)}"
        sessions.add(session_id)
        reply = {"session_id": session_id, "answer_sdp": ANSWER}
        return Response(json.dumps(reply), status=201, content_type="application/json")

    @app.delete("/internal/v1/sessions/<session_id>")
    async def delete(session_id: str) -> Response:
        sessions.discard(session_id)
        return Response("", status=204)

    @app.websocket("/internal/v1/sessions/<session_id>/events")
    async def events(session_id: str) -> Response | None:
        if not authorized(websocket.headers):
            return Response("", status=401)
        if session_id not in sessions:
            return Response("", status=404)
        if state.open_sockets >= state.sidebands_per_session:  # as a transceiver's (4) does
            return Response("too many sideband sockets for this session", status=429)
        await websocket.accept()
        state.open_sockets += 1
        try:
            await websocket.send(json.dumps({"type": "session.created", "event_id": "event_1"}))
            n = 1
            while True:
                message = json.loads(await websocket.receive())
                n += 1
                if message.get("type") == "bye":
                    await websocket.close(1000)
                    return None
                reply = {"type": "test.echo", "event_id": f"event_{n}", "got": message["type"]}
                await websocket.send(json.dumps(reply))
        finally:
            state.open_sockets -= 1

    return app


async def with_standin(
    state: Standin, run: Callable[[SignalingProcess, int], None], *flags: str
) -> None:
    """A real signaling (keys `KEY` and `OTHER_KEY`, with `flags`) whose one transceiver is
    the stand-in; `run(signaling, the stand-in's port)` in a thread, within 60 s."""
    port = free_tcp_port()
    config = HypercornConfig()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = config.errorlog = None
    sig = SignalingProcess(
        *["--transceiver", f"http://127.0.0.1:{port}", "--ingress", "127.0.0.1:3478"],
        *["--ip-rate", "0", "--agent-url", "echo=realtime+ws://127.0.0.1:9/v1/realtime"],
        *flags,
        api_keys=f"{KEY},{OTHER_KEY}",
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(serve, standin_transceiver(state), config)
        await trio.to_thread.run_sync(sig.start)
        try:
            with trio.fail_after(60):
                await trio.to_thread.run_sync(run, sig, port)
        finally:
            sig.kill()
            nursery.cancel_scope.cancel()


async def test_sideband_pipes_events_both_ways_for_the_calls_owner_only() -> None:
    state = Standin(created=[])
    await with_standin(state, lambda sig, port: sideband_session(sig, state, port))


async def test_one_key_holds_at_most_its_share_of_sideband_sockets() -> None:
    """A helper's read (stop 42): signaling bounded sidebands only per call (the
    transceiver's 4), and each held about a megabyte while its client read nothing; a key
    with many calls held as many as it liked. Now a key holds `MAX_SIDEBANDS_PER_KEY` at
    once (429 past it, another key unaffected), and closing one gives its place back."""
    state = Standin(created=[], sidebands_per_session=1000)

    def sideband(sig: SignalingProcess, key: str, call_id: str) -> ClientConnection:
        return ws_connect(
            f"ws://127.0.0.1:{sig.port}/v1/realtime?call_id={call_id}",
            additional_headers={"Authorization": f"Bearer {key}"},
            open_timeout=10,
        )

    def held_and_refused(sig: SignalingProcess, _: int) -> None:
        calls = {}
        for key in (KEY, OTHER_KEY):
            raw = sdk(sig, key).realtime.calls.with_raw_response.create(
                sdp=OFFER, session={"type": "realtime", "model": "echo"}
            )
            calls[key] = call_id_of(raw.headers["location"])
        with ExitStack() as sockets:

            def opened(key: str) -> ClientConnection:
                return sockets.enter_context(sideband(sig, key, calls[key]))

            held = [opened(KEY) for _ in range(MAX_SIDEBANDS_PER_KEY)]
            with pytest.raises(InvalidStatus) as refused:
                opened(KEY)
            assert refused.value.response.status_code == 429
            refusals = httpx.get(f"{sig.url}/metrics", timeout=5).text
            assert 'firsthop_signaling_events_total{event="sideband_refused_key"} 1' in refusals
            opened(OTHER_KEY).close()  # another key's budget is its own
            held.pop().close()

            def its_place_is_back() -> bool:
                try:
                    opened(KEY)
                except InvalidStatus:  # (until signaling has seen that one close)
                    return False
                return True

            wait_until(its_place_is_back, timeout=10)

    await with_standin(state, held_and_refused, "--key-rate", "0")


def sideband_session(sig: SignalingProcess, state: Standin, standin_port: int) -> None:
    created = state.created
    client = sdk(sig)
    raw = client.realtime.calls.with_raw_response.create(
        sdp=OFFER, session={"type": "realtime", "model": "echo", "instructions": "hi"}
    )
    call_id = call_id_of(raw.headers["location"])
    sideband_session_id = f"s{len(created)}"  # the stand-in numbers its sessions
    # contract 2: the session config, and the realtime+ws agent its model names
    assert created[-1]["session"] == {"type": "realtime", "model": "echo", "instructions": "hi"}
    assert created[-1]["agent_url"] == "realtime+ws://127.0.0.1:9/v1/realtime"
    # an ek's bound session, overridden by the multipart session, then by ?model=
    bound: Any = {"type": "realtime", "model": "echo", "instructions": "A", "audio": {"x": 1}}
    ek = client.realtime.client_secrets.create(session=bound).value
    files = {
        "sdp": (None, OFFER.encode(), "application/sdp"),
        "session": (None, b'{"instructions": "B", "audio": {"y": 2}}', "application/json"),
    }
    for query, agent_url in (("?model=zzz", None), ("", "realtime+ws://127.0.0.1:9/v1/realtime")):
        resp = httpx.post(
            f"{sig.url}/v1/realtime/calls{query}",
            files=files,
            headers={"Authorization": f"Bearer {ek}"},
            timeout=20,
        )
        assert resp.status_code == 201, resp.text
        assert created[-1]["agent_url"] == agent_url  # zzz names no agent, and no default
        assert created[-1]["session"] == {
            "type": "realtime",
            "model": "zzz" if query else "echo",
            "instructions": "B",
            "audio": {"x": 1, "y": 2},
        }
        client.realtime.calls.hangup(call_id_of(resp.headers["location"]))
    with client.realtime.connect(call_id=call_id) as conn:
        first = conn.recv()
        assert first.type == "session.created"
        conn.send({"type": "response.create"})
        echoed = json.loads(conn.recv_bytes())
        assert (echoed["type"], echoed["got"]) == ("test.echo", "response.create")
        assert state.open_sockets == 1
        # one more than the transceiver takes: its 429 is passed on, not made a 503
        with pytest.raises(Exception) as info:
            with client.realtime.connect(call_id=call_id):
                pass
        assert "429" in str(info.value)
    wait_until(lambda: state.open_sockets == 0)  # the client left: so did signaling's link
    # someone else's call, an ek, no call id, an unknown call: refused before the upgrade
    for key, query in ((OTHER_KEY, call_id), (KEY, "nope"), (KEY, "")):
        with pytest.raises(Exception) as info:
            with (
                sdk(sig, key).realtime.connect(call_id=query)
                if query
                else sdk(sig, key).realtime.connect(model="x")
            ):
                pass
        assert "404" in str(info.value) or "400" in str(info.value)
    ek = client.realtime.client_secrets.create().value
    with pytest.raises(Exception) as info:
        with sdk(sig, ek).realtime.connect(call_id=call_id):
            pass
    assert "403" in str(info.value)
    # a client message over 64 KiB closes the sideband (1009); the call goes on
    with client.realtime.connect(call_id=call_id) as conn:
        assert conn.recv().type == "session.created"
        conn.send(
            {
                "type": "session.update",
                "session": {"type": "realtime", "instructions": "x" * 70_000},
            }
        )
        with pytest.raises(Exception) as info:  # noqa: B017 - the SDK's closed-connection error
            conn.recv_bytes()
        assert "1009" in str(info.value)
    wait_until(lambda: state.open_sockets == 0)
    # the transceiver closing its end closes the client's
    with client.realtime.connect(call_id=call_id) as conn:
        assert conn.recv().type == "session.created"
        conn.send(cast(Any, {"type": "bye"}))  # not a Realtime event: the stand-in's own
        with pytest.raises(Exception):  # noqa: B017 - the SDK's closed-connection error
            conn.recv_bytes()
    # the session ended at the transceiver (signaling has not heard yet): 404 at the upgrade
    session_id = sideband_session_id
    gone = httpx.delete(f"http://127.0.0.1:{standin_port}/internal/v1/sessions/{session_id}")
    assert gone.status_code == 204
    with pytest.raises(Exception) as info:
        with client.realtime.connect(call_id=call_id):
            pass
    assert "404" in str(info.value)
    client.realtime.calls.hangup(call_id)


def test_an_ek_minted_on_one_replica_places_a_call_on_another() -> None:
    """With Redis, the session an ek is bound to is shared: any replica takes the ek."""
    with redis_server() as redis:
        tx = TransceiverProcess("--redis", redis.url, "--region", "a")
        common = ["--redis", redis.url, "--ingress", "a=127.0.0.1:3478", "--ip-rate", "0"]
        one, two = SignalingProcess(*common), SignalingProcess(*common)
        start_all(tx, one, two)
        r = redis_lib.Redis.from_url(redis.url, decode_responses=True)
        try:
            wait_until(lambda: httpx.get(f"{two.url}/healthz").json()["transceivers"] == 1)
            ek = (
                sdk(one)
                .realtime.client_secrets.create(
                    session={"type": "realtime", "model": "m", "instructions": "Be brief."}
                )
                .value
            )
            [key] = r.keys("firsthop:ek:*")
            assert json.loads(str(r.get(key)))["instructions"] == "Be brief."
            assert 0 < int(r.ttl(key)) <= 601
            resp = httpx.post(
                f"{two.url}/v1/realtime/calls",
                content=OFFER,
                headers={"Content-Type": "application/sdp", "Authorization": f"Bearer {ek}"},
                timeout=20,
            )
            assert resp.status_code == 201, resp.text
            sdk(one).realtime.calls.hangup(call_id_of(resp.headers["location"]))
        finally:
            r.close()
            for p in (tx, one, two):
                p.kill()
