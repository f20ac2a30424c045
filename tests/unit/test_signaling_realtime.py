"""The OpenAI-compatible Realtime API's pure parts and its refusals, in process.

Ephemeral keys (kinds, expiry on an injected clock), the multipart reader's bounds, session
merging and defaults, model -> agent selection, and the routes' 4xx answers in OpenAI's error
shape (Quart's test client; the transceiver list names a closed port, so nothing is placed).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from firsthop.services.signaling.auth import (
    EK_PREFIX,
    ApiKeys,
    Authenticator,
    ClientSecrets,
    Principal,
    fingerprint,
)
from firsthop.services.signaling.config import SignalingConfig, config_from_args, register_flags
from firsthop.services.signaling.errors import Problem
from firsthop.services.signaling.realtime_api import sendable
from firsthop.services.signaling.realtime_session import (
    MAX_PARTS,
    choose_agent,
    describe_session,
    openai_error,
    parse_multipart,
    secret_request,
)
from firsthop.services.signaling.stores import EK_MEMORY_MAX_ENTRIES, EkSessions
from firsthop.shared.session_config import merge_sessions
from tests.unit.test_signaling_app import CLIENT, KEY, OFFER, app_for
from tests.unit.test_signaling_auth import KEY as MAC_KEY
from tests.unit.test_signaling_auth import Clock, status_of

BOUNDARY = "b0undary"
MULTIPART = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def multipart(*parts: tuple[str, str, bytes], boundary: str = BOUNDARY) -> bytes:
    out = b""
    for name, ctype, data in parts:
        out += f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n'.encode()
        out += f"Content-Type: {ctype}\r\n\r\n".encode() + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def auth_with_clock(clock: Clock) -> Authenticator:
    return Authenticator(ApiKeys(["k1", "k2"]), ClientSecrets(MAC_KEY, 60, clock))


# --- ephemeral keys ------------------------------------------------------------------------


def test_ephemeral_key_is_reusable_until_it_expires_then_401() -> None:
    clock = Clock()
    auth = auth_with_clock(clock)
    value, expires_at, ek_id = auth.ephemeral.mint_with_id(fingerprint("k1"), 30)
    assert value.startswith(EK_PREFIX) and expires_at == int(clock.now + 30)
    for _ in range(3):  # reusable: clients retry
        principal = auth.realtime(f"Bearer {value}", allow_ek=True)
        assert (principal.kind, principal.secret_id) == ("ek", ek_id)
        assert principal.tenant == fingerprint("k1")
    clock.now += 31
    assert status_of(auth.realtime, f"Bearer {value}", allow_ek=True) == (
        401,
        "ephemeral key expired",
    )
    # still good for hanging up the calls it created
    assert auth.realtime(f"Bearer {value}", allow_ek=True, allow_expired=True).kind == "ek"


def test_flags_default_agent_and_realtime_agent_urls() -> None:
    def config(*argv: str) -> SignalingConfig:
        parser = argparse.ArgumentParser()
        register_flags(parser)
        return config_from_args(parser.parse_args(list(argv)))

    got = config(
        *["--agent-url", "assistant=realtime+ws://127.0.0.1:9000/v1/realtime"],
        *["--agent-url", "cloud=realtime+wss://api.example/v1/realtime?model=m"],
        *["--agent-url", "echo=ws://127.0.0.1:9001", "--default-agent", "assistant"],
    )
    assert got.default_agent == "assistant" and len(got.agents) == 3
    assert config().default_agent is None
    with pytest.raises(SystemExit, match="names no --agent-url"):
        config("--agent-url", "echo=ws://127.0.0.1:9", "--default-agent", "nope")
    with pytest.raises(SystemExit, match="realtime\\+ws://"):
        config("--agent-url", "x=http://127.0.0.1:9")


def test_key_kinds_are_kept_apart() -> None:
    auth = auth_with_clock(Clock())
    ek, _ = auth.ephemeral.mint(fingerprint("k1"))
    fhcs, _ = auth.secrets.mint(fingerprint("k1"))
    # an ek on a native route, or where only an API key will do: 403
    assert status_of(auth.authenticate, f"Bearer {ek}")[0] == 403
    assert status_of(auth.realtime, f"Bearer {ek}", allow_ek=False)[0] == 403
    # a native client secret on a realtime route: 403
    assert status_of(auth.realtime, f"Bearer {fhcs}", allow_ek=True)[0] == 403
    # one kind's body under the other's prefix fails its MAC/version check: 401
    swapped = EK_PREFIX + fhcs.removeprefix("fhcs_")
    assert status_of(auth.realtime, f"Bearer {swapped}", allow_ek=True)[0] == 401
    assert status_of(auth.authenticate, "Bearer fhcs_" + ek.removeprefix(EK_PREFIX))[0] == 401
    assert status_of(auth.realtime, "Bearer ek_garbage", allow_ek=True)[0] == 401
    assert auth.realtime("Bearer k2", allow_ek=False).kind == "key"


def test_ownership_on_realtime_routes() -> None:
    tenant = fingerprint("k1")
    key = Principal(kind="key", tenant=tenant)
    ek = Principal(kind="ek", tenant=tenant, secret_id="ab" * 16)
    other_ek = Principal(kind="ek", tenant=tenant, secret_id="cd" * 16)
    other_key = Principal(kind="key", tenant=fingerprint("k2"))
    assert key.owns(ek.owner) and key.owns(key.owner)  # the key's own, and its eks'
    assert ek.owns(ek.owner) and not ek.owns(other_ek.owner) and not ek.owns(key.owner)
    assert not other_key.owns(ek.owner) and not other_key.owns(key.owner)


async def test_ek_sessions_expire_and_stay_bounded_in_memory() -> None:
    clock = Clock()
    store = EkSessions(None, clock, max_live=EK_MEMORY_MAX_ENTRIES * 2)
    await store.put("t", "a", '{"model":"m"}', clock.now + 10)
    assert await store.get("t", "a") == '{"model":"m"}'
    assert await store.get("u", "a") is None  # another tenant's id is not its own
    clock.now += 12
    assert await store.get("t", "a") is None
    await store.put("u", "mine", "{}", clock.now + 600)
    for i in range(EK_MEMORY_MAX_ENTRIES - 1):
        await store.put("t", str(i), "{}", clock.now + 60)
    # The table is full: minting is refused, for anyone, until keys expire; no live key of
    # another tenant is dropped to make room (one shared table had evicted them).
    for tenant in ("t", "u", "v"):
        with pytest.raises(Problem) as full:
            await store.put(tenant, "more", "{}", clock.now + 60)
        assert full.value.status == 503 and full.value.headers["Retry-After"] == "60"
    assert await store.get("u", "mine") == "{}"
    assert store._held == EK_MEMORY_MAX_ENTRIES
    clock.now += 61  # t's have expired: room again, and nothing of them is held
    await store.put("v", "new", "{}", clock.now + 60)
    assert store._held == 2 and set(store._memory) == {"u", "v"}
    assert await store.get("u", "mine") == "{}" and await store.get("t", "0") is None


async def test_live_ephemeral_keys_are_bounded_per_tenant_in_memory() -> None:
    clock = Clock()
    store = EkSessions(None, clock, max_live=3, max_live_dev=1)
    for i in range(3):
        await store.put("t1", f"a{i}", "{}", clock.now + 10 + i)
    with pytest.raises(Problem) as full:
        await store.put("t1", "a3", "{}", clock.now + 60)
    assert full.value.status == 429 and full.value.headers["Retry-After"] == "10"
    await store.put("t2", "b0", "{}", clock.now + 60)  # another key's budget is its own
    await store.put("dev", "d0", "{}", clock.now + 60)
    with pytest.raises(Problem):
        await store.put("dev", "d1", "{}", clock.now + 60)  # the dev route: one tenant
    clock.now += 10.5  # the oldest has expired: room for one
    await store.put("t1", "a3", "{}", clock.now + 60)
    with pytest.raises(Problem):
        await store.put("t1", "a4", "{}", clock.now + 60)


async def test_the_bytes_of_live_ephemeral_keys_are_bounded_per_tenant_in_memory() -> None:
    clock = Clock()
    store = EkSessions(None, clock, max_live=100, max_bytes=10_000)
    big = "x" * 4000
    await store.put("t1", "a0", big, clock.now + 10)
    await store.put("t1", "a1", big, clock.now + 20)
    with pytest.raises(Problem) as full:
        await store.put("t1", "a2", big, clock.now + 60)
    assert full.value.status == 429 and "10000 bytes" in full.value.reason
    await store.put("t1", "a2", "x" * 1000, clock.now + 60)  # a small one still fits
    clock.now += 11  # the first has expired: its bytes are free again
    await store.put("t1", "a3", big, clock.now + 60)


# --- bodies --------------------------------------------------------------------------------


def test_secret_request_defaults_and_bounds() -> None:
    assert secret_request(b"") == (600, {})
    body = {"expires_after": {"anchor": "created_at", "seconds": 10}, "session": {"model": "m"}}
    assert secret_request(json.dumps(body).encode()) == (10, {"model": "m"})
    bad: list[Any] = [
        {"expires_after": {"seconds": 9}},
        {"expires_after": {"seconds": 7201}},
        {"expires_after": {"seconds": "60"}},
        {"expires_after": {"anchor": "now", "seconds": 60}},
        {"session": {"type": "transcription"}},
        {"session": []},
        {"session": {"model": 5}},
        {"nope": 1},
        [],
    ]
    for item in bad:
        assert status_of(secret_request, json.dumps(item).encode())[0] == 400, item
    assert status_of(secret_request, b"{nope")[0] == 400
    # (Python's json takes the constants, and reads a number too big for a double as inf:
    # each would be written back as Infinity, which is not JSON)
    for constant in (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999", b"1E400"):
        body_ = b'{"session": {"temperature": ' + constant + b"}}"
        assert status_of(secret_request, body_)[0] == 400, constant
    big = {"session": {"instructions": "x" * 17_000}}
    assert status_of(secret_request, json.dumps(big).encode())[0] == 413
    deep: Any = {}
    for _ in range(40):
        deep = {"a": deep}
    assert status_of(secret_request, json.dumps({"session": deep}).encode())[0] == 400
    # nested past the parser's own depth: json raises RecursionError, a 400 too (was a 500)
    assert status_of(secret_request, b"[" * 16_000)[0] == 400


def test_merge_and_describe() -> None:
    bound = {"model": "echo", "instructions": "hi", "audio": {"output": {"voice": "marin"}}}
    own = {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}
    merged = merge_sessions(bound, own, {"model": "parrot"})
    assert merged == {
        "model": "parrot",
        "instructions": "hi",
        "audio": {
            "output": {"voice": "marin"},
            "input": {"turn_detection": {"type": "semantic_vad"}},
        },
    }
    described = describe_session(merged)
    assert described["object"] == "realtime.session" and described["id"].startswith("sess_")
    assert described["type"] == "realtime" and described["model"] == "parrot"
    audio = described["audio"]
    assert audio["output"] == {
        "format": {"type": "audio/pcm", "rate": 24000},
        "voice": "marin",
        "speed": 1.0,
    }
    # given whole: no server_vad defaults merged into a semantic_vad turn detection
    assert audio["input"]["turn_detection"] == {"type": "semantic_vad"}
    assert audio["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    assert describe_session({})["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert bound["model"] == "echo"  # inputs untouched


def test_model_picks_the_agent() -> None:
    agents = {"echo": "ws://e", "assistant": "realtime+ws://a"}
    assert choose_agent("echo", None, agents, "assistant") == "echo"
    assert choose_agent("gpt-realtime", None, agents, "assistant") == "assistant"
    assert choose_agent("gpt-realtime", "echo", agents, "assistant") == "echo"
    assert choose_agent(None, None, agents, None) is None
    assert choose_agent("gpt-realtime", "nope", agents, None) == "nope"  # then 400 unknown


def test_multipart_reader() -> None:
    body = multipart(
        ("sdp", "application/sdp", OFFER.encode()),
        ("session", "application/json", b'{"model":"echo"}'),
    )
    parts = parse_multipart(body, MULTIPART["Content-Type"])
    assert parts["sdp"].data == OFFER.encode()
    assert parts["session"].content_type == "application/json"
    quoted = f'multipart/form-data; boundary="{BOUNDARY}"'
    assert parse_multipart(body, quoted)["session"].data == b'{"model":"echo"}'


@pytest.mark.parametrize(
    ("body", "ctype"),
    [
        (b"", MULTIPART["Content-Type"]),
        (multipart(("sdp", "application/sdp", b"x")), "multipart/form-data"),
        (multipart(("sdp", "application/sdp", b"x")), "multipart/form-data; boundary="),
        (multipart(("sdp", "application/sdp", b"x"))[:-10], MULTIPART["Content-Type"]),
        (b"junk" + multipart(("sdp", "application/sdp", b"x")), MULTIPART["Content-Type"]),
        (multipart(*[(f"p{i}", "text/plain", b"x") for i in range(MAX_PARTS + 1)]), None),
        (multipart(("sdp", "a/b", b"1"), ("sdp", "a/b", b"2")), None),
        (f"--{BOUNDARY}\r\nContent-Type: a/b\r\n\r\nx\r\n--{BOUNDARY}--".encode(), None),
        (
            f"--{BOUNDARY}\r\nContent-Disposition: form-data\r\n\r\nx\r\n--{BOUNDARY}--".encode(),
            None,
        ),
        (f"--{BOUNDARY}\r\nno blank line\r\n--{BOUNDARY}--".encode(), None),
        (f"--{BOUNDARY}\r\n{'X: y' * 400}\r\n\r\nx\r\n--{BOUNDARY}--".encode(), None),
    ],
)
def test_multipart_refusals(body: bytes, ctype: str | None) -> None:
    assert status_of(parse_multipart, body, ctype or MULTIPART["Content-Type"])[0] == 400


def test_sideband_close_codes_passed_on() -> None:
    assert [sendable(c) for c in (1000, 1006, 1009, 4404, 3001, 1005)] == [
        1000,
        1001,
        1009,
        1001,
        3001,
        1001,
    ]


def test_openai_error_shape() -> None:
    assert openai_error(401, "unknown API key") == {
        "error": {
            "message": "unknown API key",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    assert openai_error(503, "x")["error"]["type"] == "server_error"


# --- routes, in process --------------------------------------------------------------------


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


async def refusal(resp: Any) -> tuple[int, dict[str, Any]]:
    body = json.loads(await resp.get_data())
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return resp.status_code, body["error"]


async def test_client_secret_route(http: httpx.AsyncClient) -> None:
    client = app_for(http).test_client()
    body = {"expires_after": {"anchor": "created_at", "seconds": 120}, "session": {"model": "x"}}
    resp = await client.post("/v1/realtime/client_secrets", json=body, headers=KEY)
    assert resp.status_code == 200
    got = json.loads(await resp.get_data())
    assert got["value"].startswith("ek_") and got["session"]["model"] == "x"
    assert got["session"]["object"] == "realtime.session"
    ek = {"Authorization": f"Bearer {got['value']}"}
    # an ek cannot mint, nor place native calls, nor mint native secrets
    status, error = await refusal(await client.post("/v1/realtime/client_secrets", headers=ek))
    assert status == 403 and "API key" in error["message"]
    resp = await client.post(
        "/v1/calls", data=OFFER.encode(), headers={"Content-Type": "application/sdp", **ek}
    )
    assert resp.status_code == 403
    assert (await client.post("/v1/client_secrets", headers=ek)).status_code == 403
    status, error = await refusal(
        await client.post("/v1/realtime/client_secrets", headers={"Authorization": "Bearer no"})
    )
    assert (status, error["code"]) == (401, "invalid_api_key")
    bad = {"expires_after": {"seconds": 5}}
    status, _ = await refusal(
        await client.post("/v1/realtime/client_secrets", json=bad, headers=KEY)
    )
    assert status == 400


async def test_call_route_refusals(http: httpx.AsyncClient) -> None:
    client = app_for(http).test_client()

    async def post(body: bytes, path: str = "/v1/realtime/calls", **headers: str) -> Any:
        resp = await client.post(
            path, data=body, headers={**KEY, **MULTIPART, **headers}, scope_base=CLIENT
        )
        return await refusal(resp)

    assert (await post(OFFER.encode(), **{"Content-Type": "text/plain"}))[0] == 415
    assert (await post(b"--nope"))[0] == 400
    no_sdp = multipart(("session", "application/json", b"{}"))
    assert "sdp part" in (await post(no_sdp))[1]["message"]
    big = json.dumps({"instructions": "x" * 17_000}).encode()
    too_big = multipart(("sdp", "application/sdp", OFFER.encode()), ("session", "a/json", big))
    assert (await post(too_big))[0] == 413
    not_json = multipart(("sdp", "application/sdp", OFFER.encode()), ("session", "a/j", b"{"))
    assert (await post(not_json))[0] == 400
    bad_sdp = multipart(("sdp", "application/sdp", b"v=0\r\n"))
    assert (await post(bad_sdp))[0] == 400
    fhcs = json.loads(await (await client.post("/v1/client_secrets", headers=KEY)).get_data())
    status, error = await post(OFFER.encode(), **{"Authorization": f"Bearer {fhcs['value']}"})
    assert status == 403 and "ek_" in error["message"]
    # nothing to place it on (a closed port): 503 in OpenAI's shape, with Retry-After
    status, error = await post(
        OFFER.encode(), "/v1/realtime?model=x", **{"Content-Type": "application/sdp"}
    )
    assert (status, error["type"]) == (503, "server_error")
    status, _ = await refusal(
        await client.post("/v1/realtime/calls/nope/hangup", headers=KEY, scope_base=CLIENT)
    )
    assert status == 404
    status, error = await refusal(
        await client.post("/v1/realtime/calls/nope/accept", headers=KEY, scope_base=CLIENT)
    )
    assert status == 404 and "ringing" in error["message"]  # no phone call of that id


async def test_dev_route_and_preflight(http: httpx.AsyncClient) -> None:
    client = app_for(http).test_client()
    assert (await client.post("/v1/dev/realtime/client_secrets")).status_code == 404
    dev = app_for(http, dev=True).test_client()
    resp = await dev.post(
        "/v1/dev/realtime/client_secrets",
        json={"session": {"model": "echo"}},
        headers={"Host": "localhost:8080"},
    )
    assert resp.status_code == 200
    assert json.loads(await resp.get_data())["value"].startswith("ek_")
    resp = await dev.post("/v1/dev/realtime/client_secrets", headers={"Host": "evil.example"})
    assert resp.status_code == 403
    sdk_headers = "authorization, content-type, openai-beta, x-stainless-os, x-openai-agents-sdk"
    resp = await client.options(
        "/v1/realtime/calls",
        headers={
            "Origin": "https://app.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": sdk_headers + ", x-evil",
        },
    )
    assert resp.status_code == 204
    allowed = {h.strip() for h in resp.headers["Access-Control-Allow-Headers"].split(",")}
    assert set(sdk_headers.split(", ")) <= allowed and "x-evil" not in allowed
    assert "Location" in resp.headers["Access-Control-Expose-Headers"]
    assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"


def test_webhooks_are_signed_as_openais_sdk_checks_them() -> None:
    """`sip.sign_webhook` (Standard Webhooks) against the official SDK's own verifier."""
    import base64

    import openai

    from firsthop.services.signaling.sip import sign_webhook

    secret = "whsec_" + base64.b64encode(b"s" * 32).decode()
    body = json.dumps({"type": "realtime.call.incoming", "data": {"call_id": "rtc_1"}})
    headers = sign_webhook(secret, "evt_1", body)
    client = openai.OpenAI(api_key="x", webhook_secret=secret)
    client.webhooks.verify_signature(body, headers)  # raises if it does not match
    old = sign_webhook(secret, "evt_1", body, now=1_000_000)  # a replay, long after
    try:
        client.webhooks.verify_signature(body, old)
        raise AssertionError("a stale signature verified")
    except openai.InvalidWebhookSignatureError:
        pass


def test_json_read_strictly_takes_no_number_json_cannot_write_back() -> None:
    """The one reader of clients' JSON (the HTTP bodies and /v1/ws messages): NaN, Infinity
    and numbers past a double's range are errors; big integers and ordinary floats pass."""
    from firsthop.services.signaling import ws
    from firsthop.services.signaling.realtime_session import loads_strict

    assert vars(ws)["loads_strict"] is loads_strict  # (what /v1/ws reads messages with)
    for text in ("NaN", "[Infinity]", '{"t": -Infinity}', "1e999", '{"t": [1E400]}', "-1e309"):
        with pytest.raises(ValueError):
            loads_strict(text)
    assert loads_strict('{"t": 1.5e308, "n": 1' + "0" * 400 + "}")["t"] == 1.5e308
