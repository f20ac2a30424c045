"""Request validation of the public API, in process (Quart's test client, no sockets).

Everything here is refused before a transceiver is needed — or with no transceiver at all
(the static list names a closed loopback port) — so no other service runs.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TypedDict

import httpx
import pytest
from quart_trio import QuartTrio

from firsthop.services.signaling.app import create_app
from firsthop.services.signaling.calls import Stats
from firsthop.services.signaling.config import SignalingConfig, config_from_args, register_flags
from firsthop.services.signaling.main import build_context
from firsthop.services.signaling.ratelimit import RateLimit
from firsthop.services.signaling.transceivers import TRACEPARENT, new_traceparent
from firsthop.shared.metrics import parse_text
from firsthop.shared.redis_store import TransceiverInfo
from tests.support import free_tcp_port

VALID_OFFER_HEAD = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
AUDIO = (
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\n"
    "a=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuvwx\r\n"
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32) + "\r\na=setup:actpass\r\n"
    "a=rtpmap:111 opus/48000/2\r\na=sendrecv\r\na=rtcp-mux\r\n"
)
OFFER = VALID_OFFER_HEAD + AUDIO
SDP = {"Content-Type": "application/sdp"}
KEY = {"Authorization": "Bearer k1"}
CLIENT = {"client": ("203.0.113.5", 40000)}


def make_config(**overrides: object) -> SignalingConfig:
    dead = f"http://127.0.0.1:{free_tcp_port()}"
    config = SignalingConfig(
        listen=("127.0.0.1", 0),
        region="a",
        transceivers=[TransceiverInfo(id=dead, api_url=dead, region="a")],
        ingress={"a": ["127.0.0.1:3478"]},
        api_keys=["k1", "k2"],
        cors_origins=["https://app.example"],
        agents={"echo": "ws://127.0.0.1:1"},
        ip_limit=RateLimit(0, 0),
        key_limit=RateLimit(0, 0),
    )
    for name, value in overrides.items():
        setattr(config, name, value)
    return config


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def app_for(http: httpx.AsyncClient, **overrides: object) -> QuartTrio:
    return create_app(build_context(make_config(**overrides), http, None, Stats()))


class Refusal(TypedDict):
    """Every failure's body (services/signaling/app.py)."""

    error: str


async def post_call(
    app: QuartTrio, body: bytes | str = OFFER, **headers: str
) -> tuple[int, Refusal]:
    """POST /v1/calls that is refused: its status and body."""
    data = body.encode() if isinstance(body, str) else body
    resp = await app.test_client().post(
        "/v1/calls", data=data, headers={**SDP, **KEY, **headers}, scope_base=CLIENT
    )
    refusal: Refusal = json.loads(await resp.get_data())
    return resp.status_code, refusal


async def test_content_type_size_and_auth(http: httpx.AsyncClient) -> None:
    app = app_for(http)
    assert (await post_call(app, **{"Content-Type": "text/plain"}))[0] == 415
    status, body = await post_call(app, OFFER + "a=x:" + "y" * 70_000 + "\r\n")
    assert (status, body) == (413, {"error": "body over 65536 bytes"})
    assert (await post_call(app, Authorization=""))[0] == 401
    assert (await post_call(app, Authorization="Bearer nope")) == (
        401,
        {"error": "unknown API key"},
    )
    assert (await post_call(app, Authorization="Basic azE6"))[0] == 401


@pytest.mark.parametrize(
    ("offer", "reason"),
    [
        ("hello", "v=0"),
        (VALID_OFFER_HEAD, "no m-line"),
        (VALID_OFFER_HEAD + AUDIO.replace("m=audio", "m=video"), "no audio"),
        (VALID_OFFER_HEAD + AUDIO.replace("a=ice-ufrag:abcd\r\n", ""), "ice-ufrag"),
        (VALID_OFFER_HEAD + AUDIO * 4, "m-lines"),
        (VALID_OFFER_HEAD + AUDIO + "a=ice-lite\r\n", "ICE-lite"),
    ],
)
async def test_bad_sdp_is_400_with_the_reason(
    http: httpx.AsyncClient, offer: str, reason: str
) -> None:
    status, body = await post_call(app_for(http), offer)
    assert status == 400 and reason.lower() in body["error"].lower()


async def test_not_utf8_and_unknown_agent(http: httpx.AsyncClient) -> None:
    app = app_for(http)
    assert await post_call(app, b"v=0\r\n\xff\xfe") == (400, {"error": "offer is not UTF-8"})
    resp = await app.test_client().post(
        "/v1/calls?agent=nope", data=OFFER.encode(), headers={**SDP, **KEY}
    )
    assert resp.status_code == 400
    assert "unknown agent" in json.loads(await resp.get_data())["error"]


async def test_no_transceiver_is_503_with_retry_after_and_keeps_the_secret(
    http: httpx.AsyncClient,
) -> None:
    app = app_for(http, transceivers=[])
    resp = await app.test_client().post("/v1/client_secrets", headers=KEY)
    assert resp.status_code == 201
    secret = json.loads(await resp.get_data())["value"]
    for _ in range(2):  # the secret is given back when no call could be made with it
        resp = await app.test_client().post(
            "/v1/calls", data=OFFER.encode(), headers={**SDP, "Authorization": f"Bearer {secret}"}
        )
        assert resp.status_code == 503
        assert int(resp.headers["Retry-After"]) >= 1
        assert "no transceiver" in json.loads(await resp.get_data())["error"]


async def test_transceiver_down_is_503(http: httpx.AsyncClient) -> None:
    status, body = await post_call(app_for(http))
    assert status == 503 and body["error"] == "no transceiver could take the call"


async def test_client_secrets_need_an_api_key(http: httpx.AsyncClient) -> None:
    client = app_for(http).test_client()
    resp = await client.post("/v1/client_secrets", headers=KEY)
    assert resp.status_code == 201
    minted = json.loads(await resp.get_data())
    assert set(minted) == {"value", "expires_at"}
    resp = await client.post(
        "/v1/client_secrets", headers={"Authorization": f"Bearer {minted['value']}"}
    )
    assert resp.status_code == 403
    assert (await client.post("/v1/client_secrets")).status_code == 401
    assert (await client.get("/v1/dev/secret")).status_code == 404  # no --dev


async def test_rate_limits_per_ip_and_per_key(http: httpx.AsyncClient) -> None:
    app = app_for(http, ip_limit=RateLimit(0.01, 2), key_limit=RateLimit(0.01, 3))
    client = app.test_client()

    async def mint(ip: str, key: str) -> int:
        resp = await client.post(
            "/v1/client_secrets",
            headers={"Authorization": f"Bearer {key}"},
            scope_base={"client": (ip, 1)},
        )
        if resp.status_code == 429:
            assert int(resp.headers["Retry-After"]) >= 1
        return resp.status_code

    assert [await mint("198.51.100.1", "k1") for _ in range(3)] == [201, 201, 429]
    assert await mint("198.51.100.2", "k1") == 201  # another address, same key: 3rd of 3
    assert await mint("198.51.100.3", "k1") == 429  # the key is spent
    assert await mint("198.51.100.3", "k2") == 201  # another key


async def test_patch_and_delete_unknown_calls(http: httpx.AsyncClient) -> None:
    client = app_for(http).test_client()
    frag = {"Content-Type": "application/trickle-ice-sdpfrag", **KEY}
    assert (await client.patch("/v1/calls/nope", data=b"", headers=frag)).status_code == 404
    assert (await client.delete("/v1/calls/nope", headers=KEY)).status_code == 404
    assert (await client.delete("/v1/calls/bad!id", headers=KEY)).status_code == 404
    assert (await client.delete("/v1/calls/nope%0A", headers=KEY)).status_code == 404
    assert (await client.delete("/v1/calls/nope")).status_code == 401
    resp = await client.patch("/v1/calls/nope", data=b"a=ice-ufrag:\xff\r\n", headers=frag)
    assert resp.status_code == 404  # the call is looked up before its body is parsed (stop 41)
    wrong = {**frag, "Content-Type": "text/plain"}
    assert (await client.patch("/v1/calls/nope", data=b"", headers=wrong)).status_code == 415
    resp = await client.put("/v1/calls", headers=KEY)
    assert resp.status_code == 405
    assert json.loads(await resp.get_data()) == {"error": "method not allowed"}


async def test_cors_preflight_and_exposed_location(http: httpx.AsyncClient) -> None:
    client = app_for(http).test_client()
    origin = {"Origin": "https://app.example"}
    resp = await client.options(
        "/v1/calls", headers={**origin, "Access-Control-Request-Method": "POST"}
    )
    assert resp.status_code == 204
    assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert "PATCH" in resp.headers["Access-Control-Allow-Methods"]
    assert "authorization" in resp.headers["Access-Control-Allow-Headers"].lower()
    resp = await client.post("/v1/calls", data=b"x", headers={**SDP, **KEY, **origin})
    assert "Location" in resp.headers["Access-Control-Expose-Headers"]
    assert resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
    resp = await client.options("/v1/calls", headers={"Origin": "https://evil.example"})
    assert "Access-Control-Allow-Origin" not in resp.headers


async def test_metrics_count_requests_by_route_and_status(http: httpx.AsyncClient) -> None:
    app = app_for(http, transceivers=[])
    await post_call(app)
    await post_call(app, Authorization="")
    resp = await app.test_client().get("/metrics")
    metrics = parse_text(await resp.get_data(as_text=True))

    def value(name: str, **labels: str) -> float:
        return metrics.get((name, frozenset(labels.items())), 0.0)

    requests = "firsthop_signaling_requests_total"
    assert value(requests, method="POST", route="/v1/calls", status="503") == 1
    assert value(requests, method="POST", route="/v1/calls", status="401") == 1
    failures = "firsthop_signaling_placement_failures_total"
    assert value(failures, reason="no_transceiver") == 1
    assert value("firsthop_signaling_ws_active") == 0


def parse(*argv: str) -> SignalingConfig:
    parser = argparse.ArgumentParser()
    register_flags(parser)
    return config_from_args(parser.parse_args(argv))


def test_sip_trunk_auth_names_a_trunk_a_user_and_a_password() -> None:
    base = ("--listen", "127.0.0.1:0", "--sip-trunk", "carrier=192.0.2.0/24")
    config = parse(*base, "--sip-trunk-auth", "carrier=pbx:pa:ss")
    assert config.sip_trunk_auth["carrier"].username == "pbx"
    assert config.sip_trunk_auth["carrier"].password == "pa:ss"
    assert config.sip_auth_algorithms == ("MD5",)
    both = parse(*base, "--sip-trunk-auth", "carrier=pbx:x", "--sip-auth-algorithms", "sha-256,MD5")
    assert both.sip_auth_algorithms == ("SHA-256", "MD5")
    for bad, says in [
        (("--sip-trunk-auth", "other=pbx:x"), "names no --sip-trunk: 'other'"),
        (("--sip-trunk-auth", "carrier=pbx"), "not NAME=USER:PASSWORD"),
        (("--sip-trunk-auth", "carrier=:x"), "not NAME=USER:PASSWORD"),
        (("--sip-trunk-auth", "carrier=a:b", "--sip-trunk-auth", "carrier=c:d"), "twice"),
        (("--sip-auth-algorithms", "SHA-512"), "Digest algorithms"),
    ]:
        with pytest.raises(SystemExit, match=says):
            parse(*base, *bad)
    assert "pa:ss" not in repr(config)
    # a password with a comma, from the environment, is split: the error shows no part of it
    with pytest.raises(SystemExit) as refused:
        parse(*base, "--sip-trunk-auth", "carrier=pbx:Secr3t", "--sip-trunk-auth", "Pass")
    assert "Secr3t" not in str(refused.value) and "Pass" not in str(refused.value)


def test_sip_record_names_trunks_only() -> None:
    base = ("--listen", "127.0.0.1:0", "--sip-trunk", "carrier=192.0.2.0/24")
    assert parse(*base).sip_record == frozenset()
    assert parse(*base, "--sip-record", "carrier").sip_record == {"carrier"}
    with pytest.raises(SystemExit, match="--sip-record names no --sip-trunk: other"):
        parse(*base, "--sip-record", "other")


def test_flags() -> None:
    config = parse(
        "--listen",
        "127.0.0.1:0",
        "--region",
        "a",
        "--ingress",
        "a=127.0.0.1:3478",
        "--ingress",
        "b=[::1]:3478",
        "--ingress",
        "127.0.0.2:3478",
        "--ingress-tcp",
        "a=127.0.0.1:443",
        "--ingress-tcp",
        "b=127.0.0.9:443",
        "--transceiver",
        "http://127.0.0.1:8081/",
        "--transceiver",
        "b=http://127.0.0.1:8082",
        "--region-cidr",
        "10.0.0.0/8=b",
        "--agent-url",
        "echo=ws://127.0.0.1:8090",
        "--cors-origin",
        "https://a.example,https://b.example",
        "--api-keys",
        "k1, k2",
        "--dev",
    )
    assert config.ingress == {"a": ["127.0.0.1:3478", "127.0.0.2:3478"], "b": ["[::1]:3478"]}
    assert config.ingress_tcp == {"a": ["127.0.0.1:443"], "b": ["127.0.0.9:443"]}
    assert [(t.region, t.api_url) for t in config.transceivers] == [
        ("a", "http://127.0.0.1:8081"),
        ("b", "http://127.0.0.1:8082"),
    ]
    assert config.region_cidrs == [("10.0.0.0/8", "b")]
    assert config.cors_origins == ["https://a.example", "https://b.example"]
    assert config.api_keys == ["k1", "k2"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--dev", "--listen", "0.0.0.0:8080"],
        ["--ingress", "a=nowhere"],
        ["--ingress-tcp", "a=nowhere"],
        ["--transceiver", "b=ftp://x"],
        ["--region-cidr", "not-a-cidr=a"],
        ["--agent-url", "echo=http://x"],
        ["--secret-key", "c2hvcnQ="],
        ["--region", "bad region"],
    ],
)
def test_bad_flags_refuse_to_start(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)


def test_traceparent_keeps_an_incoming_trace_id_and_makes_a_new_span() -> None:
    fresh = new_traceparent()
    assert TRACEPARENT.match(fresh) and fresh.endswith("-01")
    incoming = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    child = new_traceparent(incoming)
    assert child.startswith("00-" + "ab" * 16 + "-") and "cd" * 8 not in child
    for bad in ("garbage", "00-" + "0" * 32 + "-" + "cd" * 8 + "-01", incoming + "x"):
        assert not new_traceparent(bad).startswith("00-" + "ab" * 16)


def test_api_keys_file(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# team keys\nk-file-1\n\n  k-file-2  \n")
    config = parse("--api-keys", "k0", "--api-keys-file", str(path))
    assert config.api_keys == ["k0", "k-file-1", "k-file-2"]
    with pytest.raises(SystemExit):
        parse("--api-keys-file", str(path) + ".missing")


async def test_patch_and_delete_spend_the_per_ip_budget(http: httpx.AsyncClient) -> None:
    client = app_for(http, ip_limit=RateLimit(0.01, 2)).test_client()
    ip = {"client": ("198.51.100.9", 1)}
    frag = {"Content-Type": "application/trickle-ice-sdpfrag", **KEY}
    first = await client.patch("/v1/calls/nope", data=b"", headers=frag, scope_base=ip)
    second = await client.delete("/v1/calls/nope", headers=KEY, scope_base=ip)
    third = await client.delete("/v1/calls/nope", headers=KEY, scope_base=ip)
    assert [first.status_code, second.status_code, third.status_code] == [404, 404, 429]
    assert json.loads(await third.get_data()) == {"error": "too many requests from this address"}
