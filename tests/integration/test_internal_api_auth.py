"""The transceiver's internal API needs its bearer token (docs/security.md).

Without one, anyone who reached `--api` could create a session whose `agent_url` names any
host, and the transceiver would open a WebSocket there (SSRF). So `firsthop transceiver`
refuses to start without `--internal-token` unless `--dev` is given on a loopback `--api`,
and every `/internal/` request without the right bearer gets 401. Real processes throughout.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import TransceiverProcess, free_tcp_port, free_udp_port, service_env
from tests.unit.test_signaling_app import OFFER

START_TIMEOUT = 30


def run_transceiver(*args: str, token: str | None) -> subprocess.CompletedProcess[str]:
    """`firsthop transceiver` with `args`, expected to refuse to start (bounded)."""
    env = {k: v for k, v in service_env().items() if k != "FIRSTHOP_INTERNAL_TOKEN"}
    if token is not None:
        env["FIRSTHOP_INTERNAL_TOKEN"] = token
    argv = ["transceiver", "--media", f"127.0.0.1:{free_udp_port()}", *args]
    return subprocess.run(
        [sys.executable, "-m", "firsthop.services.cli", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
    )


@pytest.mark.parametrize("token", [None, ""])
def test_no_token_refuses_to_start_with_a_clear_message(token: str | None) -> None:
    out = run_transceiver("--api", f"127.0.0.1:{free_tcp_port()}", token=token)
    assert out.returncode != 0
    assert "--internal-token" in out.stderr and "--dev" in out.stderr, out.stderr


def test_dev_is_refused_on_a_non_loopback_api() -> None:
    out = run_transceiver(
        "--dev", "--api", "0.0.0.0:0", "--advertise-media", "127.0.0.1:5004", token=None
    )
    assert out.returncode != 0
    assert "--dev" in out.stderr and "loopback" in out.stderr, out.stderr


def test_a_missing_or_wrong_bearer_gets_401_and_dev_on_loopback_is_open() -> None:
    tx = TransceiverProcess(tx_id="tx-auth").start()
    dev = TransceiverProcess("--dev", tx_id="tx-dev")
    dev.env.pop("FIRSTHOP_INTERNAL_TOKEN")
    try:
        dev.start()
        body = json.dumps(
            {
                "call_id": "c1",
                "offer_sdp": OFFER,
                "ingress": ["127.0.0.1:3478"],
                "agent_url": "ws://198.51.100.1:80",  # where an attacker would point it
            }
        ).encode()
        for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "bearer"}):
            for method, path in (
                ("POST", "/internal/v1/sessions"),
                ("PATCH", "/internal/v1/sessions/x"),
                ("DELETE", "/internal/v1/sessions/x"),
                ("POST", "/internal/v1/drain"),
            ):
                status, reply = tx.request(method, path, body, "application/json", auth=auth)
                assert status == 401, (method, path, auth)
                assert json.loads(reply) == {"error": "missing or wrong internal token"}
        assert json.loads(tx.request("GET", "/healthz", auth={})[1])["sessions"] == 0
        # the right token gets through to validation (no session: nothing was created above)
        assert tx.request("DELETE", "/internal/v1/sessions/x")[0] == 404
        # --dev on loopback: no token needed (a local test setup)
        assert dev.request("DELETE", "/internal/v1/sessions/x", auth={})[0] == 404
    finally:
        dev.kill()
        tx.kill()
