"""`firsthop relay` configuration: flags (each with its FIRSTHOP_* twin) -> RelayConfig."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from firsthop.services.relay.dataplane import DATAPATHS, datapath_in_use
from firsthop.services.relay.flows import RelayLimits
from firsthop.shared.address import (
    Address,
    format_hostport,
    ip_family,
    normalize_host,
    parse_hostport,
)
from firsthop.shared.config import add_option, hostport_arg, parse_cidrs, refuse_published
from firsthop.shared.wire.route_token import DEFAULT_MAX_AGE, parse_route_keys

DEFAULT_ALLOW_DEST = "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,fc00::/7,127.0.0.0/8,::1/128"
# ICE-TCP bounds (RelayLimits fields), each a flag of its own: --tcp-max-connections, ...
TCP_LIMITS = {
    "tcp_max_connections": "ICE-TCP connections per worker",
    "tcp_max_per_ip": "ICE-TCP connections per source IP, per worker",
    "tcp_first_frame_timeout": "seconds an ICE-TCP connection gets to send a valid first check",
    "tcp_idle_timeout": "seconds without a frame before an ICE-TCP connection is closed",
    "tcp_write_buffer": "bytes queued toward a slow ICE-TCP reader before frames are dropped",
    "tcp_write_budget": "bytes queued toward all ICE-TCP readers of a worker, at most",
}


@dataclass
class RelayConfig:
    # Public addresses come one per IP family: `listen` is the first --listen, `listen_other`
    # a second one of the other family (e.g. 0.0.0.0:3478 and [::]:3478), each its own
    # socket (IPv6 ones IPV6_V6ONLY); likewise --listen-tcp and --public.
    listen: Address = ("0.0.0.0", 3478)
    listen_tcp: Address | None = None  # ICE-TCP (RFC 6544 passive), e.g. 0.0.0.0:443
    internal: Address = ("0.0.0.0", 3479)
    public: Address | None = None  # the ingress address written into frames
    metrics: Address = ("0.0.0.0", 9478)
    cluster: int = 1
    keys: dict[int, bytes] = field(default_factory=dict)
    allow_dest: list[str] = field(default_factory=lambda: DEFAULT_ALLOW_DEST.split(","))
    peers: dict[int, Address] = field(default_factory=dict)
    redis: str | None = None
    workers: int = 1
    standby: bool = True  # a warm spare worker process takes over a dead one's slot
    pin_cpus: bool = True
    limits: RelayLimits = field(default_factory=RelayLimits)
    listen_other: Address | None = None
    listen_tcp_other: Address | None = None
    public_other: Address | None = None
    datapath: str = "auto"  # the data plane's common cases: "c" (_fastpath.c), "python", "auto"

    @property
    def ingress(self) -> Address:
        return self.ingresses[0]

    @property
    def listens(self) -> list[Address]:
        return [a for a in (self.listen, self.listen_other) if a is not None]

    @property
    def listens_tcp(self) -> list[Address]:
        return [a for a in (self.listen_tcp, self.listen_tcp_other) if a is not None]

    def _public_of(self, family: int) -> Address | None:
        for addr in (self.public, self.public_other):
            if addr is not None and ip_family(addr[0]) == family:
                return addr
        return None

    @property
    def ingresses(self) -> list[Address]:
        """The UDP ingress of each --listen, written into its clients' frames: --public of
        the same family if given, else the --listen address itself."""
        return [self._public_of(ip_family(a[0])) or a for a in self.listens]

    @property
    def ingresses_tcp(self) -> list[Address]:
        """The ICE-TCP ingress of each --listen-tcp: --public's host of the same family (or
        --listen-tcp's) with the --listen-tcp port."""
        out = []
        for host, port in self.listens_tcp:
            public = self._public_of(ip_family(host))
            out.append((public[0] if public is not None else host, port))
        return out

    @property
    def ingress_tcp(self) -> Address | None:
        """The (first) ICE-TCP address clients connect to, written into their frames."""
        tcp = self.ingresses_tcp
        return tcp[0] if tcp else None

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
        for name in (
            "listen",
            "listen_tcp",
            "internal",
            "metrics",
            "public",
            "listen_other",
            "listen_tcp_other",
            "public_other",
        ):
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
        description="The public face of a region: one UDP port (and optionally one ICE-TCP "
        "port), first-packet routing by the signed server ICE ufrag, PROXY v2 framed "
        "forwarding to transceivers and peer relays.",
    )
    add_option(
        p,
        "--listen",
        action="append",
        default=["0.0.0.0:3478"],
        help="public UDP address; one per IP family, repeat (or comma-list) for dual stack: "
        "0.0.0.0:3478,[::]:3478",
        metavar="HOST:PORT",
    )
    add_option(
        p,
        "--listen-tcp",
        action="append",
        default=[],
        help="public ICE-TCP address (RFC 6544 passive, RFC 4571 framing; 443 in production; "
        "one per IP family, like --listen; default: none)",
        metavar="HOST:PORT",
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
        action="append",
        default=[],
        help="ingress address clients send to, written into frames (default: --listen); "
        "one per IP family, like --listen",
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
    limits = RelayLimits()
    for name, help_ in TCP_LIMITS.items():
        default = getattr(limits, name)
        flag = "--" + name.replace("_", "-")
        add_option(p, flag, default=default, type=type(default), help=help_)
    add_option(p, "--no-pin", action="store_true", help="do not pin workers to CPUs")
    add_option(
        p,
        "--datapath",
        default="auto",
        help="the data plane's common cases: c (services/relay/_fastpath.c, built with the "
        "package where a compiler is), python, or auto (c when built)",
        metavar="|".join(DATAPATHS),
    )
    add_option(
        p,
        "--no-standby",
        action="store_true",
        help="no warm standby worker (a dead worker is then cold-started after 0.5 s)",
    )
    return p


def per_family(items: list[str], flag: str) -> list[Address]:
    """HOST:PORT items (each may be a comma list), at most one per IP family."""
    out: list[Address] = []
    for item in items:
        for text in item.split(","):
            if text.strip():
                host, port = hostport_arg(text)
                out.append((normalize_host(host), port))
    if len({ip_family(host) for host, _ in out}) != len(out):
        raise ValueError(
            f"{flag} takes one address per IP family (a wildcard covers every address of its "
            f"family); got {', '.join(format_hostport(a) for a in out)}"
        )
    return out


def config_from_args(args: argparse.Namespace) -> RelayConfig:
    if not args.route_keys:
        raise SystemExit("firsthop relay: --route-keys (or FIRSTHOP_ROUTE_KEYS) is required")
    try:
        keys = parse_route_keys(args.route_keys)
        refuse_published("relay", route_keys=keys.values())
        peers: dict[int, Address] = {}
        for item in args.peer:
            cluster, sep, addr = item.partition("=")
            if not sep:
                raise ValueError(f"--peer {item!r} is not CLUSTER=HOST:PORT")
            peers[int(cluster)] = parse_hostport(addr)
        datapath_in_use(args.datapath)  # (another word, or c when it was not built: refused)
        listen = per_family(args.listen, "--listen")
        if not listen:
            raise ValueError("--listen needs an address")
        listen_tcp = per_family(args.listen_tcp, "--listen-tcp")
        public = per_family(args.public, "--public")
        families = {ip_family(a[0]) for a in listen}
        for addr in public:
            if ip_family(addr[0]) not in families:
                raise ValueError(f"--public {addr[0]} has no --listen of its IP family")
        config = RelayConfig(
            listen=listen[0],
            listen_other=listen[1] if len(listen) > 1 else None,
            listen_tcp=listen_tcp[0] if listen_tcp else None,
            listen_tcp_other=listen_tcp[1] if len(listen_tcp) > 1 else None,
            internal=hostport_arg(args.internal),
            public=public[0] if public else None,
            public_other=public[1] if len(public) > 1 else None,
            metrics=hostport_arg(args.metrics),
            cluster=args.cluster,
            keys=keys,
            allow_dest=parse_cidrs(args.allow_dest),
            peers=peers,
            redis=args.redis or None,
            workers=max(1, args.workers),
            standby=not args.no_standby,
            pin_cpus=not args.no_pin,
            datapath=args.datapath,
            limits=RelayLimits(
                max_flows=args.max_flows,
                token_max_age=args.token_max_age,
                **{name: getattr(args, name) for name in TCP_LIMITS},
            ),
        )
    except (ValueError, argparse.ArgumentTypeError) as exc:
        raise SystemExit(f"firsthop relay: {exc}") from exc
    if config.cluster in config.peers:
        raise SystemExit("firsthop relay: --peer names this relay's own cluster")
    return config
