from __future__ import annotations

import argparse

import pytest

from firsthop.shared.address import parse_hostport
from firsthop.shared.config import (
    ALLOW_DEV_SECRETS,
    DEV_API_KEY,
    DEV_INTERNAL_TOKEN,
    DEV_ROUTE_KEY,
    add_option,
    env_name,
    parse_mapping,
    refuse_published,
)
from firsthop.shared.wire.route_token import parse_route_keys


def test_env_name() -> None:
    assert env_name("--route-keys") == "FIRSTHOP_ROUTE_KEYS"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:3478", ("127.0.0.1", 3478)),
        ("[::1]:5004", ("::1", 5004)),
        ("relay-b:3479", ("relay-b", 3479)),
    ],
)
def test_parse_hostport(text: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(text) == expected


@pytest.mark.parametrize("bad", ["", "host", ":1", "h:x", "h:70000", "[::1"])
def test_parse_hostport_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_hostport(bad)


def test_env_defaults_and_cli_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FIRSTHOP_CLUSTER", "7")
    monkeypatch.setenv("FIRSTHOP_PEER", "2=a:1, 3=b:2")
    monkeypatch.setenv("FIRSTHOP_ACCEPT_DIRECT", "true")
    p = argparse.ArgumentParser()
    add_option(p, "--cluster", default=1, type=int, help="c")
    add_option(p, "--peer", action="append", help="p")
    add_option(p, "--accept-direct", action="store_true", help="d")
    args = p.parse_args([])
    assert (args.cluster, args.peer, args.accept_direct) == (7, ["2=a:1", "3=b:2"], True)
    args = p.parse_args(["--cluster", "9", "--peer", "4=c:3"])
    assert args.cluster == 9
    assert args.peer == ["4=c:3"]


def test_parse_mapping() -> None:
    assert parse_mapping(["2=h:1"], "peer") == {"2": "h:1"}
    with pytest.raises(ValueError):
        parse_mapping(["2"], "peer")


def test_agent_url_schemes_have_one_owner() -> None:
    """Signaling accepts exactly the schemes the transceiver can dial (shared/agent_url.py)."""
    from firsthop.services.signaling.config import AGENT_SCHEMES
    from firsthop.services.transceiver.agents import PROTOCOLS, agent_kind
    from firsthop.shared.agent_url import SCHEMES, TLS_SCHEMES, split_agent_url

    assert AGENT_SCHEMES == tuple(SCHEMES)
    for prefix, (kind, ws) in SCHEMES.items():
        url = prefix + "agent.example:9000/x"
        assert split_agent_url(url) == (kind, ws + "agent.example:9000/x")
        assert agent_kind(url).protocol is PROTOCOLS[kind]
        assert (prefix in TLS_SCHEMES) == (ws == "wss://")
    assert split_agent_url("http://agent.example") is None


def test_the_published_dev_secrets_are_refused_unless_allowed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(ALLOW_DEV_SECRETS, raising=False)
    # compose.yaml's route key, as it is written there: the one refused
    compose = parse_route_keys("1=Zmlyc3Rob3AtZGV2LW9ubHktcm91dGUta2V5LTAwMDE=")
    assert list(compose.values()) == [DEV_ROUTE_KEY]
    for secrets_given in (
        {"api_keys": ["mine", DEV_API_KEY]},
        {"internal_token": DEV_INTERNAL_TOKEN},
        {"route_keys": [bytes(32), *compose.values()]},
    ):
        with pytest.raises(SystemExit, match="published dev one"):
            refuse_published("x", **secrets_given)
    refuse_published("x", api_keys=["mine"], internal_token="t", route_keys=[bytes(32)])
    monkeypatch.setenv(ALLOW_DEV_SECRETS, "1")
    refuse_published("x", api_keys=[DEV_API_KEY], internal_token=DEV_INTERNAL_TOKEN)
