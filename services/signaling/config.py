"""`firsthop signaling` flags (each with its FIRSTHOP_* twin) -> SignalingConfig.

Repeatable flags take one item per use, or a comma-separated list from the environment:
``--ingress REGION=HOST:PORT`` (a bare ``HOST:PORT`` means the own region; likewise
``--ingress-tcp``, a relay's ICE-TCP port, advertised as a ``tcptype passive`` candidate),
``--transceiver [REGION=]URL``, ``--region-cidr CIDR=REGION``, ``--agent-url KIND=URL``,
``--cors-origin ORIGIN``, ``--trusted-proxy CIDR``. ``--dev`` is refused unless ``--listen`` is
a loopback address.
An agent URL is ``ws://``/``wss://`` (our agent protocol), ``realtime+ws://``/
``realtime+wss://`` (a Realtime backend: the transceiver bridges to it) or ``twilio+ws://``/
``twilio+wss://`` (a Twilio Media Streams bot: the transceiver dials it as Twilio would).
``--default-agent NAME`` (a configured ``--agent-url`` NAME) serves /v1/realtime calls whose
model names no agent.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from firsthop.services.signaling.client_address import ClientAddresses
from firsthop.services.signaling.placement import REGION_NAME, RegionTable
from firsthop.services.signaling.ratelimit import RateLimit
from firsthop.services.signaling.stores import EK_MAX_BYTES, EK_MAX_LIVE, EK_MAX_LIVE_DEV
from firsthop.services.sip.trunk_auth import ALGORITHMS, OFFERED, TrunkAuth, TrunkSecret
from firsthop.shared.address import (
    Address,
    format_hostport,
    is_loopback,
    normalize_host,
    parse_hostport,
)
from firsthop.shared.agent_url import PREFIXES
from firsthop.shared.config import add_option, hostport_arg, refuse_published
from firsthop.shared.redis_store import TransceiverInfo
from firsthop.shared.session_config import MAX_SESSION_BYTES

AGENT_SCHEMES = PREFIXES  # (their one owner: shared/agent_url.py)


@dataclass
class SignalingConfig:
    listen: Address = ("0.0.0.0", 8080)
    region: str = "local"
    redis: str | None = None
    transceivers: list[TransceiverInfo] = field(default_factory=list)
    ingress: dict[str, list[str]] = field(default_factory=dict)
    ingress_tcp: dict[str, list[str]] = field(default_factory=dict)  # ICE-TCP (RFC 6544)
    region_cidrs: list[tuple[str, str]] = field(default_factory=list)
    api_keys: list[str] = field(default_factory=list)
    cors_origins: list[str] = field(default_factory=list)
    trusted_proxies: list[str] = field(default_factory=list)  # CIDRs
    dev: bool = False
    agents: dict[str, str] = field(default_factory=dict)
    default_agent: str | None = None  # /v1/realtime calls whose model names no agent
    internal_token: str | None = None
    secret_ttl: float = 60.0
    secret_key: bytes | None = None
    ip_limit: RateLimit = field(default_factory=lambda: RateLimit(5.0, 20))
    key_limit: RateLimit = field(default_factory=lambda: RateLimit(20.0, 100))
    body_timeout: float = 5.0  # a request body (an SDP offer, <= 64 KiB) arrives within this
    max_uploads: int = 256  # requests still sending their body, in all ...
    max_uploads_per_ip: int = 16  # ... and from one client address
    max_ephemeral_keys: int = EK_MAX_LIVE  # live ek_ per API key
    max_ephemeral_key_bytes: int = EK_MAX_BYTES  # ... and their sessions' bytes
    max_dev_ephemeral_keys: int = EK_MAX_LIVE_DEV  # live ek_ of the keyless dev route
    ws_auth_timeout: float = 10.0
    ws_idle_timeout: float = 60.0
    call_poll_interval: float = 1.0  # WS call watcher: one cheap probe per call per second
    call_lost_after: float = 5.0  # transceiver unreachable this long: the call is gone
    sip_listen: Address | None = None  # SIP over UDP (`sip.py`): off unless given
    sip_public: Address | None = None  # our Contact's host:port (default: the bound one)
    sip_trunks: dict[str, list[str]] = field(default_factory=dict)  # name -> CIDRs
    sip_record: frozenset[str] = frozenset()  # trunks whose every call is recorded
    sip_trunk_auth: dict[str, TrunkSecret] = field(default_factory=dict)  # Digest, by trunk
    sip_trunk_login: dict[str, TrunkSecret] = field(default_factory=dict)  # ours, to a trunk
    sip_auth_algorithms: tuple[str, ...] = OFFERED  # the challenges, preferred first
    sip_tls_listen: Address | None = None  # SIP over TLS, with the two below
    sip_tls_cert: str | None = None  # PEM certificate chain
    sip_tls_key: str | None = None  # PEM private key
    sip_webhook: str | None = None  # OpenAI's SIP flow: `realtime.call.incoming` goes here
    sip_webhook_secret: str | None = None  # its Standard Webhooks signing secret


def register_flags(p: argparse.ArgumentParser) -> None:
    add_option(p, "--listen", default="0.0.0.0:8080", help="HTTP + WebSocket", metavar="HOST:PORT")
    add_option(p, "--region", default="local", help="this signaling server's own region")
    add_option(p, "--redis", default=None, help="redis://host:port/db: registry and call map")
    add_option(
        p,
        "--transceiver",
        action="append",
        help="[REGION=]URL of a transceiver internal API (static list, used without Redis)",
        metavar="[REGION=]URL",
    )
    add_option(
        p,
        "--ingress",
        action="append",
        help="relay ingress a region advertises (repeat for several)",
        metavar="REGION=HOST:PORT",
    )
    add_option(
        p,
        "--ingress-tcp",
        action="append",
        help="relay ICE-TCP ingress a region advertises as a 'tcptype passive' candidate, "
        "below the UDP one (for callers whose UDP is blocked; repeat for several)",
        metavar="REGION=HOST:PORT",
    )
    add_option(
        p, "--region-cidr", action="append", help="client IP range -> region", metavar="CIDR=REGION"
    )
    add_option(p, "--api-keys", default="", help="comma-separated API keys", metavar="KEY,...")
    add_option(p, "--api-keys-file", default=None, help="file with one API key per line")
    add_option(
        p, "--cors-origin", action="append", help="browser origin allowed (or *)", metavar="ORIGIN"
    )
    add_option(
        p,
        "--trusted-proxy",
        action="append",
        help="a proxy (an ingress controller) whose X-Forwarded-For names the client",
        metavar="CIDR",
    )
    add_option(
        p,
        "--dev",
        action="store_true",
        help="serve /v1/dev/secret (a client secret with no key); loopback --listen only",
    )
    add_option(
        p,
        "--agent-url",
        action="append",
        help="agent=KIND query -> URL: ws(s):// (native), realtime+ws(s):// (a Realtime "
        "backend) or twilio+ws(s):// (a Twilio Media Streams bot)",
        metavar="KIND=URL",
    )
    add_option(
        p,
        "--default-agent",
        default=None,
        help="the --agent-url NAME that serves /v1/realtime calls whose session.model names "
        "no agent (default: none, the call is silent)",
        metavar="NAME",
    )
    add_option(p, "--internal-token", default=None, help="bearer token sent to transceivers")
    add_option(p, "--secret-ttl", default=60.0, type=float, help="client secret lifetime, s")
    add_option(
        p,
        "--secret-key",
        default=None,
        help="base64 key (>= 16 bytes) signing client secrets; default: derived from the API "
        "keys, so replicas sharing keys agree",
    )
    add_option(
        p,
        "--ip-rate",
        default=5.0,
        type=float,
        help="requests (POST, PATCH, DELETE, WebSockets) per second per IP",
    )
    add_option(p, "--ip-burst", default=20, type=int, help="burst allowed per IP")
    add_option(p, "--key-rate", default=20.0, type=float, help="calls+secrets per second per key")
    add_option(p, "--key-burst", default=100, type=int, help="burst allowed per key")
    add_option(
        p,
        "--body-timeout",
        default=5.0,
        type=float,
        help="a request body must arrive within this many seconds (else 408)",
    )
    add_option(
        p,
        "--max-uploads",
        default=256,
        type=int,
        help="requests still sending their body at once (beyond: 503)",
    )
    add_option(
        p,
        "--max-uploads-per-ip",
        default=16,
        type=int,
        help="requests still sending their body at once from one address (beyond: 429)",
    )
    add_option(
        p,
        "--max-ephemeral-keys",
        default=EK_MAX_LIVE,
        type=int,
        help="live Realtime ephemeral keys (ek_) per API key at once (beyond: 429)",
    )
    add_option(
        p,
        "--max-ephemeral-key-bytes",
        default=EK_MAX_BYTES,
        type=int,
        help="bytes of the session configs of an API key's live ephemeral keys (beyond: 429)",
    )
    add_option(
        p,
        "--max-dev-ephemeral-keys",
        default=EK_MAX_LIVE_DEV,
        type=int,
        help="live ephemeral keys minted by the keyless --dev route, in all (beyond: 429)",
    )
    add_option(
        p,
        "--sip-listen",
        default=None,
        help="answer phone calls from SIP trunks here (UDP); the Request-URI's user names "
        "the agent (sip:echo@host -> --agent-url echo=...)",
        metavar="HOST:PORT",
    )
    add_option(
        p,
        "--sip-public",
        default=None,
        help="the host:port trunks reach --sip-listen at, for our Contact (default: it)",
        metavar="HOST:PORT",
    )
    add_option(
        p,
        "--sip-trunk",
        action="append",
        help="a trunk allowed to call: its name and one source CIDR (repeat the name for "
        "more); any other source gets 403",
        metavar="NAME=CIDR",
    )
    add_option(
        p,
        "--sip-trunk-auth",
        action="append",
        help="a trunk's user name and password (a --sip-trunk name): each INVITE of its "
        "must answer a Digest challenge (RFC 3261 §22, SHA-256 or MD5) as well as come from "
        "its CIDRs; give it from the environment (FIRSTHOP_SIP_TRUNK_AUTH, comma-separated), "
        "not on a command line others can read",
        metavar="NAME=USER:PASSWORD",
    )
    add_option(
        p,
        "--sip-trunk-login",
        action="append",
        help="the user name and password our own requests to a trunk (a --sip-trunk name: "
        "BYE, REFER, UPDATE in its calls) answer its Digest challenges with (RFC 3261 §22.2, "
        "SHA-256 or MD5); from the environment (FIRSTHOP_SIP_TRUNK_LOGIN, comma-separated)",
        metavar="NAME=USER:PASSWORD",
    )
    add_option(
        p,
        "--sip-auth-algorithms",
        default=",".join(OFFERED),
        help="the Digest challenges a --sip-trunk-auth trunk gets, preferred first (of "
        f"{', '.join(ALGORITHMS)}; RFC 8760): SHA-256 only where every such trunk knows it (a "
        "user agent that knows only MD5 may fail the call on a SHA-256 challenge)",
        metavar="ALG[,ALG]",
    )
    add_option(
        p,
        "--sip-record",
        action="append",
        help="record every call from this trunk (a --sip-trunk name; repeat for more): the "
        "transceivers need --record-dir; with --sip-webhook the accepting key fetches the file, "
        "else no credential owns the call and the file is read from that directory",
        metavar="NAME",
    )
    add_option(
        p,
        "--sip-tls-listen",
        default=None,
        help="SIP over TLS here too (5061), with --sip-tls-cert and --sip-tls-key",
        metavar="HOST:PORT",
    )
    add_option(p, "--sip-tls-cert", default=None, help="PEM certificate (chain) for SIP over TLS")
    add_option(p, "--sip-tls-key", default=None, help="PEM private key for SIP over TLS")
    add_option(
        p,
        "--sip-webhook",
        default=None,
        help="OpenAI's SIP flow: post realtime.call.incoming here for each call and let the "
        "app accept, reject or refer it on /v1/realtime/calls/{id}/... (default: the "
        "Request-URI's user names the agent, answered at once)",
        metavar="URL",
    )
    add_option(
        p,
        "--sip-webhook-secret",
        default=None,
        help="the webhook's signing secret (whsec_<base64>, as OpenAI's; required with "
        "--sip-webhook)",
    )
    add_option(p, "--ws-auth-timeout", default=10.0, type=float, help="WebSocket auth deadline, s")
    add_option(
        p,
        "--ws-idle-timeout",
        default=60.0,
        type=float,
        help="WebSocket with no call and no message for this long is closed, s",
    )


def _pairs(items: list[str], what: str) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ValueError(f"{what} {item!r} is not KEY=VALUE")
        out.append((key.strip(), value.strip()))
    return out


def _trunk_secrets(
    items: list[str], trunks: Iterable[str], flag: str = "--sip-trunk-auth"
) -> dict[str, TrunkSecret]:
    """`flag NAME=USER:PASSWORD` items; an error never quotes one (it holds a password, or
    part of one: from the environment, a comma in a password splits it)."""
    out: dict[str, TrunkSecret] = {}
    for item in items:
        name, _, credentials = item.partition("=")
        username, _, password = credentials.partition(":")
        name = name.strip()
        if not name or not username or not password:
            raise ValueError(
                f"{flag}: an item is not NAME=USER:PASSWORD (from the environment, "
                "items are split at commas: a password may not hold one)"
            )
        if not (username + password).isprintable():
            raise ValueError(f"{flag}: a user name or password holds a control character")
        if name not in trunks:
            raise ValueError(f"{flag} names no --sip-trunk: {name[:64]!r}")
        if name in out:
            raise ValueError(f"{flag} names trunk {name!r} twice")
        out[name] = TrunkSecret(username, password)
    return out


def _region(name: str) -> str:
    if not REGION_NAME.match(name):
        raise ValueError(f"bad region name {name!r}")
    return name


def parse_transceivers(items: list[str], own_region: str) -> list[TransceiverInfo]:
    out = []
    for item in items:
        region, url = own_region, item.strip()
        if not url.startswith(("http://", "https://")):
            region, _, url = item.partition("=")
            region, url = _region(region.strip()), url.strip()
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--transceiver {item!r} is not [REGION=]http(s)://HOST:PORT")
        url = url.rstrip("/")
        out.append(TransceiverInfo(id=url, api_url=url, region=region))
    return out


def parse_ingress(items: list[str], own_region: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        region, sep, addr = item.rpartition("=")
        region = _region(region.strip()) if sep else own_region
        host, port = parse_hostport(addr)
        # (an IPv6 literal as ipaddress writes it: that is how the answer's candidate says it)
        out.setdefault(region, []).append(format_hostport((normalize_host(host), port)))
    return out


def read_api_keys(inline: str, path: str | None) -> list[str]:
    keys = [k.strip() for k in inline.split(",") if k.strip()]
    if path:
        for line in Path(path).read_text().splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                keys.append(line)
    return keys


def config_from_args(args: argparse.Namespace) -> SignalingConfig:
    try:
        listen = hostport_arg(args.listen)
        region = _region(args.region)
        agents = dict(_pairs(args.agent_url, "--agent-url"))
        for kind, url in agents.items():
            if not url.startswith(AGENT_SCHEMES):
                raise ValueError(
                    f"--agent-url {kind}={url!r} does not start with one of "
                    + ", ".join(AGENT_SCHEMES)
                )
        default_agent = (args.default_agent or "").strip() or None
        if default_agent is not None and default_agent not in agents:
            raise ValueError(f"--default-agent {default_agent!r} names no --agent-url")
        cidrs = _pairs(args.region_cidr, "--region-cidr")
        RegionTable(cidrs)  # validates
        secret_key = None
        if args.secret_key:
            secret_key = base64.b64decode(args.secret_key, validate=True)
            if len(secret_key) < 16:
                raise ValueError("--secret-key must decode to at least 16 bytes")
        origins = [o.strip() for item in args.cors_origin for o in item.split(",") if o.strip()]
        proxies = [c.strip() for item in args.trusted_proxy for c in item.split(",") if c.strip()]
        trunks: dict[str, list[str]] = {}
        for name, cidr in _pairs(args.sip_trunk, "--sip-trunk"):
            ipaddress.ip_network(cidr, strict=False)  # validates
            trunks.setdefault(name, []).append(cidr)
        trunk_auth = _trunk_secrets(args.sip_trunk_auth or [], trunks.keys())
        trunk_login = _trunk_secrets(args.sip_trunk_login or [], trunks.keys(), "--sip-trunk-login")
        algorithms = tuple(a.strip().upper() for a in args.sip_auth_algorithms.split(","))
        TrunkAuth(trunk_auth, algorithms=algorithms)  # validates (names; realms are tokens)
        recorded = frozenset(args.sip_record or ())
        if recorded - trunks.keys():
            unknown = sorted(recorded - trunks.keys())
            raise ValueError(f"--sip-record names no --sip-trunk: {', '.join(unknown)}")
        ClientAddresses(proxies)  # validates
        config = SignalingConfig(
            listen=listen,
            region=region,
            redis=args.redis or None,
            transceivers=parse_transceivers(args.transceiver, region),
            ingress=parse_ingress(args.ingress, region),
            ingress_tcp=parse_ingress(args.ingress_tcp, region),
            region_cidrs=cidrs,
            api_keys=read_api_keys(args.api_keys or "", args.api_keys_file),
            cors_origins=origins,
            trusted_proxies=proxies,
            dev=args.dev,
            agents=agents,
            default_agent=default_agent,
            internal_token=args.internal_token or None,
            secret_ttl=args.secret_ttl,
            secret_key=secret_key,
            ip_limit=RateLimit(args.ip_rate, args.ip_burst),
            key_limit=RateLimit(args.key_rate, args.key_burst),
            body_timeout=args.body_timeout,
            max_uploads=args.max_uploads,
            max_uploads_per_ip=args.max_uploads_per_ip,
            max_ephemeral_keys=args.max_ephemeral_keys,
            max_ephemeral_key_bytes=args.max_ephemeral_key_bytes,
            max_dev_ephemeral_keys=args.max_dev_ephemeral_keys,
            ws_auth_timeout=args.ws_auth_timeout,
            ws_idle_timeout=args.ws_idle_timeout,
            sip_listen=hostport_arg(args.sip_listen) if args.sip_listen else None,
            sip_public=hostport_arg(args.sip_public) if args.sip_public else None,
            sip_trunks=trunks,
            sip_record=recorded,
            sip_trunk_auth=trunk_auth,
            sip_trunk_login=trunk_login,
            sip_auth_algorithms=algorithms,
            sip_tls_listen=hostport_arg(args.sip_tls_listen) if args.sip_tls_listen else None,
            sip_tls_cert=args.sip_tls_cert or None,
            sip_tls_key=args.sip_tls_key or None,
            sip_webhook=args.sip_webhook or None,
            sip_webhook_secret=args.sip_webhook_secret or None,
        )
    except (ValueError, OSError, binascii.Error, argparse.ArgumentTypeError) as exc:
        raise SystemExit(f"firsthop signaling: {exc}") from exc
    refuse_published("signaling", api_keys=config.api_keys, internal_token=config.internal_token)
    if config.dev and not is_loopback(config.listen[0]):
        raise SystemExit(
            "firsthop signaling: --dev hands out client secrets with no key; it is only "
            "allowed when --listen is a loopback address"
        )
    if config.sip_tls_listen is not None and not (config.sip_tls_cert and config.sip_tls_key):
        raise SystemExit(
            "firsthop signaling: --sip-tls-listen needs --sip-tls-cert and --sip-tls-key"
        )
    if config.sip_webhook is not None:
        if not config.sip_webhook.startswith(("http://", "https://")):
            raise SystemExit("firsthop signaling: --sip-webhook must be an http(s):// URL")
        if not config.sip_webhook_secret:
            raise SystemExit("firsthop signaling: --sip-webhook needs --sip-webhook-secret")
    if config.secret_ttl <= 0:
        raise SystemExit("firsthop signaling: --secret-ttl must be positive")
    if config.body_timeout <= 0 or config.max_uploads < 0 or config.max_uploads_per_ip < 0:
        raise SystemExit(
            "firsthop signaling: --body-timeout must be positive, --max-uploads and "
            "--max-uploads-per-ip at least 0 (0: no limit)"
        )
    if min(config.max_ephemeral_keys, config.max_dev_ephemeral_keys) < 1:
        raise SystemExit(
            "firsthop signaling: --max-ephemeral-keys and --max-dev-ephemeral-keys must be at "
            "least 1"
        )
    if config.max_ephemeral_key_bytes < MAX_SESSION_BYTES:
        raise SystemExit(
            f"firsthop signaling: --max-ephemeral-key-bytes must be at least {MAX_SESSION_BYTES}"
        )
    return config
