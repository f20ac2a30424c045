"""What the HTTP services answer at all (docs/security.md), as real processes.

* Quart apps get a default static folder, ``static/`` next to their root path, which for an
  app named like ours falls back to the working directory: a file there was served at
  ``/static/...``. Signaling and the transceiver serve no folder.
* ``--dev`` signaling hands out client secrets with no key, so it answers only requests whose
  Host names loopback: a page on another site that resolves its own name to 127.0.0.1 (DNS
  rebinding) gets 403, on every route and on the WebSocket upgrade.
"""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio
from trio_websocket import wrap_client_stream

from tests.integration.test_signaling import ServerMessage, recv
from tests.support import SignalingProcess, TransceiverProcess, start_all


@pytest.fixture(scope="module")
def in_a_dir_with_static(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    cwd = tmp_path_factory.mktemp("cwd")
    (cwd / "static").mkdir()
    (cwd / "static" / "x.txt").write_text("a file from the working directory\n")
    yield cwd


def test_no_static_folder_is_served_from_the_working_directory(
    in_a_dir_with_static: Path,
) -> None:
    sig, tx = SignalingProcess(), TransceiverProcess(tx_id="tx-static")
    for proc in (sig, tx):
        proc.cwd = str(in_a_dir_with_static)
    start_all(sig, tx)
    try:
        for base in (sig.url, tx.api):
            resp = httpx.get(f"{base}/static/x.txt", timeout=5)
            assert resp.status_code == 404, (base, resp.text)
            assert "working directory" not in resp.text
        assert httpx.get(sig.url + "/", timeout=5).status_code == 200  # the demo page stays
    finally:
        sig.kill()
        tx.kill()


@pytest.fixture(scope="module")
def dev_signaling() -> Iterator[SignalingProcess]:
    sig = SignalingProcess("--dev").start()
    yield sig
    sig.kill()


@pytest.mark.parametrize(
    "host",
    ["localhost", "LocalHost:8080", "127.0.0.1", "127.3.2.1:9", "[::1]", "[::1]:8080"],
)
def test_dev_answers_loopback_host_names(dev_signaling: SignalingProcess, host: str) -> None:
    resp = httpx.get(f"{dev_signaling.url}/v1/dev/secret", headers={"Host": host}, timeout=5)
    assert resp.status_code == 200, resp.text
    assert resp.json()["value"]


@pytest.mark.parametrize(
    "host",
    ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", "10.0.0.1", "[::2]", ""],
)
def test_dev_refuses_other_host_names(dev_signaling: SignalingProcess, host: str) -> None:
    for method, path in (("GET", "/v1/dev/secret"), ("GET", "/"), ("POST", "/v1/calls")):
        resp = httpx.request(
            method, f"{dev_signaling.url}{path}", headers={"Host": host}, timeout=5
        )
        assert resp.status_code == 403, (method, path, resp.text)
        assert "Host" in resp.json()["error"]


async def upgrade(sig: SignalingProcess, host: str) -> ServerMessage:
    """A WebSocket upgrade naming `host`; the first message the server sends."""
    async with trio.open_nursery() as nursery:
        stream = await trio.open_tcp_stream("127.0.0.1", sig.port)
        try:
            ws = await wrap_client_stream(nursery, stream, host, "/v1/ws")
            try:
                await ws.send_message(json.dumps({"type": "bye"}))
                return await recv(ws)
            finally:
                await ws.aclose()
        finally:
            await stream.aclose()


WS_UPGRADE = {
    "Connection": "Upgrade",
    "Upgrade": "websocket",
    "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
    "Sec-WebSocket-Version": "13",
}


async def test_dev_refuses_a_websocket_upgrade_from_another_host(
    dev_signaling: SignalingProcess,
) -> None:
    with trio.fail_after(10):
        async with httpx.AsyncClient() as http:
            resp = await http.get(
                dev_signaling.ws_url.replace("ws://", "http://"),
                headers={**WS_UPGRADE, "Host": "evil.example:8080"},
            )
        assert resp.status_code == 403
        assert "Host" in resp.json()["error"]
        # a loopback name upgrades (and then wants auth first)
        first = await upgrade(dev_signaling, f"localhost:{dev_signaling.port}")
        assert first["code"] == 401


UPGRADE_AND_A_BYTE = (
    b"GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\nx"
)


def upgrade_with_a_byte_behind(addr: tuple[str, int], path: bytes) -> None:
    """A WebSocket upgrade and one more byte in the same write, before any answer."""
    with socket.create_connection(addr, timeout=5) as sock:
        sock.sendall(UPGRADE_AND_A_BYTE % path)
        with contextlib.suppress(OSError):
            while sock.recv(65536):
                pass


@pytest.fixture(scope="module")
def services() -> Iterator[tuple[SignalingProcess, TransceiverProcess]]:
    sig, tx = SignalingProcess(), TransceiverProcess(tx_id="tx-surface")
    start_all(sig, tx)
    yield sig, tx
    sig.kill()
    tx.kill()


def address(base: str) -> tuple[str, int]:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def test_an_upgrade_with_a_byte_behind_it_ends_that_connection_not_the_service(
    services: tuple[SignalingProcess, TransceiverProcess],
) -> None:
    """hypercorn answered 400 while the app's answer was on its way, and h11's error ended
    `serve` and the process: one request, any path, no credential (stop 41). Signaling and
    the transceiver's API, the same bytes on several paths; each still answers after."""
    sig, tx = services
    for base, paths in ((sig.url, (b"/v1/ws", b"/no-such-path")), (tx.api, (b"/healthz",))):
        for path in paths:
            for _ in range(3):
                upgrade_with_a_byte_behind(address(base), path)
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
    for proc in (sig, tx):
        assert proc.proc is not None and proc.proc.poll() is None


def everything_answered(addr: tuple[str, int], data: bytes) -> tuple[bytes, bool]:
    """Send `data` in one write: what the server answers in 3 s, and whether it closed."""
    with socket.create_connection(addr, timeout=3) as sock:
        sock.sendall(data)
        answers = b""
        try:
            while chunk := sock.recv(65536):
                answers += chunk
        except TimeoutError:
            return answers, False
        return answers, True


# A POST whose chunked body ends at once, and a GET where a proxy framing by Content-Length
# would see the POST's body: one request to such a proxy, two to a server going by the chunks.
SMUGGLED = (
    b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: 27\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
)


def test_a_request_framed_two_ways_is_refused_and_its_connection_closed(
    services: tuple[SignalingProcess, TransceiverProcess],
) -> None:
    """RFC 9112 §6.1: Content-Length and Transfer-Encoding together is what request
    smuggling rides on. Each service answers one 400 and closes; no second answer (before:
    the POST's answer and the GET's 200 on the same connection)."""
    sig, tx = services
    for base, path in (
        (sig.url, b"/v1/calls"),
        (sig.url, b"/nowhere"),
        (tx.api, b"/internal/v1/sessions"),
    ):
        answers, closed = everything_answered(address(base), SMUGGLED % path)
        assert answers.count(b"HTTP/1.1 ") == 1, answers
        assert answers.startswith(b"HTTP/1.1 400 "), answers[:200]
        assert closed and b"connection: close" in answers.lower()
    honest = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    for base in (sig.url, tx.api):
        answers, closed = everything_answered(address(base), honest)
        assert answers.startswith(b"HTTP/1.1 200 ") and closed
