"""Command-line configuration shared by every service (docs/architecture.md §5).

Every flag also reads ``FIRSTHOP_<NAME>`` from the environment (``--route-keys`` ↔
``FIRSTHOP_ROUTE_KEYS``); the command line wins. Repeatable flags (``--peer``,
``--ingress``) take a comma-separated list from the environment.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Iterable
from typing import Any

from firsthop.shared.address import Address, parse_hostport

# The dev secrets compose.yaml and k8s/overlays/dev publish: anyone has them. A service
# refuses to start with one (`refuse_published`) unless FIRSTHOP_ALLOW_DEV_SECRETS=1, which
# those two set for a local stack (a helper's read, stop 42: nothing had stopped them from
# keying a reachable deployment, whose route key then let anyone steer the relay's UDP).
DEV_API_KEY = "dev-key-change-me"
DEV_INTERNAL_TOKEN = "dev-internal-token"
DEV_ROUTE_KEY = b"firsthop-dev-only-route-key-0001"
ALLOW_DEV_SECRETS = "FIRSTHOP_ALLOW_DEV_SECRETS"


def refuse_published(
    service: str,
    *,
    api_keys: Iterable[str] = (),
    internal_token: str | None = None,
    route_keys: Iterable[bytes] = (),
) -> None:
    """SystemExit when one of these is a published dev secret (unless allowed)."""
    if os.environ.get(ALLOW_DEV_SECRETS) == "1":
        return
    found = [
        *(["an API key"] if DEV_API_KEY in api_keys else []),
        *(["the internal token"] if internal_token == DEV_INTERNAL_TOKEN else []),
        *(["a route key"] if DEV_ROUTE_KEY in route_keys else []),
    ]
    if found:
        raise SystemExit(
            f"firsthop {service}: {' and '.join(found)} is the published dev one (compose.yaml, "
            f"k8s/overlays/dev); set your own, or {ALLOW_DEV_SECRETS}=1 for a local stack"
        )


def env_name(flag: str) -> str:
    return "FIRSTHOP_" + flag.lstrip("-").replace("-", "_").upper()


def add_option(
    parser: argparse.ArgumentParser | Any,
    flag: str,
    *,
    default: Any = None,
    help: str,
    action: str | None = None,
    type: Any = None,
    metavar: str | None = None,
) -> None:
    """Add `flag` with its default taken from FIRSTHOP_<NAME> when that is set."""
    raw = os.environ.get(env_name(flag))
    kwargs: dict[str, Any] = {"help": f"{help} [env {env_name(flag)}]"}
    if metavar:
        kwargs["metavar"] = metavar
    if action == "store_true":
        if raw is not None:
            default = raw.strip().lower() in ("1", "true", "yes", "on")
        parser.add_argument(flag, action="store_true", default=bool(default), **kwargs)
        return
    if action == "append":
        if raw is not None:
            default = [item.strip() for item in raw.split(",") if item.strip()]
        parser.add_argument(
            flag, action=_ReplacingAppend, default=list(default or []), type=type, **kwargs
        )
        return
    if raw is not None:
        default = type(raw) if type is not None else raw
    parser.add_argument(flag, default=default, type=type, **kwargs)


class _ReplacingAppend(argparse.Action):
    """Like ``append``, but the first use on the command line replaces the env default."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        seen: set[str] = getattr(namespace, "_replaced", set())
        current = [] if self.dest not in seen else list(getattr(namespace, self.dest))
        seen.add(self.dest)
        namespace._replaced = seen
        setattr(namespace, self.dest, [*current, values])


def hostport_arg(text: str) -> Address:
    """argparse type for HOST:PORT."""
    try:
        return parse_hostport(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def parse_mapping(items: list[str], what: str) -> dict[str, str]:
    """Parse repeated ``KEY=VALUE`` items (``--peer 2=relay-b:3479``)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"{what} {item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def parse_cidrs(text: str) -> list[str]:
    cidrs = [c.strip() for c in text.split(",") if c.strip()]
    for cidr in cidrs:
        ipaddress.ip_network(cidr, strict=False)
    return cidrs
