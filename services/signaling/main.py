"""`firsthop signaling`: wire the pieces together and serve them on Hypercorn's Trio worker.

`serve_signaling` owns every resource for its lifetime — the pooled httpx client for the
transceivers' internal API, the Redis link — and reports the bound address through
`task_status` (``--listen`` may name port 0).
"""

from __future__ import annotations

import argparse
import logging
import os
import ssl
from functools import partial

import httpx
import trio
from hypercorn.trio import serve

from firsthop.services.signaling.app import create_app
from firsthop.services.signaling.auth import (
    ApiKeys,
    Authenticator,
    ClientSecrets,
    derive_secret_key,
)
from firsthop.services.signaling.bodies import Bodies
from firsthop.services.signaling.calls import Calls, Stats
from firsthop.services.signaling.client_address import ClientAddresses
from firsthop.services.signaling.config import SignalingConfig, config_from_args, register_flags
from firsthop.services.signaling.context import Context
from firsthop.services.signaling.placement import RegionTable
from firsthop.services.signaling.ratelimit import ClientLimiter, RateLimiter, Slots
from firsthop.services.signaling.sip import WEBHOOK_CONNECTIONS, SipConfig, SipFront
from firsthop.services.signaling.sip_calls import SipCalls
from firsthop.services.signaling.stores import (
    CallStore,
    Directory,
    EkSessions,
    RecordingIndex,
    RedisLink,
    SecretLedger,
)
from firsthop.services.signaling.transceivers import RECORDING_DOWNLOADS, TransceiverClient
from firsthop.services.signaling.ws import MAX_MESSAGE
from firsthop.services.sip.uas import Trunk
from firsthop.shared.address import Address, format_hostport
from firsthop.shared.http import bound_address, hypercorn_config
from firsthop.shared.lifecycle import (
    address_clash_is_one_line,
    announce,
    run_until_signal,
    setup_logging,
)
from firsthop.shared.telemetry import setup_tracing, shutdown_tracing

log = logging.getLogger("firsthop.signaling")


def secret_key_for(config: SignalingConfig) -> bytes:
    if config.secret_key is not None:
        return config.secret_key
    derived = derive_secret_key(config.api_keys)
    if derived is not None:
        return derived
    if config.redis:
        log.warning(
            "no API keys and no --secret-key: client secrets are signed with a per-process "
            "key, so other replicas will not accept them"
        )
    return os.urandom(32)


def build_context(
    config: SignalingConfig,
    http: httpx.AsyncClient,
    link: RedisLink | None,
    stats: Stats,
    downloads: httpx.AsyncClient | None = None,
) -> Context:
    calls = Calls(
        own_region=config.region,
        ingress=config.ingress,
        ingress_tcp=config.ingress_tcp,
        regions=RegionTable(config.region_cidrs),
        agents=config.agents,
        directory=Directory(config.transceivers, link),
        store=CallStore(link),
        recordings=RecordingIndex(link),
        ledger=SecretLedger(link),
        client=TransceiverClient(http, config.internal_token, downloads),
        stats=stats,
    )
    auth = Authenticator(
        ApiKeys(config.api_keys),
        ClientSecrets(secret_key_for(config), config.secret_ttl),
        dev=config.dev,
    )
    return Context(
        config=config,
        auth=auth,
        calls=calls,
        ip_limiter=ClientLimiter(config.ip_limit),
        key_limiter=RateLimiter(config.key_limit),
        stats=stats,
        bodies=Bodies(
            Slots(config.max_uploads, config.max_uploads_per_ip),
            config.body_timeout,
            stats.counters,
        ),
        clients=ClientAddresses(config.trusted_proxies),
        phones=SipCalls(link),
        ek_sessions=EkSessions(
            link,
            max_live=config.max_ephemeral_keys,
            max_bytes=config.max_ephemeral_key_bytes,
            max_live_dev=config.max_dev_ephemeral_keys,
        ),
    )


def sip_config(config: SignalingConfig) -> SipConfig:
    assert config.sip_listen is not None
    return SipConfig(
        listen=config.sip_listen,
        public=config.sip_public,
        trunks=[
            Trunk.of(name, cidrs, config.sip_trunk_auth.get(name), config.sip_trunk_login.get(name))
            for name, cidrs in config.sip_trunks.items()
        ],
        record=config.sip_record,
        poll_interval=config.call_poll_interval,
        lost_after=config.call_lost_after,
        tls_listen=config.sip_tls_listen,
        tls=sip_tls(config),
        webhook=config.sip_webhook,
        webhook_secret=config.sip_webhook_secret,
        auth_algorithms=config.sip_auth_algorithms,
    )


def sip_tls(config: SignalingConfig) -> ssl.SSLContext | None:
    """The server context of SIP over TLS: our certificate; TLS 1.2 at least."""
    if config.sip_tls_listen is None or not config.sip_tls_cert or not config.sip_tls_key:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.sip_tls_cert, config.sip_tls_key)
    return context


def _warn_about(config: SignalingConfig) -> None:
    if not config.api_keys and not config.dev:
        log.warning("no API keys configured: every call will be refused (401)")
    if config.region not in config.ingress:
        log.warning("no --ingress for own region %r: calls placed there will fail", config.region)
    if not config.redis and not config.transceivers:
        log.warning("no --redis and no --transceiver: no call can be placed (503)")


async def serve_signaling(
    config: SignalingConfig, *, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve the public API until cancelled; reports the bound (host, port)."""
    _warn_about(config)
    stats = Stats()
    link = RedisLink(config.redis, stats.counters) if config.redis else None
    try:
        limits = httpx.Limits(max_connections=512, max_keepalive_connections=64)
        streams = httpx.Limits(max_connections=RECORDING_DOWNLOADS, max_keepalive_connections=4)
        hooks = httpx.Limits(max_connections=WEBHOOK_CONNECTIONS, max_keepalive_connections=8)
        async with (
            httpx.AsyncClient(limits=limits, trust_env=False) as http,
            httpx.AsyncClient(limits=streams, trust_env=False) as downloads,
            httpx.AsyncClient(limits=hooks, trust_env=False) as webhooks,
        ):
            context = build_context(config, http, link, stats, downloads)
            app = create_app(context)
            hc = hypercorn_config(config.listen)
            hc.websocket_max_message_size = MAX_MESSAGE + 1024  # /v1/ws and the sideband
            async with trio.open_nursery() as nursery:
                binds = await nursery.start(partial(serve, app, hc))
                addr = bound_address(binds)
                sip_addr = None
                if config.sip_listen is not None:
                    front = SipFront(context.calls, sip_config(config), context.phones, webhooks)
                    sip_addr = await nursery.start(front.serve)
                log.info(
                    "signaling (region %s) on %s; transceivers from %s",
                    config.region,
                    format_hostport(addr),
                    "Redis" if config.redis else f"{len(config.transceivers)} static URL(s)",
                )
                announce(listen=addr, **({"sip": sip_addr} if sip_addr else {}))
                task_status.started(addr)
    finally:
        if link is not None:
            link.close()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], help: str) -> None:
    p = sub.add_parser(
        "signaling",
        help=help,
        description="Authenticates callers, picks a region and a transceiver, and returns "
        "the transceiver's answer (WHIP-compatible POST /v1/calls, and /v1/ws).",
    )
    register_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    setup_logging("signaling")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request
    setup_tracing("signaling")
    try:
        claims = [("tcp", config.listen)] + (
            [("udp", config.sip_listen)] if config.sip_listen else []
        )
        with address_clash_is_one_line("signaling", claims):
            trio.run(run_until_signal, serve_signaling, config)
    finally:
        shutdown_tracing()
    return 0
