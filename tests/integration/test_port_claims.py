"""A relay's addresses are its own, and a port clash is one line naming the address.

Before: a second relay (a second `firsthop up`) bound UDP and TCP 127.0.0.1:3478 beside the
first, both SO_REUSEPORT, and the kernel spread the first stack's callers over both (3 and then
5 of 6 calls hung); a port held by a plain socket left the relay's worker crash-looping
(725 lines of tracebacks in 20 s, /healthz silent); a port clash elsewhere was every task's
traceback.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from firsthop.services.launch import FIRSTHOP, free_port, relay_command
from tests.support import (
    RelayProcess,
    binding_request,
    free_sip_port,
    free_tcp_port,
    mint,
    service_env,
)


def run(argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a service that must refuse to start; its exit status and what it said."""
    env = service_env()  # the test route keys and internal token
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def said(done: subprocess.CompletedProcess[str]) -> list[str]:
    """What it said on stderr past the log lines of its start (`HH:MM:SS.mmm ...`)."""
    return [line for line in done.stderr.splitlines() if line and not line[:2].isdigit()]


@pytest.fixture(scope="module")
def relay() -> Iterator[RelayProcess]:
    process = RelayProcess("--listen-tcp", "127.0.0.1:0").start()
    yield process
    process.kill()


def test_a_second_relay_on_the_same_address_refuses_to_start(relay: RelayProcess) -> None:
    host, port = relay.listen
    second = relay_command(listen=port, internal=free_port(), metrics=0)
    done = run(second)
    assert done.returncode == 1, done.stderr
    assert said(done) == [
        f"firsthop relay: {host}:{port} (udp) is already served by another firsthop process"
    ]
    # the first relay's own flows still work: a first packet with a valid token opens one
    transceiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    transceiver.bind(("127.0.0.1", 0))
    transceiver.settimeout(5)
    ufrag = mint(*transceiver.getsockname())
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.settimeout(5)
    client.sendto(binding_request(ufrag, b"caller"), relay.listen)
    data, _ = transceiver.recvfrom(2048)
    assert data.startswith(b"\r\n\r\n\x00\r\nQUIT\n")  # PROXY v2, from the one relay
    client.close()
    transceiver.close()


def test_a_second_relay_on_its_tcp_address_refuses_too(relay: RelayProcess) -> None:
    tcp_port = relay.bound["listen_tcp"][1]
    second = relay_command(
        listen=free_port(),
        internal=free_port(),
        metrics=0,
        extra=("--listen-tcp", f"127.0.0.1:{tcp_port}"),
    )
    done = run(second)
    assert done.returncode == 1
    assert said(done) == [
        f"firsthop relay: 127.0.0.1:{tcp_port} (tcp) is already served by another firsthop process"
    ]


@pytest.mark.parametrize("kind", ["udp", "tcp"])
def test_a_port_another_program_holds_is_one_line_not_a_crash_loop(kind: str) -> None:
    sock_type = socket.SOCK_DGRAM if kind == "udp" else socket.SOCK_STREAM
    held = socket.socket(socket.AF_INET, sock_type)
    held.bind(("127.0.0.1", 0))
    if kind == "tcp":
        held.listen()
    port = held.getsockname()[1]
    try:
        if kind == "udp":
            argv = relay_command(listen=port, internal=free_port(), metrics=0)
        else:
            extra = ("--listen-tcp", f"127.0.0.1:{port}")
            argv = relay_command(listen=free_port(), internal=free_port(), metrics=0, extra=extra)
        started = time.monotonic()
        done = run(argv)
    finally:
        held.close()
    assert done.returncode == 1
    assert said(done) == [
        f"firsthop relay: 127.0.0.1:{port} ({kind}) is already served by another process"
    ]
    assert time.monotonic() - started < 20  # (it waits 2 s for a dead relay's workers)


def test_signaling_on_a_port_in_use_says_so_in_one_line() -> None:
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    try:
        argv = [*FIRSTHOP, "signaling", "--listen", f"127.0.0.1:{port}", "--api-keys", "k"]
        done = run(argv)
    finally:
        held.close()
    assert done.returncode == 1
    assert said(done) == [f"firsthop signaling: 127.0.0.1:{port} (tcp) is already in use"]


def test_up_refuses_ports_in_use_before_starting_anything(relay: RelayProcess) -> None:
    port = relay.listen[1]
    argv = [
        *FIRSTHOP,
        "up",
        *("--port", str(free_tcp_port()), "--relay-port", str(port)),
        *("--relay-tcp-port", str(free_tcp_port())),
        *("--relay-metrics-port", str(free_tcp_port())),
        *("--sip-port", str(free_sip_port())),
    ]
    done = run(argv)
    assert done.returncode == 1, done.stderr
    assert said(done) == [
        f"firsthop up: 127.0.0.1:{port} (udp) already in use (another firsthop up?): stop it, "
        "or choose other ports with --relay-port"
    ]
    assert "redis" not in done.stdout  # nothing was started
