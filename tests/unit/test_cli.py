"""The `firsthop` command loads only the subcommand it runs."""

from __future__ import annotations

import json
import subprocess
import sys

from firsthop.services.cli import SUBCOMMANDS

HEAVY = ("aiortc", "aioice", "av", "quart", "quart_trio", "pylibsrtp")


def modules_after(code: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport json, sys; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return list(json.loads(out.splitlines()[-1]))


def test_the_relay_loads_nothing_of_aiortc_av_or_quart() -> None:
    loaded = modules_after(
        "from firsthop.services.cli import build_parser\n"
        "args = build_parser('relay').parse_args(['relay', '--route-keys', '1=' + 'A' * 43])\n"
        "import firsthop.services.relay.worker, firsthop.services.relay.supervisor"
    )
    assert [m for m in loaded if m.split(".")[0] in HEAVY] == []
    assert "firsthop.services.relay.dataplane" in loaded


def test_help_lists_every_command_without_loading_them() -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "firsthop.services.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    for name in SUBCOMMANDS:
        assert name in done.stdout
    assert not any(f" {heavy}" in line for line in done.stderr.splitlines() for heavy in HEAVY)


def test_every_command_still_parses_its_own_flags() -> None:
    from firsthop.services.cli import build_parser

    parser = build_parser()  # every command, fully
    args = parser.parse_args(["agent", "--kind", "parrot", "--listen", "127.0.0.1:9"])
    assert (args.command, args.kind) == ("agent", "parrot")
