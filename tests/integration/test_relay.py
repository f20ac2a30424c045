"""The real `firsthop relay` process on loopback: routing, framing, safety, drops."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firsthop.shared.wire.proxy_v2 import build_proxy_v2
from firsthop.shared.wire.route_token import encode_route_token
from tests.support import (
    Endpoint,
    FakeTransceiver,
    RelayProcess,
    binding_request,
    binding_success,
    mint,
    rtp,
    wait_until,
)

RFC5769_REQUEST = bytes.fromhex(
    "".join(
        line.strip()
        for line in (Path(__file__).parent.parent / "vectors/rfc5769/sample_request.hex")
        .read_text()
        .splitlines()
        if not line.startswith("#")
    ).replace(" ", "")
)


def foreign_key_token(addr: tuple[str, int]) -> bytes:
    return encode_route_token(
        key_id=7,
        key=bytes(32),
        cluster=1,
        host=addr[0],
        port=addr[1],
        issued_at=int(time.time()),
        nonce=b"abc",
    ).encode()


@pytest.fixture(scope="module", params=["c", "python"])
def relay(request: pytest.FixtureRequest) -> Iterator[RelayProcess]:
    # Both data paths: the C common cases (`_fastpath.c`) and the Python loop behind them
    proc = RelayProcess("--datapath", request.param).start()
    yield proc
    proc.kill()


@pytest.fixture
def client() -> Iterator[Endpoint]:
    c = Endpoint()
    yield c
    c.close()


def open_call(relay: RelayProcess, client: Endpoint, tx: FakeTransceiver) -> tuple[str, int]:
    """Client's first Binding request through the relay; transceiver answers. Returns the
    relay worker address the transceiver must reply to."""
    req = binding_request(mint(*tx.addr))
    client.send(req, relay.listen)
    src, dst, payload, via = tx.recv_framed()
    assert (src, dst, payload) == (client.addr, relay.listen, req)
    answer = binding_success()
    tx.reply(via, client.addr, relay.listen, answer)
    data, frm = client.recv()
    assert (data, frm) == (answer, relay.listen)
    return via


def test_routes_first_packet_and_frames_both_ways(
    relay: RelayProcess, client: Endpoint, tx: FakeTransceiver
) -> None:
    via = open_call(relay, client, tx)
    for seq in range(20):
        client.send(rtp(seq), relay.listen)
        src, dst, payload, frm = tx.recv_framed()
        assert (src, dst, payload, frm) == (client.addr, relay.listen, rtp(seq), via)
        tx.reply(via, client.addr, relay.listen, rtp(1000 + seq))
        assert client.recv() == (rtp(1000 + seq), relay.listen)


def test_never_sends_to_a_client_without_a_flow(
    relay: RelayProcess, client: Endpoint, tx: FakeTransceiver
) -> None:
    other = Endpoint()
    try:
        via = open_call(relay, client, tx)
        before = relay.metric("firsthop_relay_drops_total", reason="return_no_flow")
        tx.reply(via, other.addr, relay.listen, b"unsolicited")
        assert other.recv_none()
        assert (
            relay.wait_metric("firsthop_relay_drops_total", before + 1, reason="return_no_flow")
            == before + 1
        )
        # and a stranger sending framed datagrams for a real client is not relayed either
        stranger = FakeTransceiver()
        stranger.reply(via, client.addr, relay.listen, b"injected")
        assert client.recv_none()
        stranger.close()
    finally:
        other.close()


@pytest.mark.parametrize(
    ("make_ufrag", "reason"),
    [
        (lambda tx: mint(*tx.addr)[:-3] + b"AAA", "token_bad_mac"),
        (lambda tx: mint(*tx.addr, issued_at=time.time() - 5 * 3600), "token_expired"),
        (lambda tx: mint(*tx.addr, issued_at=time.time() + 600), "token_future"),
        (lambda tx: mint("10.1.2.3", tx.addr[1]), "dest_not_allowed"),
        (lambda tx: mint(*tx.addr, cluster=42), "unknown_cluster"),
        (lambda tx: foreign_key_token(tx.addr), "token_unknown_key"),
    ],
)
def test_bad_tokens_reach_nobody_and_are_counted(
    relay: RelayProcess,
    client: Endpoint,
    tx: FakeTransceiver,
    make_ufrag: Callable[[FakeTransceiver], bytes],
    reason: str,
) -> None:
    before = relay.metric("firsthop_relay_drops_total", reason=reason)
    client.send(binding_request(make_ufrag(tx)), relay.listen)
    assert tx.recv_none()
    assert relay.wait_metric("firsthop_relay_drops_total", before + 1, reason=reason) >= before + 1


def test_foreign_ufrag_rfc5769_is_dropped(
    relay: RelayProcess, client: Endpoint, tx: FakeTransceiver
) -> None:
    before = relay.metric("firsthop_relay_drops_total", reason="token_malformed")
    client.send(RFC5769_REQUEST, relay.listen)
    assert tx.recv_none()
    assert (
        relay.wait_metric("firsthop_relay_drops_total", before + 1, reason="token_malformed")
        > before
    )


def test_oversize_dropped(relay: RelayProcess, client: Endpoint, tx: FakeTransceiver) -> None:
    open_call(relay, client, tx)
    before = relay.metric("firsthop_relay_drops_total", reason="oversize")
    client.send(b"\x80" + bytes(1500), relay.listen)
    assert tx.recv_none()
    client.send(b"\x80" + bytes(1499), relay.listen)
    assert len(tx.recv_framed()[2]) == 1500
    assert relay.wait_metric("firsthop_relay_drops_total", before + 1, reason="oversize") > before


def test_media_without_a_flow_is_dropped(
    relay: RelayProcess, client: Endpoint, tx: FakeTransceiver
) -> None:
    before = relay.metric("firsthop_relay_drops_total", reason="no_flow")
    client.send(rtp(), relay.listen)
    assert tx.recv_none()
    assert relay.wait_metric("firsthop_relay_drops_total", before + 1, reason="no_flow") > before


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    datagrams=st.lists(
        st.one_of(
            st.binary(max_size=1600),
            st.binary(max_size=200).map(lambda b: b"\x00\x01" + b),
            st.binary(max_size=100).map(
                lambda b: build_proxy_v2(("127.0.0.1", 9), ("127.0.0.1", 3478)) + b
            ),
        ),
        max_size=8,
    ),
    target=st.sampled_from(["listen", "internal"]),
)
def test_garbage_never_hurts(relay: RelayProcess, datagrams: list[bytes], target: str) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for data in datagrams:
            sock.sendto(data, getattr(relay, target))
    finally:
        sock.close()
    assert relay.proc is not None and relay.proc.poll() is None  # nothing took the relay down


def test_still_healthy_after_garbage(
    relay: RelayProcess, client: Endpoint, tx: FakeTransceiver
) -> None:
    open_call(relay, client, tx)
    assert relay.proc is not None and relay.proc.poll() is None


def test_sigterm_exits_within_5s() -> None:
    proc = RelayProcess(workers=2).start()
    try:
        assert proc.stop() < 5.0
        assert proc.proc is not None and proc.proc.returncode == 0
    finally:
        proc.kill()


def test_no_worker_restarts_during_the_module(relay: RelayProcess) -> None:
    # Workers must outlive Trio's idle helper threads (a PDEATHSIG regression restarted them
    # every ~10 s and lost their flows).
    assert relay.metric("firsthop_relay_worker_restarts_total") == 0


def test_workers_exit_when_the_supervisor_is_killed() -> None:
    import os
    import signal
    import subprocess

    proc = RelayProcess(workers=2).start()
    assert proc.proc is not None
    assert proc.wait_metric("firsthop_relay_standby_workers", 1) == 1
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(proc.proc.pid)], capture_output=True, text=True
    ).stdout
    workers = [int(p) for p in out.split()]
    assert len(workers) == 3  # two serving, one warm standby: all go with the supervisor
    os.kill(proc.proc.pid, signal.SIGKILL)
    proc.proc.wait()
    wait_until(lambda: not any(os.path.exists(f"/proc/{w}") for w in workers), 5)
