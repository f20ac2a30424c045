"""Process lifecycle shared by the services: logging set-up, run-until-SIGTERM, saying
where a service listens once it does (`announce`), and one line, not a traceback, when an
address a service listens on is taken (`address_clash_is_one_line`)."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import trio

from firsthop.shared import memory
from firsthop.shared.address import Address, format_hostport
from firsthop.shared.claim import AddressInUse, Kind, in_use

READY_FILE_ENV = "FIRSTHOP_READY_FILE"


def announce(**addresses: Address) -> None:
    """Tell whoever started this process where it listens, once everything is bound and
    serving: a JSON object of ``HOST:PORT`` strings written (atomically) to the file named
    by FIRSTHOP_READY_FILE, if set. So a service can be given port 0 and read back."""
    path = os.environ.get(READY_FILE_ENV)
    if not path:
        return
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({name: format_hostport(addr) for name, addr in addresses.items()}, f)
    os.replace(tmp, path)


def setup_logging(prefix: str) -> None:
    level = os.environ.get("FIRSTHOP_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level,
        format=f"%(asctime)s.%(msecs)03d {prefix} %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    if level != "DEBUG":
        # aioice logs every pair state change at INFO: per-session noise at scale.
        logging.getLogger("aioice").setLevel(logging.WARNING)


async def run_until_signal(serve: Callable[..., Awaitable[Any]], *args: Any) -> None:
    """Start `serve(*args, task_status=...)` and stop it cleanly on SIGTERM or SIGINT: a
    process's whole life (what it loaded to start is frozen once it serves, `memory`)."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, *args)
            memory.freeze_startup()
            async for signum in signals:
                logging.getLogger("firsthop").info("%s: shutting down", signal.Signals(signum).name)
                break
            nursery.cancel_scope.cancel()


def first_exception(
    exc: BaseException, match: Callable[[BaseException], bool]
) -> BaseException | None:
    """`exc`, or the first exception inside it (Trio's exception groups, however deep), that
    `match`es; None if none does."""
    if match(exc):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = first_exception(inner, match)
            if found is not None:
                return found
    return None


def _in_use(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE


@contextmanager
def address_clash_is_one_line(
    name: str, listens: Iterable[tuple[Kind, Address]] = ()
) -> Iterator[None]:
    """Around a service's whole run: a listen address already in use ends the process with
    one line naming it (exit status 1), not a traceback of every task. The line is the
    `AddressInUse`'s that says so, or, for a bind that failed elsewhere (hypercorn's), names
    those of `listens` that a probe finds taken."""
    try:
        yield
    except BaseException as exc:
        clash = first_exception(exc, _in_use)
        if clash is None:
            raise
        if isinstance(clash, AddressInUse):
            what = str(clash.strerror)
        else:
            taken = [f"{format_hostport(a)} ({kind})" for kind, a in listens if in_use(kind, a)]
            what = f"{', '.join(taken) or 'an address it listens on'} is already in use"
        print(f"firsthop {name}: {what}", file=sys.stderr)
        raise SystemExit(1) from None
