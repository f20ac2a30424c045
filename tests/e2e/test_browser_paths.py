"""Headless Chromium with two network interfaces calls through the relay: it checks from
both of its addresses, sends its media from one and nominates that one (USE-CANDIDATE on
its selected connection's checks, as libwebrtc does with a lite peer). The transceiver's
media must come back to that address, not to whichever proved itself last, and must follow
when the caller moves: the address it sends from is taken away mid-call, Chromium goes on
from its other one and nominates it. GStreamer's `webrtcbin` (libnice: its own ICE agent,
which nominates once) in the same place must get the echo where it sends from too.

    namespace (Chromium) --link 1-- this host (relay on link 1's host address, the rest on
                         --link 2--            loopback; the page from signaling on link 1;
                                               link 2 reaches them too once link 1 is down)

Two CI runs (stops 45 and 46) lost the agent's audio in the demo-page test this way: the
CI machine's Chromium had more interfaces (other tests' bridges and veths), the transceiver
moved its media to one Chromium did not use, and that one went away with its test.

What each address sends and receives is counted by nftables in the namespace.
"""

from __future__ import annotations

import json
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
from playwright.sync_api import Page, sync_playwright

from firsthop.services.bench.setup import CHROMIUM
from tests.e2e.test_browser import CHROMIUM_ARGS, demo_call
from tests.integration.test_dtls_peers import run_gst_caller
from tests.integration.test_transceiver import event_count
from tests.support import (
    AgentProcess,
    Namespace,
    RelayProcess,
    SignalingProcess,
    TransceiverProcess,
    edge_for,
    network_namespace,
    second_link,
    start_all,
)

SETTLE = 2.0  # s after the echo is first heard before the paths are judged
WINDOW = 3.0  # s of traffic judged
RATE = 50  # the agent's audio: a packet per 20 ms


class Counters:
    """nftables counters in the namespace: datagrams each of its addresses sent to the
    relay's port and received from it."""

    def __init__(self, ns: Namespace, addresses: list[str], relay_port: int) -> None:
        self.ns, self.addresses = ns, addresses
        rules = [
            "table inet firsthop_paths {",
            "chain out {",
            "type filter hook output priority 0;",
        ]
        rules += [f"ip saddr {a} udp dport {relay_port} counter;" for a in addresses]
        rules += ["}", "chain in {", "type filter hook input priority 0;"]
        rules += [f"ip daddr {a} udp sport {relay_port} counter;" for a in addresses]
        ns.nft("\n".join([*rules, "}", "}", ""]))

    def read(self) -> dict[tuple[str, str], int]:
        """(direction "out" or "in", address) -> datagrams so far."""
        listing = json.loads(
            self.ns.run("nft", "-j", "list", "table", "inet", "firsthop_paths").stdout
        )
        out: dict[tuple[str, str], int] = {}
        for item in listing["nftables"]:
            rule = item.get("rule")
            if rule is None:
                continue
            match = next(e["match"] for e in rule["expr"] if "match" in e)
            field = match["left"]["payload"]["field"]  # saddr / daddr
            packets = next(e["counter"]["packets"] for e in rule["expr"] if "counter" in e)
            out[("out" if field == "saddr" else "in", match["right"])] = packets
        return out

    def over(self, seconds: float) -> dict[tuple[str, str], int]:
        before = self.read()
        time.sleep(seconds)  # (a window of real traffic: what Chromium sends meanwhile)
        after = self.read()
        return {k: after[k] - before.get(k, 0) for k in after}


def chromium_in(ns: Namespace, directory: Path) -> Path:
    """An executable that starts this machine's Chromium inside `ns` (Playwright talks to it
    over pipes, which cross the namespace)."""
    script = directory / "chromium-in-netns"
    script.write_text(f'#!/bin/sh\nexec ip netns exec {ns.name} {CHROMIUM} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


@contextmanager
def two_links() -> Iterator[tuple[Namespace, Namespace]]:
    """A namespace with two links to this host; its routes reach link 1's host address
    through link 2 as well, at a higher metric (once link 1 is down, or for a socket bound
    to link 2's interface, as libnice binds each of its candidates')."""
    with network_namespace() as ns, second_link(ns) as link2:
        subnet = ns.host.rpartition(".")[0] + ".0/24"
        ns.run("ip", "route", "add", subnet, "via", link2.host, "metric", "100")
        yield ns, link2


@pytest.fixture
def two_homed() -> Iterator[tuple[Namespace, Namespace]]:
    with two_links() as links:
        yield links


def test_chromium_with_two_interfaces_hears_the_echo_on_its_chosen_path_and_after_it_moves(
    two_homed: tuple[Namespace, Namespace],
) -> None:
    if shutil.which("chromium") is None:
        raise RuntimeError("chromium is not installed: run `make test` (it installs it)")
    link1, link2 = two_homed
    relay = RelayProcess(listen_host=link1.host)
    echo = AgentProcess("echo")
    start_all(relay, echo)
    tx: TransceiverProcess | None = None
    sig: SignalingProcess | None = None
    profile = Path(tempfile.mkdtemp(prefix="firsthop-chromium-"))
    try:
        tx, sig = edge_for(relay.listen, {"echo": echo}, "--listen", f"{link1.host}:0")
        url = f"http://{link1.host}:{sig.port}"
        addresses = [link1.inside, link2.inside]
        counters = Counters(link1, addresses, relay.listen[1])
        args = [*CHROMIUM_ARGS, f"--unsafely-treat-insecure-origin-as-secure={url}"]
        with sync_playwright() as pw:
            context = pw.chromium.launch_persistent_context(
                str(profile / "profile"),
                executable_path=str(chromium_in(link1, profile)),
                args=args,
                headless=True,
            )
            try:
                page: Page = context.pages[0] if context.pages else context.new_page()
                demo_call(page, url + "/", SignalingProcess.API_KEY)
                time.sleep(SETTLE)  # (Chromium's checks of both pairs settle meanwhile)
                counts = counters.over(WINDOW)
                used = max(addresses, key=lambda a: counts[("out", a)])
                other = next(a for a in addresses if a != used)
                heard = {a: counts[("in", a)] for a in addresses}
                print(f"\ntwo interfaces: {counts}; Chromium sends from {used}")
                # Chromium checked from both addresses (the call has two paths) ...
                assert counters.read()[("out", other)] > 0, counts
                assert counts[("out", used)] >= RATE * WINDOW * 0.5, counts
                # ... and the agent's audio comes back to the one Chromium sends from (before
                # stop 47: all of it to the other, four runs of four)
                assert heard[used] >= RATE * WINDOW * 0.5, counts
                assert heard[other] <= heard[used] * 0.1, counts
                # the caller moves: the interface it uses goes down; Chromium goes on from
                # the other, nominates it, and the audio follows it there
                moves = event_count(tx, "path_moved")
                link1.run("ip", "link", "set", "dev", _device_of(link1, used), "down")
                t_down = time.monotonic()
                sent_at, heard_at = moved_at(counters, other, t_down)
                why = {c: event_count(tx, f"path_moved_{c}") for c in ("media", "nominated")}
                print(
                    f"Chromium sends from {other} {sent_at - t_down:.2f} s after the link went "
                    f"down; the echo there {heard_at - sent_at:.2f} s later (moves by {why})"
                )
                assert event_count(tx, "path_moved") > moves
                assert page.inner_text("#state") == "connected"
            finally:
                context.close()
    finally:
        for p in (sig, tx, echo):
            if p is not None:
                p.kill()
        relay.kill()
        shutil.rmtree(profile, ignore_errors=True)


def test_a_gstreamer_caller_with_two_interfaces_hears_the_echo_where_it_sends_from(
    two_homed: tuple[Namespace, Namespace],
) -> None:
    """libnice checks from both addresses (each socket bound to its interface) and nominates
    one pair, once: the agent's audio must come back to the address it sends from. (Its
    link taken down, libnice 0.1.21 sent nothing from the other in 30 s: it does not move,
    so only Chromium's move is tested.)"""
    link1, link2 = two_homed
    relay = RelayProcess(listen_host=link1.host)
    echo = AgentProcess("echo")
    start_all(relay, echo)
    tx = TransceiverProcess(agent_url=echo.url)
    addresses = [link1.inside, link2.inside]
    try:
        tx.start()
        counters = Counters(link1, addresses, relay.listen[1])
        with tempfile.TemporaryDirectory() as tmp, ThreadPoolExecutor(1) as pool:
            caller = pool.submit(
                run_gst_caller,
                tx,
                relay,
                440.0,
                str(Path(tmp) / "heard.pcm"),
                seconds=SETTLE + WINDOW + 3,
                prefix=("ip", "netns", "exec", link1.name),
                offer_edit=lambda offer: offer,  # (both of its candidates: it has two)
            )
            deadline = time.monotonic() + 30  # (the echo's first packets back)
            while not any(counters.read()[("in", a)] for a in addresses):
                assert time.monotonic() < deadline and not caller.done(), caller.result()
                time.sleep(0.1)
            time.sleep(SETTLE)
            counts = counters.over(WINDOW)
            lines = caller.result()
        assert lines[-1].get("event") == "done" and lines[-1]["ok"], lines
        used = max(addresses, key=lambda a: counts[("out", a)])
        other = next(a for a in addresses if a != used)
        heard = {a: counts[("in", a)] for a in addresses}
        print(f"\nGStreamer, two interfaces: {counts}; it sends from {used}")
        assert counters.read()[("out", other)] > 0, counts  # it checked from both
        assert counts[("out", used)] >= RATE * WINDOW * 0.5, counts
        assert heard[used] >= RATE * WINDOW * 0.5, counts
        assert heard[other] <= heard[used] * 0.1, counts
    finally:
        tx.kill()
        echo.kill()
        relay.kill()


def moved_at(counters: Counters, address: str, since: float) -> tuple[float, float]:
    """When (monotonic, in quarter seconds) `address` began to send the caller's media and
    to get the agent's, polling from `since` for at most 30 s."""
    sent_at = heard_at = None
    while time.monotonic() - since < 30:
        window = counters.over(0.25)
        now = time.monotonic()
        if sent_at is None and window[("out", address)] >= RATE * 0.25 * 0.6:
            sent_at = now
        if heard_at is None and window[("in", address)] >= RATE * 0.25 * 0.6:
            heard_at = now
        if sent_at is not None and heard_at is not None:
            return sent_at, heard_at
    raise AssertionError(f"after 30 s, {address} sent at {sent_at} and heard at {heard_at}")


def _device_of(ns: Namespace, address: str) -> str:
    """The interface in `ns` that holds `address`."""
    listing = json.loads(ns.run("ip", "-j", "-4", "addr").stdout)
    for link in listing:
        if any(info.get("local") == address for info in link.get("addr_info", [])):
            return str(link["ifname"])
    raise AssertionError(f"{address} is on no interface of {ns.name}")
