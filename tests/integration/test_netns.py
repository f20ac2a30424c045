"""Across real network boundaries: an aiortc caller behind a NAT, the relay on a "public"
address, the transceiver on a "cluster" address only the relay reaches (`nat_network()`).

    caller ns --home-- router ns (nftables masquerade) --public-- host --cluster-- cluster ns
    (aiortc caller)                                               (relay, echo agent) (transceiver)

The caller (tests/netns_caller.py) runs inside its namespace and talks to the test in JSON
lines; the test signals straight to the transceiver's internal API (the relay's public
address as the ingress). The relay's own record of each flow (its `relay.flow` span, over
OTLP to a real receiver) says which client address it saw: the NAT's, never the caller's.
A NAT rebinding is the router's masquerade moving to other source ports with its mappings
flushed mid-call: audio resumes at the caller's next consent check from the new address,
once the transceiver has validated the new path (docs/security.md).

The namespaces are created and removed here; the tests fail, saying what is missing, where
namespaces cannot be created (root with CAP_NET_ADMIN, iproute2, nftables, conntrack).
"""

from __future__ import annotations

import json
import queue
import socket
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from tests.integration.test_transceiver import event_count
from tests.otlp import OtlpCollector
from tests.support import (
    AgentProcess,
    Namespace,
    NatNetwork,
    RelayProcess,
    TransceiverProcess,
    nat_network,
    redis_server,
    start_all,
    wait_until,
)

# serial: its consent wait has 0.5 s of margin over aiortc's interval (alone, after the rest)
pytestmark = pytest.mark.serial

CALLER = Path(__file__).resolve().parent.parent / "netns_caller.py"
PORTS = (41000, 41999)  # the NAT's source ports for its callers' flows, then after the rebinding:
REBOUND = (42000, 42999)
STEADY = 100  # slots of echo (2 s) heard before anything is judged


@dataclass
class Edge:
    net: NatNetwork
    relay: RelayProcess
    tx: TransceiverProcess
    otlp: OtlpCollector

    def flow_clients(self) -> list[tuple[str, int]]:
        """The client addresses of the flows the relay carried (its `relay.flow` spans)."""
        out = []
        for span in self.otlp.named("relay.flow"):
            host, _, port = str(span.attributes["firsthop.client"]).rpartition(":")
            out.append((host, int(port)))
        return out


@pytest.fixture
def edge() -> Iterator[Edge]:
    with OtlpCollector() as otlp, redis_server() as rs, nat_network(PORTS) as net:
        # The relay: public socket toward the router, transceiver traffic from its cluster
        # address, and only the transceiver as a destination.
        relay = RelayProcess(
            *["--internal", f"{net.cluster.host}:0", "--allow-dest", f"{net.cluster.inside}/32"],
            listen_host=net.router.host,
            redis_url=rs.url,
        )
        relay.env.update(otlp.env("relay"))
        echo = AgentProcess("echo", reachable_at=net.cluster.host)
        tx = TransceiverProcess(agent_url=echo.url, netns=net.cluster)
        start_all(relay, echo, tx)
        try:
            yield Edge(net, relay, tx, otlp)
        finally:
            for p in (tx, echo, relay):
                p.kill()


class NetnsCaller:
    """tests/netns_caller.py inside namespace `ns`; `dial(edge)` calls through its relay."""

    def __init__(self, ns: Namespace) -> None:
        self.proc = ns.spawn(sys.executable, str(CALLER))
        self.lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        self.pump = threading.Thread(target=self._pump, args=(self.proc.stdout,), daemon=True)
        self.pump.start()
        self.connected = 0.0

    def dial(self, edge: Edge) -> None:
        offer = self.read(30)["offer"]
        ingress = [f"{edge.relay.listen[0]}:{edge.relay.listen[1]}"]
        status, body = edge.tx.create_session(offer, ingress)
        assert status == 201, body
        self.send({"answer": body["answer_sdp"]})
        self.connected = float(self.read(20)["connected"])

    def _pump(self, out: IO[str]) -> None:
        for line in out:
            self.lines.put(line)

    def read(self, timeout: float) -> dict[str, Any]:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"the caller said nothing within {timeout} s (exit {self.proc.poll()})"
            ) from None
        message: dict[str, Any] = json.loads(line)
        return message

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def status(self) -> dict[str, Any]:
        self.send({"status": True})
        return self.read(5)

    def wait_heard(self, slots: int, timeout: float = 15.0) -> None:
        wait_until(lambda: self.status()["loud"] >= slots, timeout, every=0.1)

    def stop(self) -> dict[str, Any]:
        self.send({"stop": True})
        report: dict[str, Any] = self.read(10)["report"]
        self.proc.wait(10)
        return report

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.pump.join(5)  # it has read to the end
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def caller(edge: Edge) -> Iterator[NetnsCaller]:
    c = NetnsCaller(edge.net.caller)
    try:
        c.dial(edge)
        yield c
    finally:
        c.kill()


def longest_silence(report: dict[str, Any]) -> tuple[int, float, float]:
    """The caller's longest silence: (the longest run of 20 ms slots without the tone between
    the first and last heard, the longest wait between two frames with it (seconds), when
    that wait ended)."""
    loud = report["loud"]
    run = max((b - a - 1 for a, b in zip(loud, loud[1:], strict=False)), default=0)
    times = report["loud_times"]
    wait, ended = max(((b - a, b) for a, b in zip(times, times[1:], strict=False)), default=(0, 0))
    return run, wait, ended


def udp_reaches(
    net: NatNetwork, target: Namespace, senders: dict[str, Namespace | None]
) -> set[str]:
    """Which of `senders` (name -> its namespace, None: this host) get a UDP datagram to
    `target.inside` (a socket there listens for 1.5 s)."""
    sink = target.spawn(
        "python3",
        "-c",
        "import socket, sys\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        f"s.bind(('{target.inside}', 0)); print(s.getsockname()[1], flush=True)\n"
        "s.settimeout(1.5)\n"
        "try:\n"
        "    while True: print(s.recvfrom(100)[0].decode(), flush=True)\n"
        "except TimeoutError: pass\n",
    )
    assert sink.stdout is not None
    port = int(sink.stdout.readline())
    for name, ns in senders.items():
        if ns is None:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.sendto(name.encode(), (target.inside, port))
        else:
            ns.run(
                "python3",
                "-c",
                "import socket\n"
                "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                f"s.sendto(b'{name}', ('{target.inside}', {port}))",
            )
    out, _ = sink.communicate(timeout=10)
    return set(out.split())


def test_a_caller_behind_a_nat_reaches_a_transceiver_only_the_relay_reaches(
    edge: Edge, caller: NetnsCaller
) -> None:
    net = edge.net
    caller.wait_heard(STEADY)
    report = caller.stop()
    assert len(report["loud"]) >= STEADY
    # The relay saw the NAT's public address (a port of its masquerade range), never the
    # caller's private one, and carried the flow to the transceiver on the cluster address.
    wait_until(lambda: edge.flow_clients(), 10)
    clients = edge.flow_clients()
    assert all(host == net.router.inside for host, _ in clients), clients
    assert all(PORTS[0] <= port <= PORTS[1] for _, port in clients), clients
    (flow,) = edge.otlp.named("relay.flow")
    assert flow.attributes["firsthop.destination"] == f"{edge.tx.media[0]}:{edge.tx.media[1]}"
    # The cluster address: the relay's side of the host reaches it, the caller does not.
    reached = udp_reaches(net, net.cluster, {"from-caller": net.caller, "from-host": None})
    assert reached == {"from-host"}, reached


def test_nat_rebinding_mid_call_resumes_at_the_callers_next_check(
    edge: Edge, caller: NetnsCaller
) -> None:
    net, tx = edge.net, edge.tx
    caller.wait_heard(STEADY)
    validations, moved = event_count(tx, "path_validations"), event_count(tx, "path_moved")
    rebound = time.monotonic()
    net.masquerade(REBOUND)  # the caller's flow leaves the NAT from another port now
    # Audio resumes: frames with the tone arrive again, well after the rebinding.
    wait_until(lambda: (caller.status()["last_loud"] or 0) > rebound + 0.5, 15, every=0.1)
    caller.wait_heard(caller.status()["loud"] + 25)  # and keeps coming (0.5 s more)
    report = caller.stop()
    slots, wait, resumed = longest_silence(report)
    print(
        f"NAT rebinding: longest run without the tone {slots} slots ({slots * 0.02:.2f} s); "
        f"longest wait between tone frames {wait:.2f} s, over {resumed - rebound:.2f} s "
        "after the rebinding"
    )
    assert resumed > rebound  # (that silence is the rebinding's)
    # It lasted until the caller's next consent check at most (aiortc: every 5 s x 0.8-1.2),
    # not until consent expired (30 s) or a timer of the edge's.
    assert wait < 6.5, wait
    # The transceiver validated the new path and moved the media to it; the relay carried
    # a second flow, from the NAT's new port.
    assert event_count(tx, "path_validations") >= validations + 1
    assert event_count(tx, "path_moved") >= moved + 1
    wait_until(lambda: len(edge.flow_clients()) >= 2, 10)
    ports = sorted(port for host, port in edge.flow_clients() if host == net.router.inside)
    assert PORTS[0] <= ports[0] <= PORTS[1] and REBOUND[0] <= ports[-1] <= REBOUND[1], ports
