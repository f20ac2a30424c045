"""`firsthop up`: the whole local stack on loopback, in one Trio nursery.

It runs: a Redis (when a `redis-server` binary is found and `--redis` is not given;
otherwise in-memory), one relay (UDP, and ICE-TCP for callers whose UDP is blocked: the
answers offer both), two transceivers, the agents (echo, parrot, and the offline
assistant behind the Realtime bridge, the default for Realtime calls) and signaling with the
demo page (in --dev mode: it hands the page client secrets on loopback). Each
service is the real `firsthop <service>` process with its log lines prefixed; Ctrl-C (or
SIGTERM) stops them all and waits for them.
Route keys and the internal API token (signaling -> transceivers) are generated per run
unless FIRSTHOP_ROUTE_KEYS / FIRSTHOP_INTERNAL_TOKEN are set.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import trio

from firsthop.services.launch import (
    Spec,
    agent_command,
    free_port,
    ready,
    redis_command,
    relay_command,
    signaling_command,
    transceiver_command,
)
from firsthop.shared.claim import in_use
from firsthop.shared.config import add_option
from firsthop.shared.wire.route_token import KEY_LENGTH, format_route_keys

STOP_GRACE = 6.0
READY_TIMEOUT = 30.0


async def _wait_ready(spec: Spec, proc: trio.Process) -> None:
    with trio.fail_after(READY_TIMEOUT):
        while not await trio.to_thread.run_sync(ready, spec):
            if proc.returncode is not None:
                raise UpFailed(
                    f"{spec.name} exited with {proc.returncode} (its lines above say why)"
                )
            await trio.sleep(0.05)


async def _pump(name: str, stream: trio.abc.ReceiveStream) -> None:
    buffered = b""
    async for chunk in stream:
        buffered += chunk
        *lines, buffered = buffered.split(b"\n")
        for line in lines:
            print(f"{name:>12} | {line.decode(errors='replace')}", flush=True)


async def _run_service(service: Spec, *, task_status: trio.TaskStatus[None]) -> None:
    env = {**os.environ, **service.env}
    proc = await trio.lowlevel.open_process(
        service.argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        async with trio.open_nursery() as nursery:
            assert proc.stdout is not None
            nursery.start_soon(_pump, service.name, proc.stdout)
            await _wait_ready(service, proc)
            task_status.started()
            code = await proc.wait()
            raise UpFailed(f"{service.name} exited with {code}")
    finally:
        with trio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                with trio.move_on_after(STOP_GRACE):
                    await proc.wait()
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()


def plan(args: argparse.Namespace) -> tuple[list[Spec], dict[str, str]]:
    """The services to start and what to tell the user."""
    keys = os.environ.get("FIRSTHOP_ROUTE_KEYS") or format_route_keys({1: os.urandom(KEY_LENGTH)})
    token = os.environ.get("FIRSTHOP_INTERNAL_TOKEN") or secrets.token_urlsafe(32)
    env = {"FIRSTHOP_ROUTE_KEYS": keys, "FIRSTHOP_INTERNAL_TOKEN": token}
    services: list[Spec] = []
    redis_url = args.redis
    redis_bin = shutil.which("redis-server")
    if redis_url is None and redis_bin is not None:
        port = free_port(socket.SOCK_STREAM)
        redis_url = f"redis://127.0.0.1:{port}/0"
        services.append(Spec("redis", redis_command(port), ready_tcp=port))
    relay_tcp_port = args.relay_port if args.relay_tcp_port is None else args.relay_tcp_port
    relay = relay_command(
        listen=args.relay_port,
        internal=0,  # only peer relays use it: any port
        metrics=args.relay_metrics_port,
        redis=redis_url,
        extra=("--listen-tcp", f"127.0.0.1:{relay_tcp_port}"),
    )
    relay_ready = f"http://127.0.0.1:{args.relay_metrics_port}/healthz"
    services.append(Spec("relay", relay, env, ready_http=relay_ready))
    agents: dict[str, str] = {}
    for kind in ("echo", "parrot", "assistant"):
        port = free_port(socket.SOCK_STREAM)
        spec = Spec(f"agent-{kind}", agent_command(kind, port), ready_tcp=port)
        agents[kind] = f"ws://127.0.0.1:{port}"
        if kind == "assistant":  # it speaks the Realtime protocol: the transceivers bridge to it
            agents[kind] = f"realtime+ws://127.0.0.1:{port}/v1/realtime"
            spec.ready_http = f"http://127.0.0.1:{port}/healthz"  # once its models are loaded
        services.append(spec)
    transceivers: list[str] = []
    for i in (1, 2):
        media, api = free_port(), free_port(socket.SOCK_STREAM)
        tx = transceiver_command(
            media=media,
            api=api,
            tx_id=f"tx-{i}",
            agent_url=agents["echo"],
            redis=redis_url,
            extra=(
                *("--region", "local", "--drain-seconds", "5"),
                *("--record-dir", os.path.join(args.record_dir, f"tx-{i}")),  # one each
            ),
        )
        transceivers.append(f"http://127.0.0.1:{api}")
        tx_env = {**env, "FIRSTHOP_ROUTE_KEY_ID": "1"}
        services.append(Spec(f"tx-{i}", tx, tx_env, ready_http=f"http://127.0.0.1:{api}/healthz"))
    api_key = os.environ.get("FIRSTHOP_API_KEYS", "").split(",")[
        0
    ] or "dev-" + secrets.token_urlsafe(16)
    sig_args = [
        *("--region", "local"),
        *("--ingress", f"local=127.0.0.1:{args.relay_port}"),
        *("--ingress-tcp", f"local=127.0.0.1:{relay_tcp_port}"),
        *("--api-keys", api_key),
        "--dev",
        *(arg for kind, url in agents.items() for arg in ("--agent-url", f"{kind}={url}")),
        # an OpenAI Realtime app names OpenAI's models: those calls go to the assistant
        *("--default-agent", "assistant"),
    ]
    sip_port = args.sip_port if redis_url else 0  # (a phone call's relay flow is in Redis)
    if sip_port:
        sig_args += ["--sip-listen", f"127.0.0.1:{sip_port}", "--sip-trunk", "local=127.0.0.0/8"]
    if redis_url:
        sig_args += ["--redis", redis_url]
    else:
        sig_args += [arg for url in transceivers for arg in ("--transceiver", url)]
    services.append(
        Spec(
            "signaling",
            signaling_command(port=args.port, extra=sig_args),
            {"FIRSTHOP_INTERNAL_TOKEN": token},
            ready_http=f"http://127.0.0.1:{args.port}/readyz",  # a call would be placed
        )
    )
    info = {
        "demo": f"http://127.0.0.1:{args.port}/",
        "dev API key": api_key,
        "try": f"firsthop call http://127.0.0.1:{args.port} --api-key {api_key}",
        "relay ingress": f"udp://127.0.0.1:{args.relay_port}",
        "relay ICE-TCP": f"tcp://127.0.0.1:{relay_tcp_port}",
        "relay metrics": f"http://127.0.0.1:{args.relay_metrics_port}/metrics",
        "transceivers": " ".join(transceivers),
        "agents": " ".join(f"{k}={v}" for k, v in agents.items()),
        "redis": redis_url or "none (in-memory)",
        "recordings": f"{args.record_dir} (calls placed with ?record=true)",
        "phone (SIP)": " ".join(f"sip:{kind}@127.0.0.1:{sip_port}" for kind in agents)
        if sip_port
        else "off (--sip-port 0, or no Redis)",
    }
    return services, info


class UpFailed(Exception):
    """What stops `firsthop up`, in one line for the user."""


def check_ports(args: argparse.Namespace) -> None:
    """The fixed ports `up` serves must be free before anything starts: a second stack on
    the same ones would fail half way (or, for a SO_REUSEPORT relay of another tool, share)."""
    tcp = args.relay_port if args.relay_tcp_port is None else args.relay_tcp_port
    wanted = [
        ("tcp", args.port, "--port"),
        ("udp", args.relay_port, "--relay-port"),
        ("tcp", tcp, "--relay-tcp-port"),
        ("tcp", args.relay_metrics_port, "--relay-metrics-port"),
        *([("udp", args.sip_port, "--sip-port")] if args.sip_port else []),
    ]
    taken = [(k, p, flag) for k, p, flag in wanted if in_use(k, ("127.0.0.1", p))]
    if taken:
        where = ", ".join(f"127.0.0.1:{p} ({k})" for k, p, _ in taken)
        flags = " ".join(sorted({flag for _, _, flag in taken}))
        raise UpFailed(
            f"{where} already in use (another firsthop up?): stop it, or choose other ports "
            f"with {flags}"
        )


async def serve_up(args: argparse.Namespace, *, task_status: trio.TaskStatus[None]) -> None:
    check_ports(args)
    services, info = plan(args)
    async with trio.open_nursery() as nursery:
        for service in services:
            await nursery.start(_run_service, service)
        print("firsthop is up:", flush=True)
        for key, value in info.items():
            print(f"  {key:<14} {value}", flush=True)
        print("  Ctrl-C stops everything.", flush=True)
        task_status.started()


def run(args: argparse.Namespace) -> int:
    from firsthop.shared.lifecycle import first_exception, run_until_signal, setup_logging

    setup_logging("up")
    try:
        trio.run(run_until_signal, serve_up, args)
    except BaseException as exc:
        failed = first_exception(exc, lambda e: isinstance(e, UpFailed))
        if failed is None:
            raise
        print(f"firsthop up: {failed}", file=sys.stderr, flush=True)
        return 1
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], help: str) -> None:
    p = sub.add_parser("up", help=help)
    add_option(p, "--redis", default=None, help="use this Redis instead of starting one")
    add_option(p, "--port", default=8080, type=int, help="signaling HTTP port (the demo page)")
    add_option(p, "--relay-port", default=3478, type=int, help="relay ingress UDP port")
    add_option(
        p,
        "--relay-tcp-port",
        default=None,
        type=int,
        help="relay ICE-TCP ingress port (default: the --relay-port number, on TCP)",
    )
    add_option(p, "--relay-metrics-port", default=9478, type=int, help="relay /metrics port")
    add_option(
        p,
        "--sip-port",
        default=5060,
        type=int,
        help="SIP (UDP) for phone calls from loopback: sip:AGENT@127.0.0.1:PORT (0: off; "
        "needs Redis)",
    )
    add_option(
        p,
        "--record-dir",
        default=os.path.join(tempfile.gettempdir(), "firsthop-recordings"),
        help="where the transceivers keep the recordings calls ask for",
        metavar="DIR",
    )
    p.set_defaults(func=run)
