"""`firsthop relay` configuration: flags (each with its FIRSTHOP_* twin) -> RelayConfig."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from firsthop.services.relay.flows import RelayLimits
from firsthop.shared.address import Address, parse_hostport
from firsthop.shared.config import add_option, hostport_arg, parse_cidrs
from firsthop.shared.wire.route_token import DEFAULT_MAX_AGE, parse_route_keys

DEFAULT_ALLOW_DEST = "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7,127.0.0.0/8,::1/128"


@dataclass
class RelayConfig:
    listen: Address = ("0.0.0.0", 3478)
    internal: Address = ("0.0.0.0", 3479)
    public: Address | None = None  # the ingress address written into frames
    metrics: Address = ("0.0.0.0", 9478)
    cluster: int = 1
    keys: dict[int, bytes] = field(default_factory=dict)
    allow_dest: list[str] = field(default_factory=lambda: DEFAULT_ALLOW_DEST.split(","))
    peers: dict[int, Address] = field(default_factory=dict)
    redis: str | None = None
    workers: int = 1
    pin_cpus: bool = True
    limits: RelayLimits = field(default_factory=RelayLimits)

    @property
    def ingress(self) -> Address:
        if self.public is not None:
            return self.public
        return self.listen

    def to_json(self) -> str:
        data = asdict(self)
        data["keys"] = {str(k): v.hex() for k, v in self.keys.items()}
        data["peers"] = {str(k): list(v) for k, v in self.peers.items()}
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> RelayConfig:
        data: dict[str, Any] = json.loads(text)
        data["keys"] = {int(k): bytes.fromhex(v) for k, v in data["keys"].items()}
        data["peers"] = {int(k): tuple(v) for k, v in data["peers"].items()}
        for name in ("listen", "internal", "metrics", "public"):
            if data.get(name) is not None:
                data[name] = tuple(data[name])
        data["limits"] = RelayLimits(**data["limits"])
        return cls(**data)


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], help: str
) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "relay",
        help=help,
        description="The public face of a region: one UDP port, first-packet routing by the "
        "signed server ICE ufrag, PROXY v2 framed forwarding to transceivers and peer relays.",
    )
    add_option(
        p, "--listen", default="0.0.0.0:3478", help="public UDP address", metavar="HOST:PORT"
    )
    add_option(
        p,
        "--internal",
        default="0.0.0.0:3479",
        help="internal UDP address peer relays send to (each worker also opens its own "
        "socket on this host for transceiver traffic)",
        metavar="HOST:PORT",
    )
    add_option(
        p,
        "--public",
        default=None,
        help="ingress address clients send to, written into frames (default: --listen)",
        metavar="HOST:PORT",
    )
    add_option(
        p, "--metrics", default="0.0.0.0:9478", help="/metrics and /healthz", metavar="HOST:PORT"
    )
    add_option(p, "--cluster", default=1, type=int, help="this relay's cluster id")
    add_option(p, "--route-keys", default=None, help="ID=BASE64,... HMAC keys for route tokens")
    add_option(
        p,
        "--allow-dest",
        default=DEFAULT_ALLOW_DEST,
        help="CIDRs transceivers may live in (tokens naming others are refused)",
        metavar="CIDR,...",
    )
    add_option(p, "--peer", action="append", help="peer cluster relay: CLUSTER=HOST:PORT")
    add_option(p, "--redis", default=None, help="redis://host:port/db for the flow cache")
    add_option(p, "--workers", default=os.cpu_count() or 1, type=int, help="SO_REUSEPORT workers")
    add_option(p, "--max-flows", default=RelayLimits().max_flows, type=int, help="flow table bound")
    add_option(
        p,
        "--token-max-age",
        default=DEFAULT_MAX_AGE,
        type=float,
        help="oldest accepted route token, seconds",
    )
    add_option(p, "--no-pin", action="store_true", help="do not pin workers to CPUs")
    return p


def config_from_args(args: argparse.Namespace) -> RelayConfig:
    if not args.route_keys:
        raise SystemExit("firsthop relay: --route-keys (or FIRSTHOP_ROUTE_KEYS) is required")
    try:
        keys = parse_route_keys(args.route_keys)
        peers: dict[int, Address] = {}
        for item in args.peer:
            cluster, sep, addr = item.partition("=")
            if not sep:
                raise ValueError(f"--peer {item!r} is not CLUSTER=HOST:PORT")
            peers[int(cluster)] = parse_hostport(addr)
        config = RelayConfig(
            listen=hostport_arg(args.listen),
            internal=hostport_arg(args.internal),
            public=hostport_arg(args.public) if args.public else None,
            metrics=hostport_arg(args.metrics),
            cluster=args.cluster,
            keys=keys,
            allow_dest=parse_cidrs(args.allow_dest),
            peers=peers,
            redis=args.redis or None,
            workers=max(1, args.workers),
            pin_cpus=not args.no_pin,
            limits=RelayLimits(max_flows=args.max_flows, token_max_age=args.token_max_age),
        )
    except (ValueError, argparse.ArgumentTypeError) as exc:
        raise SystemExit(f"firsthop relay: {exc}") from exc
    if config.cluster in config.peers:
        raise SystemExit("firsthop relay: --peer names this relay's own cluster")
    return config
