"""The `firsthop` command: one console script, one subcommand per service (docs §5).

Subcommands are imported lazily: `firsthop relay` loads the relay and nothing of aiortc, av
or Quart (a relay pod should not pay their memory or start time). `firsthop --help` lists
every subcommand from the table below without importing any of them.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# name -> (the module whose `register(sub, help)` adds the subcommand, its one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "relay": (
        "firsthop.services.relay.main",
        "stateless UDP relay: routes first packets by signed ufrag, forwards opaque",
    ),
    "transceiver": (
        "firsthop.services.transceiver.main",
        "WebRTC sessions on one shared UDP socket",
    ),
    "signaling": (
        "firsthop.services.signaling.main",
        "public HTTP + WebSocket API: auth, placement, offer -> answer",
    ),
    "agent": (
        "firsthop.services.agent.server",
        "a reference agent: echo, parrot, or the offline voice assistant",
    ),
    "call": ("firsthop.services.call.main", "call a firsthop signaling server (aiortc client)"),
    "up": ("firsthop.services.up", "run the whole local stack on loopback"),
    "bench": ("firsthop.services.bench.cli", "run a benchmark next to its reference"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with `command`'s flags (every command's when None; the others are
    listed by name and help only)."""
    parser = argparse.ArgumentParser(
        prog="firsthop",
        description="WebRTC edge for real-time voice AI: one public UDP port, "
        "first-packet routing by signed ICE ufrag.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help) in SUBCOMMANDS.items():
        if command is None or name == command:
            importlib.import_module(module).register(sub, help)
        else:
            sub.add_parser(name, help=help, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), "")
    args = build_parser(command if command in SUBCOMMANDS else "").parse_args(argv)
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
