"""Faults injected into a real transceiver process, for `test_session_faults.py`.

A process started with this directory on its ``PYTHONPATH`` imports this module first (Python's
`site` does), which wraps one function per stage of a call so that it raises for calls whose
id starts with ``boom-<stage>`` and behaves as usual for every other call; and, for a call
whose id starts with ``race-connect``, ends the call in the tick its agent link opens. Nothing
of it is in the product: the product is only ever run as it ships, with these functions raising
where a bug or an unforeseen input would.
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

    # A call named ``race-connect``: its agent link opens in the very tick the call ends, so
    # the connect's await is cancelled although the link is open (`call_asyncio` cannot
    # give back a result its caller was cancelled before seeing).
    import sys

    import trio

    from firsthop.services.transceiver import session as session_module
    from firsthop.services.transceiver.rtc.bridge import call_asyncio as real_call_asyncio

    async def call_asyncio(coro: Any) -> Any:
        caller = sys._getframe(1).f_locals.get("self")  # (the session awaiting this)
        result = await real_call_asyncio(coro)
        connect = getattr(coro, "__qualname__", "") == "AgentLink.connect"
        if connect and isinstance(caller, Session) and caller.call_id.startswith("race-connect"):
            caller.end("race")  # (its peer connection closes: the table says why)
            await trio.sleep_forever()  # (the call's end cancels this at once)
        return result

    setattr(session_module, "call_asyncio", call_asyncio)  # noqa: B010 (the name session.py calls)


try:
    _install()
except ImportError:  # not a process of the project's (a tool the test runs)
    pass
