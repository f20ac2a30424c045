"""A caller whose network drops all UDP still gets through: headless Chromium inside a
network namespace whose nftables drop every UDP datagram calls the echo agent through the
demo page, connects over ICE-TCP (RFC 6544) to the relay's TCP ingress, and hears the echo.

The relay listens (UDP and TCP) on the host side of a veth pair; signaling advertises both
ingresses; Chromium runs in the namespace (`ip netns exec`, its DevTools pipe inherited) and
reaches signaling across the veth. The namespace is created and removed here, and the test
fails with what is missing where namespaces cannot be created.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

from firsthop.services.bench.setup import CHROMIUM
from tests.e2e.test_browser import CHROMIUM_ARGS, demo_call
from tests.integration.test_transceiver import event_count
from tests.support import (
    AgentProcess,
    Namespace,
    RelayProcess,
    SignalingProcess,
    TransceiverProcess,
    network_namespace,
    start_all,
)

# The candidate pair Chromium selected, from its own getStats: (local protocol, remote port).
SELECTED_PAIR_JS = """async () => {
  const report = await pc.getStats();
  let pair = null;
  report.forEach((s) => {
    if (s.type === "transport" && s.selectedCandidatePairId)
      pair = report.get(s.selectedCandidatePairId);
  });
  if (!pair) return null;
  const local = report.get(pair.localCandidateId), remote = report.get(pair.remoteCandidateId);
  return [local.protocol, remote.protocol, remote.port];
}"""


@dataclass
class Edge:
    ns: Namespace
    relay: RelayProcess
    tx: TransceiverProcess
    sig: SignalingProcess
    udp: tuple[str, int]
    tcp: tuple[str, int]

    @property
    def page_url(self) -> str:
        return f"http://{self.ns.host}:{self.sig.port}/"


@pytest.fixture(scope="module")
def edge() -> Iterator[Edge]:
    if shutil.which("chromium") is None:
        raise RuntimeError("chromium is not installed: run `make test` (it installs it)")
    with network_namespace() as ns:
        ns.block_udp()
        relay = RelayProcess("--listen-tcp", f"{ns.host}:0", listen_host=ns.host, listen_port=0)
        echo = AgentProcess("echo")
        start_all(relay, echo)
        tx = TransceiverProcess(agent_url=echo.url)
        tx.start()
        udp, tcp = relay.listen, relay.bound["listen_tcp"]
        sig = SignalingProcess(
            *["--listen", "0.0.0.0:0", "--transceiver", tx.api],
            *["--ingress", f"a={udp[0]}:{udp[1]}", "--ingress-tcp", f"a={tcp[0]}:{tcp[1]}"],
            *["--agent-url", f"echo={echo.url}"],
        )
        sig.start()
        try:
            yield Edge(ns, relay, tx, sig, udp, tcp)
        finally:
            for p in (sig, tx, echo, relay):
                p.kill()


@contextmanager
def chromium_in(ns: Namespace, origin: str) -> Iterator[Page]:
    """A page of headless Chromium running inside `ns`, for a demo page served at `origin`
    (http://HOST:PORT) across the veth."""
    profile = tempfile.mkdtemp(prefix="firsthop-chromium-")
    # Playwright drives Chromium over a pipe (fds 3 and 4), which `ip netns exec` passes on.
    wrapper = Path(profile) / "chromium-in-namespace"
    wrapper.write_text(f'#!/bin/sh\nexec ip netns exec {ns.name} {CHROMIUM} "$@"\n')
    wrapper.chmod(0o755)
    # getUserMedia wants a secure context; the page is served over the veth, not loopback
    args = [*CHROMIUM_ARGS, f"--unsafely-treat-insecure-origin-as-secure={origin}"]
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(Path(profile) / "data"), executable_path=str(wrapper), args=args, headless=True
        )
        try:
            yield context.pages[0] if context.pages else context.new_page()
        finally:
            context.close()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def page(edge: Edge) -> Iterator[Page]:
    with chromium_in(edge.ns, f"http://{edge.ns.host}:{edge.sig.port}") as page:
        yield page


def call_and_hear_the_echo(edge: Edge, page: Page) -> dict[str, float]:
    """One demo-page call to the echo agent; returns the page's timeline (ms)."""
    timeline = demo_call(page, edge.page_url, SignalingProcess.API_KEY)
    return {k: float(v.split()[0]) for k, v in timeline.items()}


def test_udp_really_is_blocked_in_the_namespace(edge: Edge) -> None:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind((edge.ns.host, 0))
    sink.settimeout(0.5)
    try:
        port = sink.getsockname()[1]
        sent = edge.ns.run(
            "python3",
            "-c",
            "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"try: s.sendto(b'x', ('{edge.ns.host}', {port}))\nexcept OSError as e: print(e)",
        )
        assert "not permitted" in sent.stdout, sent  # nftables dropped it on the way out
        with pytest.raises(TimeoutError):
            sink.recvfrom(10)
    finally:
        sink.close()


def test_a_udp_blocked_browser_connects_over_ice_tcp_and_hears_the_echo(
    edge: Edge, page: Page
) -> None:
    relay = edge.relay
    accepted = relay.metric("firsthop_relay_tcp_accepted_total")
    downstream = relay.metric("firsthop_relay_packets_total", direction="downstream")
    timeline = call_and_hear_the_echo(edge, page)
    local, remote, port = page.evaluate(SELECTED_PAIR_JS)
    assert (local, remote, port) == ("tcp", "tcp", edge.tcp[1])
    # (the workers' counts reach /metrics in periodic snapshots: the call may be quicker)
    assert relay.wait_metric("firsthop_relay_tcp_accepted_total", accepted + 1) >= accepted + 1
    assert relay.wait_metric("firsthop_relay_tcp_connections", 1) >= 1
    relay.wait_metric("firsthop_relay_packets_total", downstream + 50, direction="downstream")
    # and the transceiver can tell: the relay marked the caller's transport TCP
    assert event_count(edge.tx, "ice_tcp_path_selected") >= 1
    print(f"ICE-TCP call timeline (ms from start): {timeline}")
    page.click("#stop")
    page.wait_for_function("document.getElementById('state').textContent === 'idle'")


def test_with_udp_open_the_same_browser_takes_the_udp_candidate(edge: Edge, page: Page) -> None:
    # The TCP candidate ranks below UDP (RFC 6544 §4.2): a caller that can use UDP does.
    edge.ns.block_udp(False)
    try:
        timeline = call_and_hear_the_echo(edge, page)
        local, remote, port = page.evaluate(SELECTED_PAIR_JS)
        assert (local, remote, port) == ("udp", "udp", edge.udp[1])
        print(f"UDP call timeline (ms from start): {timeline}")
        page.click("#stop")
        page.wait_for_function("document.getElementById('state').textContent === 'idle'")
    finally:
        edge.ns.block_udp(True)
