"""`firsthop bench ...`: benchmarks that report side by side with a reference, as ratios."""

from __future__ import annotations

import argparse

from firsthop.services.bench import (
    churn,
    echo,
    faults,
    hearing,
    knee,
    loss,
    phone,
    recording,
    relay,
    sessions,
    setup,
    voice,
    wire,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], help: str) -> None:
    parser = sub.add_parser("bench", help=help)
    benches = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    wire.register(benches)
    relay.register(benches)
    setup.register(benches)
    sessions.register(benches).set_defaults(func=sessions_or_knee)
    churn.register(benches)
    echo.register(benches)
    voice.register(benches)
    hearing.register(benches)
    loss.register(benches)
    faults.register(benches)
    phone.register(benches)
    recording.register(benches)


def sessions_or_knee(args: argparse.Namespace) -> int:
    """`bench sessions`, or with --knee the sweep (knee.py builds on sessions.py, so the
    choice is made here, not in sessions.py)."""
    return knee.main(args) if args.knee else sessions.main(args)
