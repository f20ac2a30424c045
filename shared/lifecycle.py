"""Process lifecycle shared by the services: logging set-up, run-until-SIGTERM, and saying
where a service listens once it does (`announce`)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from firsthop.shared.address import Address, format_hostport

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
    """Start `serve(*args, task_status=...)` and stop it cleanly on SIGTERM or SIGINT."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(serve, *args)
            async for signum in signals:
                logging.getLogger("firsthop").info("%s: shutting down", signal.Signals(signum).name)
                break
            nursery.cancel_scope.cancel()
