"""Headless Chromium calls the echo agent through a lossy uplink (the userspace impairment
proxy: 10 % of its packets lost on the way in): our answer asks for Opus in-band FEC, so
Chromium sends it, and the transceiver rebuilds lost frames from it for the agent."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page

from firsthop.services.bench.impair import ImpairedPath, Impairment
from tests.e2e.test_browser import demo_call, page  # noqa: F401  (the fixture)
from tests.support import (
    AgentProcess,
    RelayProcess,
    SignalingProcess,
    TransceiverProcess,
    edge_for,
    start_all,
    wait_until,
)

# serial: Chromium takes both cores, and frames are counted in real time (alone, after the rest)
pytestmark = pytest.mark.serial

Stack = tuple[TransceiverProcess, SignalingProcess, ImpairedPath]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    if shutil.which("chromium") is None:
        raise RuntimeError("chromium is not installed: run `make test` (it installs it)")
    relay = RelayProcess()
    echo = AgentProcess("echo")
    start_all(relay, echo)
    path = ImpairedPath(relay.listen, up=Impairment(loss=0.10), seed=3).start()
    tx, sig = edge_for(path.listen, {"echo": echo}, "--dev")
    yield tx, sig, path
    for p in (sig, tx, echo):
        p.kill()
    path.stop()
    relay.kill()


def events(tx: TransceiverProcess) -> dict[str, float]:
    status, body = tx.request("GET", "/metrics")
    assert status == 200
    found = re.findall(r'events_total\{event="(\w+)"\} (\S+)', body.decode())
    return {name: float(value) for name, value in found}


def test_chromium_sends_in_band_fec_and_lost_frames_are_rebuilt_from_it(
    stack: Stack,
    page: Page,  # noqa: F811
) -> None:
    tx, sig, path = stack
    demo_call(page, sig.url)
    page.wait_for_timeout(8000)  # Chromium raises its FEC as our receiver reports loss
    page.click("#stop")
    wait_until(lambda: events(tx).get("frames_decoded", 0) > 0, timeout=15)
    counts = events(tx)
    print({k: v for k, v in counts.items() if k.startswith("frames")}, path.counts)
    assert path.counts["up_lost"] > 20
    assert counts["frames_repaired"] > 0.5 * path.counts["up_lost"], counts
    assert counts["frames_repaired_fec"] > 0, counts
