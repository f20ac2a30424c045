"""`firsthop relay` entry point."""

from __future__ import annotations

import argparse

import trio

from firsthop.services.relay import config as relay_config
from firsthop.services.relay.supervisor import serve_relay
from firsthop.shared.lifecycle import address_clash_is_one_line, run_until_signal, setup_logging


def run(args: argparse.Namespace) -> int:
    config = relay_config.config_from_args(args)
    setup_logging("relay")
    with address_clash_is_one_line("relay"):  # its claims name the address (`shared.claim`)
        trio.run(run_until_signal, serve_relay, config)
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], help: str) -> None:
    relay_config.register(sub, help).set_defaults(func=run)
