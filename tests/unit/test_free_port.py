"""`launch.free_port`: the kernel's choice, or in turn through `FIRSTHOP_PORT_RANGE` (each test
process has one of its own: tests/conftest.py)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from firsthop.services import launch


@pytest.fixture
def span(monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """Four ports in a row, none held now (found by trying), as the range: where neither
    the kernel nor another test process picks (tests/conftest.py)."""
    for low in range(30000, 32700, 7):  # (under the kernel's range, over 2 workers')
        try:
            held = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(4)]
            for n, s in enumerate(held):
                s.bind((launch.HOST, low + n))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        monkeypatch.setenv(launch.PORT_RANGE_ENV, f"{low}-{low + 3}")
        monkeypatch.setattr(launch, "_turn", None)
        return low, low + 3
    raise AssertionError("no four free ports in a row")


def test_ports_come_from_the_range_in_turn_past_one_held(span: tuple[int, int]) -> None:
    low, high = span
    first = launch.free_port()
    assert low <= first <= high
    after = low + (first - low + 1) % 4
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind((launch.HOST, after))  # the next in turn is held: it is passed over
        second = launch.free_port()
    assert second == low + (first - low + 2) % 4
    assert launch.free_port() == low + (first - low + 3) % 4  # (no repeat until it wraps)


def test_a_range_all_held_is_an_error_and_a_bad_one_is_refused(
    span: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    low, high = span
    held = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(4)]
    try:
        for n, s in enumerate(held):
            s.bind((launch.HOST, low + n))
        with pytest.raises(OSError, match="no free port"):
            launch.free_port()
    finally:
        for s in held:
            s.close()
    for bad in ("20000", "b-c", "0-10", "30000-20000", "60000-70000"):
        monkeypatch.setenv(launch.PORT_RANGE_ENV, bad)
        with pytest.raises(ValueError, match="LOW-HIGH"):
            launch.free_port()


def test_without_a_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(launch.PORT_RANGE_ENV, raising=False)
    ephemeral = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
    low, high = (int(n) for n in ephemeral.split())
    assert low <= launch.free_port(socket.SOCK_STREAM) <= high
