"""Faults injected into a real transceiver process, for `test_session_faults.py`.

A process started with this directory on its ``PYTHONPATH`` imports this module first (Python's
`site` does), which wraps one function per stage of a call so that it raises for calls whose
id starts with ``boom-<stage>`` and behaves as usual for every other call. Nothing of it is in
the product: the product is only ever run as it ships, with these functions raising where a bug
or an unforeseen input would.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


class InjectedFault(RuntimeError):
    pass


def _raising(stage: str, call_id: Callable[[Any], str], original: Any) -> Any:
    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if call_id(self).startswith(f"boom-{stage}"):
            raise InjectedFault(f"injected at {stage}")
        return original(self, *args, **kwargs)

    return wrapper


def _install() -> None:
    from firsthop.services.transceiver.agents.native import NativeProtocol
    from firsthop.services.transceiver.session import Session

    def of_protocol(p: NativeProtocol) -> str:
        return p.call.call_id

    def of_session(s: Session) -> str:
        return s.call_id

    Session.__post_init__ = _raising("setup", of_session, Session.__post_init__)  # type: ignore[method-assign]
    stages = {
        "agent_connect": "opening",
        "agent": "on_message",
        "media": "caller_audio",
        "events": "caller_message",
        "close": "closing",
    }
    for stage, name in stages.items():
        setattr(NativeProtocol, name, _raising(stage, of_protocol, getattr(NativeProtocol, name)))
    # at close, the peer connection's own teardown raises too
    original_teardown = Session._teardown

    async def teardown(self: Session) -> None:
        if self.call_id.startswith("boom-close"):
            rtc = self.rtc

            async def close() -> None:
                raise InjectedFault("injected at close")

            rtc.close = close  # type: ignore[method-assign]
        await original_teardown(self)

    Session._teardown = teardown  # type: ignore[method-assign]


try:
    _install()
except ImportError:  # not a process of the project's (a tool the test runs)
    pass
