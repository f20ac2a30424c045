"""`firsthop transceiver`: flags, and the process (asyncio host loop, Trio guest)."""

from __future__ import annotations

import argparse
import logging
import os
import signal

import trio

from firsthop.services.transceiver.api import create_app
from firsthop.services.transceiver.media import opus
from firsthop.services.transceiver.recordings import RecordingError
from firsthop.services.transceiver.registry import FlowPins, heartbeat, trace_handoff_writer
from firsthop.services.transceiver.rtc import check_pinned_versions, run_trio_guest
from firsthop.services.transceiver.service import Transceiver, TransceiverConfig
from firsthop.shared import memory
from firsthop.shared.address import format_hostport, is_loopback
from firsthop.shared.config import add_option, hostport_arg, parse_cidrs, refuse_published
from firsthop.shared.http import bound_address, hypercorn_config
from firsthop.shared.lifecycle import address_clash_is_one_line, announce, setup_logging
from firsthop.shared.redis_store import TransceiverInfo
from firsthop.shared.telemetry import setup_tracing, shutdown_tracing
from firsthop.shared.wire import g711
from firsthop.shared.wire.route_token import parse_route_keys

log = logging.getLogger("firsthop.transceiver")
MAX_GATHER = 0.02  # seconds: --gather-ms at most one 20 ms frame


async def serve_transceiver(
    config: TransceiverConfig,
    *,
    task_status: trio.TaskStatus[tuple[Transceiver, tuple[str, int]]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Media socket, internal API and registry heartbeat; SIGTERM drains, then exits."""
    from hypercorn.trio import serve

    g711.prepare()  # the agent bridges' telephony codecs, built before any call needs them
    opus.prepare()  # libopus found and loaded now: a missing one fails the start, not calls
    try:
        tx = Transceiver(config)
    except (RecordingError, OSError) as exc:
        raise SystemExit(f"firsthop transceiver: --record-dir: {exc}") from exc
    if not config.internal_token:
        log.warning("--dev: no internal token, /internal/ is open to anything on loopback")
    async with trio.open_nursery() as nursery:
        media = await nursery.start(tx.serve)
        app = create_app(tx)
        binds = await nursery.start(
            lambda task_status: serve(app, hypercorn_config(config.api), task_status=task_status)
        )
        api = bound_address(binds)
        if config.redis:
            # A wildcard --api is reached at the advertised media host (the pod IP).
            host = config.api[0] if config.api[0] not in ("0.0.0.0", "::") else config.advertised[0]

            def info() -> TransceiverInfo:
                return TransceiverInfo(
                    id=config.id,
                    api_url=f"http://{format_hostport((host, api[1]))}",
                    region=config.region,
                    cluster=config.cluster,
                    media_addr=format_hostport(config.advertised),
                    sessions=len(tx.table),
                    capacity=config.capacity,
                    draining=tx.draining,
                    records=tx.recordings is not None,
                    records_rtp=tx.recordings is not None,
                )

            await nursery.start(heartbeat, config.redis, config.id, info, tx.counters)
            send, receive = trio.open_memory_channel[tuple[str, str]](1000)
            tx.trace_writes = send
            nursery.start_soon(trace_handoff_writer, config.redis, receive, tx.counters)
            tx.flow_pins = FlowPins(config.redis, tx.counters)
            nursery.start_soon(tx.flow_pins.keep)
        tx.ready = True  # (registered, with Redis): /healthz says so from now on
        log.info(
            "transceiver %s (region %s, cluster %d): media %s advertised as %s, api %s",
            config.id,
            config.region,
            config.cluster,
            format_hostport(media),
            format_hostport(config.advertised),
            format_hostport(api),
        )
        announce(media=media, api=api)
        task_status.started((tx, api))


async def _process(config: TransceiverConfig) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            tx, _ = await nursery.start(serve_transceiver, config)
            log.info("%d objects of the start frozen", memory.freeze_startup())
            terms = 0
            async for signum in signals:
                if signum == signal.SIGINT:
                    break
                terms += 1
                if terms > 1:  # a second SIGTERM: stop now
                    break
                # SIGTERM drains (also when a preStop hook already asked for it through the
                # API: then this just waits for that drain to end), then exits.
                log.info("SIGTERM: draining (up to %.0fs)", config.drain_seconds)
                nursery.start_soon(_drain_then_stop, tx, config.drain_seconds, nursery)
            nursery.cancel_scope.cancel()


async def _drain_then_stop(tx: Transceiver, deadline: float, nursery: trio.Nursery) -> None:
    await tx.drain(deadline)
    await tx.end_reasons_read()  # the API stays up until signaling knows why calls ended
    nursery.cancel_scope.cancel()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], help: str) -> None:
    p = sub.add_parser("transceiver", help=help)
    add_option(
        p, "--media", default="0.0.0.0:5004", help="shared media UDP socket", metavar="HOST:PORT"
    )
    add_option(
        p,
        "--api",
        default="0.0.0.0:8081",
        help="internal API, /metrics, /healthz",
        metavar="HOST:PORT",
    )
    add_option(p, "--id", default=os.uname().nodename, help="transceiver id in the registry")
    add_option(p, "--region", default="local", help="region this transceiver serves")
    add_option(p, "--cluster", default=1, type=int, help="cluster id written into route tokens")
    add_option(p, "--route-keys", default=None, help="ID=BASE64,... HMAC keys for route tokens")
    add_option(p, "--route-key-id", default=1, type=int, help="key id used to sign")
    add_option(p, "--redis", default=None, help="redis://host:port/db for the registry")
    add_option(
        p,
        "--agent-url",
        default=None,
        help="the default agent: ws://host:port (native), realtime+ws(s)://host:port/path (a "
        "Realtime backend) or twilio+ws(s)://host:port/path (a Media Streams bot)",
    )
    add_option(
        p,
        "--realtime-api-key",
        default=None,
        help="sent as Authorization: Bearer KEY to realtime+ws(s):// backends",
    )
    add_option(
        p,
        "--agent-ca-file",
        default=None,
        help="PEM CAs that wss:// agents' certificates must chain to (default: the system's)",
        metavar="PATH",
    )
    add_option(
        p,
        "--advertise-media",
        default=None,
        help="media address relays send to (in route tokens; default --media)",
        metavar="HOST:PORT",
    )
    add_option(p, "--accept-direct", action="store_true", help="also accept unframed clients")
    add_option(p, "--capacity", default=200, type=int, help="most concurrent sessions")
    add_option(
        p,
        "--deny-candidate-cidr",
        default="10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,100.64.0.0/10,fc00::/7",
        help="caller candidate ranges refused (loopback, link-local, multicast and "
        "unspecified always are)",
        metavar="CIDR,...",
    )
    add_option(
        p,
        "--internal-token",
        default=None,
        help="bearer token required on /internal/ (required unless --dev)",
    )
    add_option(
        p,
        "--dev",
        action="store_true",
        help="allow no --internal-token (an open /internal/); loopback --api only",
    )
    add_option(p, "--drain-seconds", default=3600.0, type=float, help="SIGTERM grace for calls")
    add_option(
        p,
        "--consent-timeout",
        default=30.0,
        type=float,
        help="a call with no authenticated ICE check for this long ends (RFC 7675: 30 s)",
    )
    add_option(
        p,
        "--record-dir",
        default=None,
        help="write the recordings calls ask for here (off if unset)",
        metavar="DIR",
    )
    add_option(
        p, "--record-keep-hours", default=24.0, type=float, help="a recording is kept this long"
    )
    add_option(
        p,
        "--record-max-gb",
        default=10.0,
        type=float,
        help="all recordings together; past it the oldest go",
    )
    add_option(
        p,
        "--gather-ms",
        default=TransceiverConfig.gather * 1000,
        type=float,
        help="a busy loop (many calls) lets its next batch of datagrams and agent frames "
        "gather this long at most: less CPU a call, that much more latency (0: never)",
    )
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> TransceiverConfig:
    if not args.route_keys:
        raise SystemExit("firsthop transceiver: --route-keys (or FIRSTHOP_ROUTE_KEYS) is required")
    try:
        keys = parse_route_keys(args.route_keys)
        media = hostport_arg(args.media)
        advertise = hostport_arg(args.advertise_media) if args.advertise_media else None
        config = TransceiverConfig(
            media=media,
            api=hostport_arg(args.api),
            id=args.id,
            region=args.region,
            cluster=args.cluster,
            keys=keys,
            key_id=args.route_key_id,
            redis=args.redis or None,
            agent_url=args.agent_url or None,
            advertise_media=advertise,
            accept_direct=args.accept_direct,
            capacity=args.capacity,
            deny_candidate_cidr=parse_cidrs(args.deny_candidate_cidr),
            internal_token=args.internal_token or None,
            drain_seconds=args.drain_seconds,
            consent_timeout=args.consent_timeout,
            realtime_api_key=args.realtime_api_key or None,
            agent_ca_file=args.agent_ca_file or None,
            record_dir=args.record_dir or None,
            record_keep=args.record_keep_hours * 3600,
            record_max_bytes=int(args.record_max_gb * (1 << 30)),
            gather=args.gather_ms / 1000,
        )
    except (ValueError, argparse.ArgumentTypeError) as exc:
        raise SystemExit(f"firsthop transceiver: {exc}") from exc
    if not 0 <= config.gather <= MAX_GATHER:
        raise SystemExit(
            f"firsthop transceiver: --gather-ms must be 0-{MAX_GATHER * 1000:.0f} (a frame), "
            f"got {args.gather_ms}"
        )
    if config.key_id not in config.keys:
        raise SystemExit(f"firsthop transceiver: --route-key-id {config.key_id} is not a key")
    _check_token(config.internal_token, dev=args.dev, api_host=config.api[0])
    refuse_published(
        "transceiver", internal_token=config.internal_token, route_keys=config.keys.values()
    )
    if advertise is None and media[0] in ("0.0.0.0", "::"):
        raise SystemExit(
            "firsthop transceiver: --media binds a wildcard address; give --advertise-media "
            "(the address relays reach this socket at, e.g. the pod IP)"
        )
    return config


def _check_token(token: str | None, *, dev: bool, api_host: str) -> None:
    """/internal/ creates sessions, and a session opens a WebSocket to the `agent_url` the
    request names: an open API lets anyone who reaches it make this process connect anywhere
    (SSRF). So a token is required; only --dev on a loopback --api may go without."""
    if dev and not is_loopback(api_host):
        raise SystemExit(
            "firsthop transceiver: --dev leaves /internal/ open; it is only allowed when "
            "--api is a loopback address"
        )
    if not token and not dev:
        raise SystemExit(
            "firsthop transceiver: --internal-token (FIRSTHOP_INTERNAL_TOKEN) is missing or "
            "empty: without it anyone who reaches --api can create sessions and make this "
            "process open a WebSocket to any agent_url. Set the token signaling sends (its "
            "--internal-token), or give --dev on a loopback --api for local tests"
        )


def run(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    check_pinned_versions()
    setup_logging(f"transceiver[{config.id}]")
    setup_tracing("transceiver")
    try:
        with address_clash_is_one_line("transceiver", [("udp", config.media), ("tcp", config.api)]):
            run_trio_guest(lambda: _process(config), gather=config.gather)
    finally:
        shutdown_tracing()
    return 0
