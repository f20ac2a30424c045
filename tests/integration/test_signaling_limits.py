"""What one client can make a real signaling process hold (docs/security.md).

Raw sockets play the attacker, so nothing in a client library trims what is sent: WebSocket
frames whose header announces 15 MB, a permessage-deflate bomb, HTTP/2 in clear text. The
process's memory is read from /proc (VmHWM: the peak, so a spike that was freed counts too),
and the bounds are generous (the machine is shared): the unbounded server grew by 300-570 MB.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import zlib
from collections.abc import Iterator

import h2.config
import h2.connection
import httpx
import pytest
import trio

from tests.integration.test_signaling import open_ws, recv
from tests.support import SignalingProcess, TransceiverProcess
from tests.unit.test_signaling_app import OFFER

KEY = SignalingProcess.API_KEY
MB = 1024 * 1024
FLOOD_FRAMES = 20
FRAME_BYTES = 15 * MB
GROWTH_LIMIT = 100 * MB  # the unbounded server: +300 MB here, +570 MB in the report
DEADLINE = 60  # for each attack as a whole; each one takes well under a second when fixed


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of a process, in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                out[name] = int(value.split()[0]) * 1024
    return out


def upgrade_request(port: int, *headers: str) -> bytes:
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        "GET /v1/ws HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
        *headers,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def frame_header(length: int, *, compressed: bool = False) -> bytes:
    """A masked (with a zero key: the payload goes as is) final text frame (RFC 6455 §5.2)."""
    first = 0x80 | 0x01 | (0x40 if compressed else 0)
    return bytes([first, 0x80 | 127]) + struct.pack("!Q", length) + bytes(4)


async def read_head(stream: trio.SocketStream) -> bytes:
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = await stream.receive_some(4096)
        assert chunk, "closed during the handshake"
        head += chunk
    return head


async def send_until_closed(stream: trio.SocketStream, data: bytes, size: int) -> int:
    """Stream `size` bytes of `data` repeated; how many went before the server closed."""
    sent = 0
    try:
        while sent < size:
            await stream.send_all(data[: size - sent])
            sent += min(len(data), size - sent)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    return sent


async def read_until_closed(stream: trio.SocketStream) -> bytes:
    """What the server sends until it closes (EOF or reset): it must close on its own."""
    got = b""
    try:
        while chunk := await stream.receive_some(65536):
            got += chunk
    except trio.BrokenResourceError:
        pass
    return got


async def huge_frame(port: int) -> tuple[int, bytes]:
    """Upgrade (no auth), announce a 15 MB frame and stream it: (bytes sent, what came back)."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(upgrade_request(port))
        assert (await read_head(stream)).startswith(b"HTTP/1.1 101")
        await stream.send_all(frame_header(FRAME_BYTES))
        sent = await send_until_closed(stream, b"a" * 65536, FRAME_BYTES)
        return sent, await read_until_closed(stream)


async def deflate_bomb(port: int) -> tuple[bytes, bytes]:
    """Offer permessage-deflate, then send 200 MB of text deflated to ~200 KB: (the
    handshake reply, what came back after the frame)."""
    async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
        await stream.send_all(upgrade_request(port, "Sec-WebSocket-Extensions: permessage-deflate"))
        head = await read_head(stream)
        deflate = zlib.compressobj(9, zlib.DEFLATED, -15)
        body = deflate.compress(b"a" * 200 * MB) + deflate.flush(zlib.Z_SYNC_FLUSH)
        body = body[:-4]  # RFC 7692 §7.2.1: without the 00 00 ff ff tail
        frame = frame_header(len(body), compressed=True) + body
        await send_until_closed(stream, frame, len(frame))
        return head, await read_until_closed(stream)


def close_code(frames: bytes) -> int | None:
    """The status code of the server's close frame, if it arrived before the connection
    went (a reset can swallow it: the attacker is still sending)."""
    if len(frames) >= 4 and frames[0] == 0x88:
        return int(struct.unpack("!H", frames[2:4])[0])
    return None


async def test_huge_websocket_frames_are_cut_off_without_holding_memory(
    signaling_stack: tuple[SignalingProcess, TransceiverProcess],
) -> None:
    sig, _ = signaling_stack
    assert sig.proc is not None
    before = memory(sig.proc.pid)
    with trio.fail_after(DEADLINE):
        results = [await huge_frame(sig.port) for _ in range(FLOOD_FRAMES)]
        for _ in range(3):
            head, reply = await deflate_bomb(sig.port)
            assert b"sec-websocket-extensions" not in head.lower()  # no compression
            assert close_code(reply) in (None, 1002)  # RSV1 set with no extension
    for sent, reply in results:
        assert sent < FRAME_BYTES  # closed long before the frame's end
        assert close_code(reply) in (None, 1009)
    after = memory(sig.proc.pid)
    assert after["VmHWM"] - before["VmRSS"] < GROWTH_LIMIT, (before, after)
    # and a legitimate call still gets set up over a WebSocket
    async with open_ws(sig, ("Authorization", f"Bearer {KEY}")) as ws:
        await ws.send_message(json.dumps({"type": "offer", "sdp": OFFER}))
        assert (await recv(ws))["type"] == "answer"
        assert await recv(ws) == {"type": "state", "state": "live"}
        await ws.send_message(json.dumps({"type": "bye"}))
        assert (await recv(ws))["type"] == "bye"


def test_http2_in_clear_text_cannot_take_the_process_down(
    signaling_stack: tuple[SignalingProcess, TransceiverProcess],
) -> None:
    """Hypercorn's HTTP/2 let DATA on an answered stream end the whole server (KeyError).
    The services speak HTTP/1.1 only: the preface is a bad request, and h2c is ignored."""
    sig, _ = signaling_stack
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(
        1,
        [
            (":method", "POST"),
            (":path", "/v1/calls"),
            (":scheme", "http"),
            (":authority", f"127.0.0.1:{sig.port}"),
            ("content-length", "60000"),
        ],
    )
    client.send_data(1, b"v" * 100)
    with socket.create_connection(("127.0.0.1", sig.port), timeout=5) as s:
        s.sendall(client.data_to_send())
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
        # an HTTP/1.1 error (the preface's method, PRI, is none of ours: 501), then it closes
        assert reply.startswith(b"HTTP/1.1 501")
    resp = httpx.get(
        f"{sig.url}/healthz", headers={"Connection": "Upgrade", "Upgrade": "h2c"}, timeout=5
    )
    assert resp.status_code == 200 and resp.http_version == "HTTP/1.1"
    assert sig.proc is not None and sig.proc.poll() is None


# -- slow bodies (finding 6) ---------------------------------------------------------------

BODY_TIMEOUT = 10.0
MAX_UPLOADS, MAX_UPLOADS_PER_IP = 60, 30
PER_PHASE = 40  # from each of three addresses: 120 connections
MARGIN = 10.0  # on top of the body deadline, for a loaded machine


@pytest.fixture
def capped() -> Iterator[SignalingProcess]:
    sig = SignalingProcess(
        *["--ip-rate", "0", "--key-rate", "0", "--body-timeout", str(BODY_TIMEOUT)],
        *["--max-uploads", str(MAX_UPLOADS), "--max-uploads-per-ip", str(MAX_UPLOADS_PER_IP)],
    ).start()
    yield sig
    sig.kill()


async def slow_post(
    port: int, source: str, done: list[tuple[str, float, bytes]], key: str = KEY
) -> None:
    """A POST /v1/calls (with `key`) that announces a 1000-byte offer and sends one byte a
    second; records (source, seconds until the server answered and closed, its reply)."""
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    head = (
        "POST /v1/calls HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/sdp\r\n"
        f"Authorization: Bearer {key}\r\nContent-Length: 1000\r\n\r\n"
    ).encode()
    started = trio.current_time()
    async with trio.SocketStream(sock) as stream:
        await stream.send_all(head)

        async def drip() -> None:
            try:
                while True:
                    await stream.send_all(b"v")
                    await trio.sleep(1)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drip)
            reply = await read_until_closed(stream)
            nursery.cancel_scope.cancel()
    done.append((source, trio.current_time() - started, reply))


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]  # what `parse_text` returns


async def scrape(http: httpx.AsyncClient, sig: SignalingProcess) -> Samples:
    from firsthop.shared.metrics import parse_text

    return parse_text((await http.get(f"{sig.url}/metrics")).text)


def status_of(reply: bytes) -> int | None:
    """The status of a reply (None if the connection went before one arrived)."""
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else None


async def test_slow_bodies_time_out_and_uploads_are_capped(capped: SignalingProcess) -> None:
    sig = capped
    done: list[tuple[str, float, bytes]] = []
    uploads: tuple[str, frozenset[tuple[str, str]]] = ("firsthop_signaling_uploads", frozenset())
    with trio.fail_after(BODY_TIMEOUT + 3 * MARGIN):
        async with httpx.AsyncClient(timeout=MARGIN) as http:
            async with trio.open_nursery() as nursery:

                async def phase(source: str, held: int, finished: int) -> None:
                    for _ in range(PER_PHASE):
                        nursery.start_soon(slow_post, sig.port, source, done)
                    while True:  # until the server holds `held` and `finished` were answered
                        if (await scrape(http, sig)).get(uploads) == held:
                            if len(done) >= finished:
                                return
                        await trio.sleep(0.1)

                # 30 of the first address's 40 get a slot (10: 429), the second's as well
                # (the total is full now), and the third's are all refused (503) ...
                await phase("127.0.0.2", held=30, finished=10)
                await phase("127.0.0.3", held=60, finished=20)
                await phase("127.0.0.4", held=60, finished=60)
                # ... all of it at once, while health checks still answer
                resp = await http.get(f"{sig.url}/healthz")
                assert resp.status_code == 200 and resp.json()["ok"]
            metrics = await scrape(http, sig)  # every request has been answered now

    assert len(done) == 3 * PER_PHASE
    assert max(seconds for _, seconds, _ in done) < BODY_TIMEOUT + MARGIN
    events = "firsthop_signaling_events_total"
    assert metrics[(events, frozenset({("event", "body_timeouts")}))] == 60
    assert metrics[(events, frozenset({("event", "uploads_refused_ip")}))] == 20
    assert metrics[(events, frozenset({("event", "uploads_refused_total")}))] == 40
    assert metrics[uploads] == 0
    # What reached the clients (a reset can swallow a reply: the clients are still sending)
    seen = {status_of(reply) for _, _, reply in done}
    assert seen <= {408, 429, 503, None}
    for status, words in ((408, "not complete within"), (429, "address"), (503, "too many")):
        replies = [r for _, _, r in done if status_of(r) == status]
        assert replies, status
        body = json.loads(replies[0].split(b"\r\n\r\n", 1)[1])
        assert words in body["error"], body
        assert all(b"connection: close" in r.lower() for r in replies)


async def test_requests_without_a_credential_hold_no_upload_slot(capped: SignalingProcess) -> None:
    """What an early answer (here 401) skipped of a body is drained to keep the connection,
    and the drains had held upload slots: two addresses of slow POSTs with no valid key held
    all 60 here (256 by default: 16 addresses), and a key's upload was refused (503). Drains
    have slots of their own now (4 an address); past them the connection closes at once."""
    sig = capped
    done: list[tuple[str, float, bytes]] = []
    sources = ("127.0.0.5", "127.0.0.6", "127.0.0.7")
    with trio.fail_after(3 * MARGIN):
        async with httpx.AsyncClient(timeout=MARGIN) as http:
            answered = trio.Event()

            async def unauthenticated(source: str) -> None:
                await slow_post(sig.port, source, done, key="nope")
                answered.set()

            async with trio.open_nursery() as nursery:
                for source in sources:
                    for _ in range(MAX_UPLOADS_PER_IP):
                        nursery.start_soon(unauthenticated, source)
                await answered.wait()  # some answered, the rest draining (2 s at most)
                before = len(done)
                resp = await http.post(
                    f"{sig.url}/v1/realtime/client_secrets",
                    json={},
                    headers={"Authorization": f"Bearer {KEY}"},
                )
                still_draining = len(done) < len(sources) * MAX_UPLOADS_PER_IP
                assert resp.status_code == 200, resp.text
                assert before < len(sources) * MAX_UPLOADS_PER_IP and still_draining
            metrics = await scrape(http, sig)
    assert {status_of(reply) for _, _, reply in done} <= {401, None}
    events = "firsthop_signaling_events_total"
    for refused in ("uploads_refused_total", "uploads_refused_ip"):
        assert metrics.get((events, frozenset({("event", refused)})), 0) == 0


async def test_a_flood_of_pings_costs_a_pong_a_read_not_one_each(
    signaling_stack: tuple[SignalingProcess, TransceiverProcess],
) -> None:
    """hypercorn answered every Ping with its own Pong: 64 KiB of empty ones, unauthenticated,
    cost about a second of signaling's CPU and came back as 10,922 frames (stop 41)."""
    sig, _ = signaling_stack
    port = int(sig.url.rsplit(":", 1)[1])
    pings = bytes([0x89, 0x80]) + bytes(4)  # an empty masked Ping (a zero key)
    count = 64 * 1024 // len(pings)
    with trio.fail_after(DEADLINE):
        async with await trio.open_tcp_stream("127.0.0.1", port) as stream:
            await stream.send_all(upgrade_request(port))
            head = await read_head(stream)
            assert head.startswith(b"HTTP/1.1 101")
            await stream.send_all(pings * count)
            got = head.split(b"\r\n\r\n", 1)[1]
            with trio.move_on_after(1.0):  # (what comes back within a second)
                while chunk := await stream.receive_some(65536):
                    got += chunk
    pongs = got.count(bytes([0x8A, 0x00]))
    assert 1 <= pongs <= 16, pongs
    async with httpx.AsyncClient() as client:
        assert (await client.get(f"{sig.url}/healthz", timeout=5)).status_code == 200
