"""The `firsthop` command: one console script, one subcommand per service (ARCHITECTURE §5)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from services import up
from services.agent import server as agent_server
from services.bench import cli as bench_cli
from services.call import main as call_main
from services.relay import main as relay_main
from services.signaling import main as signaling_main
from services.transceiver import main as transceiver_main

# Each entry registers its own subparser and sets `func` to the handler (args) -> exit code.
SUBCOMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [
    relay_main.register,
    transceiver_main.register,
    signaling_main.register,
    agent_server.register,
    call_main.register,
    up.register,
    bench_cli.register,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="firsthop",
        description="WebRTC edge for real-time voice AI: one public UDP port, "
        "first-packet routing by signed ICE ufrag.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for register in SUBCOMMANDS:
        register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
