"""What every test gets, and the fixtures more than one test module uses.

**A time limit per test** (setup and teardown included), from pytest-timeout: 120 s
(``timeout`` in pyproject.toml), so a hung test fails instead of holding CI to its own
limit. A test known to need more says so with ``@pytest.mark.timeout(seconds)``.

How it stops a test depends on the test. A synchronous test (the aiortc callers run in
``asyncio.run`` inside one) gets SIGALRM (``timeout_method = "signal"``): the alarm raises
in the test, which fails, its fixtures tear down and the run goes on. A Trio test (every
``async def`` test: ``trio_mode``) cannot take that: the alarm's exception lands inside
Trio's run loop, which reports a TrioInternalError and leaves pytest with an INTERNALERROR
(tried with pytest-trio 0.8, trio 0.32). So Trio tests get the "thread" method: at the limit
it prints every thread's stack and ends the whole run (os._exit), which is still a failure,
not a hang. A Trio test should bound its own waits with ``trio.fail_after`` anyway, so that it
fails on its own, with a traceback, long before this.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator

import pytest
import pytest_timeout

from tests.support import FakeTransceiver, SignalingProcess, TransceiverProcess, start_all

TRIO_TIMER = pytest.StashKey[threading.Timer]()

# **Ports of its own per test process.** `make test` runs two at once (pytest-xdist: gw0,
# gw1): each picks the ports its services will bind (`launch.free_port`) in a range of its
# own below the kernel's ephemeral range (32768-60999 here), so neither the other process's
# picks nor anyone's outgoing connections can take a port between its pick and its bind (a
# compose stack's ports wait out its image build). A run of one process picks as before.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and _WORKER[2:].isdigit() and int(_WORKER[2:]) < 4:
    _LOW = 16384 + 4096 * int(_WORKER[2:])
    os.environ.setdefault("FIRSTHOP_PORT_RANGE", f"{_LOW}-{_LOW + 4095}")


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: pytest_timeout.Settings) -> bool | None:
    """A Trio test gets pytest-timeout's thread method, plus a line naming it (its stacks
    show only Trio's run loop); every other test is left to pytest-timeout as configured."""
    if settings.method != "signal" or item.get_closest_marker("trio") is None:
        return None

    def expired() -> None:
        item.config.get_terminal_writer().line(f"\n{item.nodeid}: over {settings.timeout} s")
        pytest_timeout.timeout_timer(item, settings)  # every thread's stack, then os._exit(1)

    timer = threading.Timer(settings.timeout, expired)
    timer.daemon = True
    item.stash[TRIO_TIMER] = timer
    timer.start()
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> bool | None:
    timer = item.stash.get(TRIO_TIMER, None)
    if timer is None:
        return None  # not ours: pytest-timeout cancels its own
    del item.stash[TRIO_TIMER]
    timer.cancel()
    timer.join()
    return True


@pytest.fixture
def tx() -> Iterator[FakeTransceiver]:
    """A transceiver's relay-facing socket on loopback, for the relay's tests (a module that
    runs a real transceiver names its own `tx`)."""
    t = FakeTransceiver()
    yield t
    t.close()


@pytest.fixture(scope="module")
def signaling_stack() -> Iterator[tuple[SignalingProcess, TransceiverProcess]]:
    """A real signaling process in front of one real transceiver (a static list, no Redis),
    with no per-address rate limit; the ingress it advertises is a placeholder (no media)."""
    tx = TransceiverProcess()
    sig = SignalingProcess(
        *["--transceiver", tx.api, "--ingress", "127.0.0.1:3478", "--ip-rate", "0"]
    )
    start_all(tx, sig)
    yield sig, tx
    sig.kill()
    tx.kill()
