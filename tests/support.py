"""Helpers shared by the tests: tokens, STUN packets, free ports, a real redis-server."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import random
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Self

from firsthop.services.launch import (
    Child,
    Spec,
    agent_command,
    free_port,
    redis_command,
    relay_command,
    signaling_command,
    transceiver_command,
)
from firsthop.shared.wire import stun
from firsthop.shared.wire.route_token import encode_route_token

INTERNAL_TOKEN = "test-internal-token"  # what test signaling sends and transceivers require
KEY1 = bytes(range(32))
KEY2 = bytes(range(50, 82))
KEYS = {1: KEY1, 2: KEY2}


def mint(
    host: str = "127.0.0.1",
    port: int = 5004,
    *,
    cluster: int = 1,
    key_id: int = 1,
    issued_at: float | None = None,
    nonce: bytes | None = None,
) -> bytes:
    return encode_route_token(
        key_id=key_id,
        key=KEYS[key_id],
        cluster=cluster,
        host=host,
        port=port,
        issued_at=int(time.time() if issued_at is None else issued_at),
        nonce=nonce or os.urandom(3),
    ).encode()


def binding_request(
    server_ufrag: bytes,
    client_ufrag: bytes = b"cLnt",
    pwd: bytes = b"p" * 22,
    *,
    nominate: bool = False,
    after_integrity: list[tuple[int, bytes]] | None = None,
) -> bytes:
    """A caller's check; `nominate`: with USE-CANDIDATE (RFC 8445 §7.1.2), as a controlling
    agent marks its chosen pair; `after_integrity`: attributes put past MESSAGE-INTEGRITY,
    which it does not cover (and the FINGERPRINT is then left out)."""
    attributes = [
        (stun.USERNAME, server_ufrag + b":" + client_ufrag),
        (stun.ICE_CONTROLLING, os.urandom(8)),
        (stun.PRIORITY, struct.pack("!I", 1853824767)),
    ]
    if nominate:
        attributes.append((stun.USE_CANDIDATE, b""))
    data = stun.build_stun(
        stun.BINDING, stun.REQUEST, os.urandom(12), attributes, integrity_key=pwd,
        fingerprint=after_integrity is None,
    )  # fmt: skip
    if after_integrity:
        extra = b"".join(
            struct.pack("!HH", kind, len(value)) + value + bytes(-len(value) % 4)
            for kind, value in after_integrity
        )
        length = int.from_bytes(data[2:4], "big") + len(extra)
        data = data[:2] + length.to_bytes(2, "big") + data[4:] + extra
    return data


def binding_success(transaction_id: bytes | None = None) -> bytes:
    """A STUN Binding success response: what establishes a relay flow."""
    return stun.build_stun(stun.BINDING, stun.SUCCESS, transaction_id or os.urandom(12))


def rtp(seq: int = 1, size: int = 160) -> bytes:
    return bytes([0x80, 111]) + seq.to_bytes(2, "big") + bytes(size - 4)


def free_udp_port(host: str = "127.0.0.1") -> int:
    return free_port(socket.SOCK_DGRAM, host)


def host_address() -> str:
    """This host's own IPv4 address on its default route (no packet is sent), or loopback if
    it has none: where a caller whose stack pins its sockets to their interface (libnice sets
    IP_UNICAST_IF) can reach a local service; loopback it cannot, from eth0's candidates."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # TEST-NET-3 (RFC 5737): only a route lookup
        except OSError:
            return "127.0.0.1"
        return str(s.getsockname()[0])


def free_tcp_port(host: str = "127.0.0.1") -> int:
    return free_port(socket.SOCK_STREAM, host)


def free_sip_port(host: str = "127.0.0.1") -> int:
    """A port free for UDP and TCP both (signaling's SIP listens on both: a port free for UDP
    alone was once some TCP connection's, and signaling could not start)."""
    for _ in range(100):
        port = free_udp_port(host)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((host, port))
            except OSError:
                continue
        return port
    raise RuntimeError("no port free for both UDP and TCP")


class RedisServer(Child):
    """A throwaway redis-server on a free loopback port (no persistence)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_tcp_port()
        super().__init__(Spec("redis", redis_command(self.port), ready_tcp=self.port), quiet=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self, timeout: float = 10.0) -> float:
        """Gone at once (a Redis that dies is what the tests that stop one want)."""
        self.kill()
        return 0.0


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Endpoint:
    """A UDP endpoint on loopback for relay tests: a client, or a transceiver's socket."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, timeout: float = 2.0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET  # (::1: an IPv6 one)
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.bind((host, port))
        self.sock.settimeout(timeout)
        self.addr: tuple[str, int] = self.sock.getsockname()[:2]

    def send(self, data: bytes, to: tuple[str, int]) -> None:
        self.sock.sendto(data, to)

    def recv(self, timeout: float | None = None) -> tuple[bytes, tuple[str, int]]:
        if timeout is not None:
            self.sock.settimeout(timeout)
        data, addr = self.sock.recvfrom(4096)
        return data, (addr[0], addr[1])

    def recv_none(self, wait: float = 0.3) -> bool:
        """True if nothing arrives within `wait` seconds."""
        self.sock.settimeout(wait)
        try:
            self.sock.recvfrom(4096)
        except TimeoutError:
            return True
        finally:
            self.sock.settimeout(2.0)
        return False

    def close(self) -> None:
        self.sock.close()


class FakeTransceiver(Endpoint):
    """The relay-facing wire behaviour of a transceiver: framed in, framed back out."""

    def recv_framed(
        self, timeout: float | None = None
    ) -> tuple[tuple[str, int], tuple[str, int], bytes, tuple[str, int]]:
        from firsthop.shared.wire.proxy_v2 import parse_proxy_v2

        data, relay = self.recv(timeout)
        hdr = parse_proxy_v2(data)
        return hdr.src, hdr.dst, data[hdr.payload_offset :], relay

    def reply(
        self,
        relay: tuple[str, int],
        client: tuple[str, int],
        ingress: tuple[str, int],
        payload: bytes,
    ) -> None:
        from firsthop.shared.wire.proxy_v2 import build_proxy_v2

        self.send(build_proxy_v2(ingress, client) + payload, relay)


def keys_env() -> dict[str, str]:
    """What every test service gets on top of the test's own environment."""
    from firsthop.shared.wire.route_token import format_route_keys

    return {
        "FIRSTHOP_ROUTE_KEYS": format_route_keys(KEYS),
        "FIRSTHOP_INTERNAL_TOKEN": INTERNAL_TOKEN,
    }


def service_env() -> dict[str, str]:
    """The whole environment of a test service: the test's own, the keys and the token."""
    return {**os.environ, **keys_env()}


class ServiceProcess(Child):
    """A real `firsthop <service>` process (`launch.Child`) with the test keys and token."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        ready_http: str | None = None,
        ready_tcp: int | None = None,
        announces: bool = False,
    ) -> None:
        spec = Spec(
            name, argv, keys_env(), ready_http=ready_http, ready_tcp=ready_tcp, announces=announces
        )
        super().__init__(spec)

    @property
    def args(self) -> list[str]:
        return self.spec.argv

    @property
    def env(self) -> dict[str, str]:
        return self.spec.env

    def start(self, timeout: float = 20.0) -> Self:
        super().start(timeout)
        return self


class RelayProcess(ServiceProcess):
    """A real `firsthop relay` process on free loopback ports."""

    def __init__(
        self,
        *args: str,
        cluster: int = 1,
        workers: int = 1,
        redis_url: str | None = None,
        listen_port: int | None = None,
        internal_port: int | None = None,
        listen_host: str = "127.0.0.1",
    ) -> None:
        # The metrics port is the relay's own choice, read back once it serves; so are the
        # public and peer ports when given as 0. Otherwise they are picked here, because
        # other services are told them before the relay starts. `listen_host` is where the
        # public socket is (`host_address()` for a caller that cannot reach loopback).
        port = free_port(host=listen_host) if listen_port is None else listen_port
        self._listen = (listen_host, port)
        self._internal = ("127.0.0.1", free_port() if internal_port is None else internal_port)
        argv = relay_command(
            listen=self._listen[1],
            internal=self._internal[1],
            metrics=0,
            cluster=cluster,
            workers=workers,
            redis=redis_url,
            extra=args,
            listen_host=listen_host,
        )
        super().__init__("relay", argv, announces=True)

    @property
    def listen(self) -> tuple[str, int]:
        return self.bound.get("listen", self._listen)

    @property
    def internal(self) -> tuple[str, int]:
        return self.bound.get("internal", self._internal)

    @property
    def metrics_addr(self) -> tuple[str, int]:
        return self.bound["metrics"]

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        import urllib.request

        from firsthop.shared.metrics import parse_text

        url = f"http://{self.metrics_addr[0]}:{self.metrics_addr[1]}/metrics"
        with urllib.request.urlopen(url, timeout=2) as resp:
            return parse_text(resp.read().decode())

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics().get((name, frozenset(labels.items())), 0.0)

    def health(self) -> dict[str, Any]:
        """/healthz (its JSON body also when it answers 503: a worker is down)."""
        import urllib.error
        import urllib.request

        url = f"http://{self.metrics_addr[0]}:{self.metrics_addr[1]}/healthz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return dict(json.loads(resp.read()))
        except urllib.error.HTTPError as exc:
            return dict(json.loads(exc.read()))

    def wait_metric(self, name: str, at_least: float, timeout: float = 5.0, **labels: str) -> float:
        deadline = time.monotonic() + timeout
        while True:
            value = self.metric(name, **labels)
            if value >= at_least or time.monotonic() > deadline:
                return value
            time.sleep(0.1)


class AgentProcess(ServiceProcess):
    """A real `firsthop agent` on loopback; given `reachable_at` (an address of this host's
    that a transceiver in a network namespace reaches), on all addresses, its `url` there."""

    def __init__(
        self,
        kind: str = "echo",
        port: int | None = None,
        *,
        reachable_at: str | None = None,
        metrics: bool = False,
    ) -> None:
        self.port = port or free_port(socket.SOCK_STREAM)
        self.host = reachable_at or "127.0.0.1"
        extra: tuple[str, ...] = ("--listen", f"0.0.0.0:{self.port}") if reachable_at else ()
        self.metrics_port = free_port(socket.SOCK_STREAM) if metrics else None
        if self.metrics_port is not None:
            extra += ("--metrics", f"127.0.0.1:{self.metrics_port}")
        argv = agent_command(kind, self.port, extra)
        super().__init__(f"agent-{kind}", argv, ready_tcp=self.port)

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    def metric(self, name: str, **labels: str) -> float:
        """One series of its /metrics (it was started with `metrics=True`); 0 if absent."""
        import urllib.request

        from firsthop.shared.metrics import parse_text

        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=2) as resp:
            return parse_text(resp.read().decode()).get((name, frozenset(labels.items())), 0.0)


class TransceiverProcess(ServiceProcess):
    """A real `firsthop transceiver` on loopback, or inside network namespace `netns` on
    its address there (`netns.inside`: media and API), where only what is routed reaches
    it (`nat_network()`'s cluster)."""

    def __init__(
        self,
        *extra: str,
        agent_url: str | None = None,
        tx_id: str = "tx-test",
        cluster: int = 1,
        netns: Namespace | None = None,
    ) -> None:
        # The API port is known before the start (signaling is told it); the media port is
        # the transceiver's own choice, read back once it serves.
        self.api_port = free_port(socket.SOCK_STREAM)
        self.api_host = "127.0.0.1" if netns is None else netns.inside
        where: tuple[str, ...] = ()
        if netns is not None:
            where = ("--media", f"{netns.inside}:0", "--api", f"{netns.inside}:{self.api_port}")
        argv = transceiver_command(
            media=0,
            api=self.api_port,
            tx_id=tx_id,
            agent_url=agent_url,
            extra=("--cluster", str(cluster), "--drain-seconds", "3", *where, *extra),
        )
        if netns is not None:
            argv = ["ip", "netns", "exec", netns.name, *argv]
        super().__init__(tx_id, argv, announces=True)

    @property
    def media(self) -> tuple[str, int]:
        return self.bound["media"]

    @property
    def api(self) -> str:
        return f"http://{self.api_host}:{self.api_port}"

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.env['FIRSTHOP_INTERNAL_TOKEN']}"}

    def create_session(
        self, offer: str, ingress: list[str], **extra: object
    ) -> tuple[int, dict[str, Any]]:
        import json
        import urllib.error
        import urllib.request

        body = json.dumps(
            {
                "call_id": f"call-{time.monotonic_ns()}",
                "offer_sdp": offer,
                "ingress": ingress,
                **extra,
            }
        ).encode()
        req = urllib.request.Request(
            f"{self.api}/internal/v1/sessions",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", **self.auth},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def end_reason(self, session_id: str, timeout: float = 10.0) -> Any:
        """Once `session_id` has ended, why: the body of the internal API's 404 for it (an
        empty trickle PATCH, signaling's liveness probe)."""
        import json

        path = f"/internal/v1/sessions/{session_id}"
        probe = partial(self.request, "PATCH", path, b"", "application/trickle-ice-sdpfrag")
        wait_until(lambda: probe()[0] == 404, timeout)
        status, body = probe()  # the reason stays readable
        assert status == 404, status
        return json.loads(body)

    def event_count(self, name: str) -> float:
        """`firsthop_transceiver_events_total{event=name}` (0 until first counted)."""
        from firsthop.shared.metrics import parse_text

        status, body = self.request("GET", "/metrics")
        assert status == 200
        key = ("firsthop_transceiver_events_total", frozenset({("event", name)}))
        return parse_text(body.decode()).get(key, 0.0)

    def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        ctype: str = "",
        *,
        auth: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        """A request to the API with the internal token (or the `auth` headers given)."""
        import urllib.error
        import urllib.request

        headers = {"Content-Type": ctype} if ctype else {}
        req = urllib.request.Request(
            f"{self.api}{path}",
            data=body or None,
            method=method,
            headers={**headers, **(self.auth if auth is None else auth)},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()


class SignalingProcess(ServiceProcess):
    """A real `firsthop signaling` process on a free loopback port (API key `API_KEY`)."""

    API_KEY = "test-api-key"

    def __init__(self, *extra: str, region: str = "a", api_keys: str | None = None) -> None:
        keys = api_keys if api_keys is not None else self.API_KEY
        argv = signaling_command(port=0, extra=("--region", region, "--api-keys", keys, *extra))
        super().__init__("signaling", argv, announces=True)

    @property
    def port(self) -> int:
        """Signaling's own choice, read back once it serves."""
        return self.bound["listen"][1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"


def run_bench(*args: str, timeout: float = 120) -> dict[str, Any]:
    """`firsthop bench ARGS --json` in a child process; its JSON result (fails with its
    stderr if it could not run)."""
    done = subprocess.run(
        [sys.executable, "-m", "firsthop.services.cli", "bench", *args, "--json"],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def tx_metrics(tx: TransceiverProcess) -> list[str]:
    """The transceiver's /metrics, a line a sample (what a failure prints)."""
    return tx.request("GET", "/metrics")[1].decode().splitlines()


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, every: float = 0.05) -> None:
    """Poll `predicate` until it is truthy; AssertionError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(every)


def events_until(socket: Any, last: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """Read a Realtime event socket (`websockets.sync`) until an event of type `last` has
    come (it included), or `timeout` seconds have passed: what came, in order. A slow answer
    (a loaded machine's Whisper and Piper) may pause the events for seconds; waiting for a
    quiet moment instead had read too little."""
    deadline = time.monotonic() + timeout
    seen: list[dict[str, Any]] = []
    while (left := deadline - time.monotonic()) > 0:
        try:
            event = json.loads(socket.recv(timeout=left))
        except TimeoutError:
            break
        seen.append(event)
        if event.get("type") == last:
            break
    return seen


async def eventually(
    predicate: Callable[[], object],
    timeout: float = 10.0,  # noqa: ASYNC109 - the same call as wait_until(predicate, timeout)
    every: float = 0.05,
) -> None:
    """`wait_until` for asyncio code: poll `predicate` on the running loop until it is truthy;
    AssertionError after `timeout` seconds. The predicate runs on the loop, between its other
    work: it must be quick and must not block (a caller's received audio, a list a callback
    fills). For one that blocks (a scrape of /metrics over HTTP), use
    `await asyncio.to_thread(wait_until, predicate, timeout)`."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(every)


def start_all(*services: ServiceProcess | RelayProcess) -> None:
    """Start services side by side (each waits for its own health); on any failure, kill
    the ones that did start and re-raise."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(services) or 1) as pool:
        futures = [pool.submit(s.start) for s in services]
        errors = [f.exception() for f in futures]
    failed = next((e for e in errors if e is not None), None)
    if failed is not None:
        for s in services:
            s.kill()
        raise failed


def edge_for(
    ingress: tuple[str, int],
    agents: dict[str, AgentProcess],
    *signaling: str,
    tx_args: tuple[str, ...] = (),
) -> tuple[TransceiverProcess, SignalingProcess]:
    """A transceiver whose calls go to the first of `agents`, and a signaling process that
    places calls on it, advertises `ingress` (region "a") and names each agent by its key
    (`--agent-url name=URL`), with `signaling`'s flags too; both started (on a failure,
    neither is left running)."""
    from firsthop.shared.address import format_hostport

    tx = TransceiverProcess(*tx_args, agent_url=next(iter(agents.values())).url).start()
    urls = [arg for name, agent in agents.items() for arg in ("--agent-url", f"{name}={agent.url}")]
    args = ["--transceiver", tx.api, "--ingress", f"a={format_hostport(ingress)}", *urls]
    try:
        sig = SignalingProcess(*signaling, *args).start()
    except BaseException:
        tx.kill()
        raise
    return tx, sig


class UpStack:
    """`firsthop up` as a subprocess on free ports (its own session: a failing test takes the
    whole tree down), its output kept in `lines`; `start()` returns once it says it is up."""

    def __init__(self) -> None:
        import subprocess
        import sys

        self.port, self.metrics = free_tcp_port(), free_tcp_port()
        argv = [sys.executable, "-m", "firsthop.services.cli", "up"]
        argv += ["--port", str(self.port), "--relay-port", str(free_udp_port())]
        argv += ["--relay-tcp-port", str(free_tcp_port())]
        argv += ["--relay-metrics-port", str(self.metrics)]
        self.sip_port = free_sip_port()
        argv += ["--sip-port", str(self.sip_port)]
        # its own (the default is one per machine, locked by each transceiver: a second `up`
        # at once, another test's or a developer's, could not start)
        self.record_dir = tempfile.mkdtemp(prefix="firsthop-up-recordings-")
        argv += ["--record-dir", self.record_dir]
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # (FIRSTHOP_PORT_RANGE goes too: `up` picks its services' other ports with the
            # kernel, never one of this process's range it was just given)
            env={k: v for k, v in os.environ.items() if not k.startswith("FIRSTHOP_")},
            start_new_session=True,
        )
        self.lines: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Self:
        import threading

        up = threading.Event()

        def drain() -> None:  # keep the pipe flowing: `up` logs for every service
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                if "firsthop is up" in line:
                    up.set()

        self.reader = threading.Thread(target=drain, daemon=True)
        self.reader.start()
        if not up.wait(timeout):
            raise AssertionError("firsthop up did not come up:\n" + "".join(self.lines[-40:]))
        # the summary lines follow the headline; the last one says how to stop
        wait_until(lambda: any("Ctrl-C stops everything" in line for line in self.lines), 5)
        return self

    def said(self, label: str) -> str:
        """The last word of `up`'s summary line starting with `label`."""
        return next(line.split()[-1] for line in self.lines if line.strip().startswith(label))

    def said_all(self, label: str) -> str:
        """All of `up`'s summary line starting with `label`, after it."""
        line = next(line for line in self.lines if line.strip().startswith(label))
        return line.strip()[len(label) :].strip()

    def kill(self) -> None:
        import signal

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # `up` and every service it started
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.record_dir, ignore_errors=True)


def spoken(text: str, *, words_per_minute: int = 140, pad_ms: int = 300) -> bytes:
    """`text` said by espeak-ng as the Realtime protocol's audio (24 kHz PCM16 mono), with
    `pad_ms` of silence either side. espeak-ng must be installed (scripts/ensure-system-deps)."""
    import shutil
    import subprocess

    from firsthop.services.agent.assistant.voice import wav_to_pcm

    program = shutil.which("espeak-ng")
    assert program, "espeak-ng is not installed: run scripts/ensure-system-deps espeak-ng"
    wav = subprocess.run(
        [program, "--stdout", "-v", "en-us", "-s", str(words_per_minute), "--", text],
        capture_output=True,
        check=True,
        timeout=30,
    ).stdout
    pad = bytes(pad_ms * 48)
    return pad + wav_to_pcm(wav) + pad


@dataclass
class MediaStack:
    """A relay, an agent, a transceiver and signaling in front of them (a static transceiver
    list, no Redis), the agent named `name` on signaling and its default: what a Realtime
    call through the whole edge needs. `agent_url` is how signaling names the agent."""

    relay: RelayProcess
    agent: AgentProcess
    tx: TransceiverProcess
    sig: SignalingProcess

    @classmethod
    @contextmanager
    def running(
        cls,
        agent: AgentProcess,
        name: str,
        agent_url: str,
        *extra: str,
        api_keys: str,
        tx_args: tuple[str, ...] = (),
    ) -> Iterator[MediaStack]:
        relay, tx = RelayProcess(), TransceiverProcess(*tx_args)
        sig = SignalingProcess(
            *["--transceiver", tx.api, "--ingress", f"{relay.listen[0]}:{relay.listen[1]}"],
            *["--agent-url", f"{name}={agent_url}", "--default-agent", name],
            *["--ip-rate", "0", *extra],
            api_keys=api_keys,
        )
        procs = [relay, agent, tx, sig]
        start_all(*procs)
        try:
            yield cls(relay, agent, tx, sig)
        finally:
            for p in procs:
                p.kill()


# Suites a DTLS server with only an RSA certificate can pick (GStreamer's webrtcbin, embedded
# stacks): what an RSA peer in the tests offers, so no ECDSA suite can save the handshake.
RSA_ONLY_CIPHERS = "ECDHE-RSA-AES128-GCM-SHA256:ECDHE-RSA-AES256-GCM-SHA384:ECDHE-RSA-AES128-SHA"


def rsa_certificate(ciphers: str = RSA_ONLY_CIPHERS) -> Any:
    """A DTLS certificate for an aiortc peer (`dtls_hooks.dtls_for_any_peer(pc, ...)`) with a
    fresh RSA-2048 key, self-signed with SHA-256 as WebRTC stacks make theirs (aiortc's own
    certificate builder, given an RSA key instead of its ECDSA one)."""
    from aiortc.rtcdtlstransport import generate_certificate
    from cryptography.hazmat.primitives.asymmetric import rsa

    from firsthop.services.transceiver.rtc.dtls_hooks import DtlsCertificate

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return DtlsCertificate(key, generate_certificate(key), ciphers)  # type: ignore[arg-type]


# -- network namespaces (tests across real network boundaries) ---------------------------


@dataclass
class Namespace:
    """A network namespace joined to this host by a veth pair: `host` is the host side's
    address, `inside` the namespace's (a /24 of their own)."""

    name: str
    host: str
    inside: str

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run `argv` inside the namespace."""
        return _ip("netns", "exec", self.name, *argv, check=check)

    def spawn(self, *argv: str) -> subprocess.Popen[str]:
        """Start `argv` inside the namespace, its stdin and stdout pipes of text."""
        return subprocess.Popen(
            ["ip", "netns", "exec", self.name, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def nft(self, rules: str) -> None:
        """Load nftables `rules` (a ruleset's text) in the namespace."""
        _ip("netns", "exec", self.name, "nft", "-f", "-", stdin=rules)

    def block_udp(self, blocked: bool = True) -> None:
        """nftables in the namespace drop every UDP datagram in and out (or stop doing so)."""
        self.run("nft", "flush", "ruleset")
        if blocked:
            self.nft(
                "table inet firsthop_test {\n"
                "  chain out { type filter hook output priority 0; meta l4proto udp drop; }\n"
                "  chain in { type filter hook input priority 0; meta l4proto udp drop; }\n"
                "}\n"
            )


def _ip(
    *argv: str, check: bool = True, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    program = "ip"
    result = subprocess.run(
        [program, *argv], input=stdin, capture_output=True, text=True, timeout=20
    )
    if check and result.returncode != 0:
        raise NamespaceUnavailable(
            f"`{program} {' '.join(argv)}` failed ({result.returncode}): {result.stderr.strip()}"
        )
    return result


class NamespaceUnavailable(RuntimeError):
    pass


def _require(*programs: str) -> None:
    for program in programs:
        if shutil.which(program) is None:
            raise NamespaceUnavailable(
                f"{program} is not installed: run scripts/ensure-system-deps iproute2 nftables "
                "conntrack"
            )


def _add_namespace(name: str) -> None:
    try:
        _ip("netns", "add", name)
    except NamespaceUnavailable as exc:
        raise NamespaceUnavailable(
            f"cannot create a network namespace here ({exc}); the tests across namespaces "
            "need root with CAP_NET_ADMIN and CAP_SYS_ADMIN (e.g. a privileged container)"
        ) from None


def _veth(near: str | None, far: str, ifname: str, near_addr: str, far_addr: str) -> None:
    """A veth pair `{ifname}a` (in namespace `near`, or this host's with None) <-> `{ifname}b`
    (in `far`), each side up with its address on their /24."""

    def run(ns: str | None, *argv: str) -> None:
        if ns is None:
            _ip(*argv)
        else:
            _ip("netns", "exec", ns, "ip", *argv)

    a, b = f"{ifname}a", f"{ifname}b"
    run(near, "link", "add", a, "type", "veth", "peer", "name", b)
    run(near, "link", "set", b, "netns", far)
    run(near, "addr", "add", f"{near_addr}/24", "dev", a)
    run(near, "link", "set", a, "up")
    run(far, "addr", "add", f"{far_addr}/24", "dev", b)
    run(far, "link", "set", b, "up")
    run(far, "link", "set", "lo", "up")


@contextmanager
def _free_subnet(second: int) -> Iterator[int]:
    """A third octet X such that no address of this host is in 10.{second}.X.0/24, held
    against every other test process (the test workers run at once) until the block ends:
    by then the caller has put its host side's address there."""
    with open(Path(tempfile.gettempdir()) / "firsthop-test-subnets.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # (released when the file closes)
        taken = set(re.findall(rf"inet 10\.{second}\.(\d+)\.", _ip("-4", "-o", "addr").stdout))
        yield random.choice([n for n in range(1, 255) if str(n) not in taken])


@contextmanager
def network_namespace() -> Iterator[Namespace]:
    """A fresh namespace with a veth pair to this host (unique names and subnet, removed on
    exit). Fails — does not skip — with what is missing where namespaces cannot be created:
    the tests need root (CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and nftables."""
    _require("ip", "nft")
    tag = os.urandom(3).hex()
    name, ifname = f"fh-{tag}", f"fh{tag}"
    _add_namespace(name)
    try:
        with _free_subnet(199) as third:  # (compose.yaml uses 10.77.0.0/24)
            ns = Namespace(name, f"10.199.{third}.1", f"10.199.{third}.2")
            _veth(None, name, ifname, ns.host, ns.inside)
        yield ns
    finally:
        _ip("netns", "del", name, check=False)  # takes the veth pair with it
        _ip("link", "del", f"{ifname}a", check=False)


@contextmanager
def second_link(ns: Namespace) -> Iterator[Namespace]:
    """Another veth pair from this host into `ns`, on a /24 of its own: the same namespace,
    reached at other addresses (`host`, `inside`): a caller with two interfaces. Removed
    on exit."""
    ifname = f"fh{os.urandom(3).hex()}"
    try:
        with _free_subnet(199) as third:
            link = Namespace(ns.name, f"10.199.{third}.1", f"10.199.{third}.2")
            _veth(None, ns.name, ifname, link.host, link.inside)
        yield link
    finally:
        _ip("link", "del", f"{ifname}a", check=False)


@dataclass
class NatNetwork:
    """A caller behind a NAT, and a cluster only this host reaches (`nat_network()`):

        caller --home link-- router (NAT) --public link-- this host --cluster link-- cluster

    * `router`: `host` is this host's public address (where the relay listens), `inside` the
      NAT's public address (what the relay sees as the client);
    * `caller`: `host` is the router's home address (the caller's gateway), `inside` the
      caller's private address;
    * `cluster`: `host` is this host's cluster address (the relay's side), `inside` the
      transceiver's.
    The router forwards and masquerades; it has no route beyond the public link, so the
    caller reaches this host's public address only, never the cluster (whether or not this
    host forwards)."""

    router: Namespace
    caller: Namespace
    cluster: Namespace
    public_if: str  # the router's interface on the public link

    def masquerade(self, ports: tuple[int, int]) -> None:
        """The router maps its callers' flows to its public address with source ports in
        `ports`. Mappings it already has are forgotten (conntrack flush): with other ports,
        a flow in progress gets a new source port, as when a real NAT rebinds."""
        rules = (
            "table ip firsthop_nat {\n"
            "  chain post { type nat hook postrouting priority 100;\n"
            f'    oifname "{self.public_if}" meta l4proto {{ tcp, udp }}'
            f" masquerade to :{ports[0]}-{ports[1]};\n"
            f'    oifname "{self.public_if}" masquerade; }}\n'
            "}\n"
        )
        self.router.run("nft", "flush", "ruleset")
        _ip("netns", "exec", self.router.name, "nft", "-f", "-", stdin=rules)
        self.router.run("conntrack", "--flush")


@contextmanager
def nat_network(ports: tuple[int, int] = (41000, 41999)) -> Iterator[NatNetwork]:
    """Three fresh namespaces wired as `NatNetwork` says (unique names, all removed on exit),
    the router masquerading to source ports `ports`. Fails, saying what is missing, where
    namespaces cannot be created (root, iproute2, nftables, conntrack)."""
    _require("ip", "nft", "conntrack", "sysctl")
    tag = os.urandom(3).hex()
    made: list[str] = []
    try:
        # (10.197.X is the router's and the caller's alone; this host has the other two)
        with _free_subnet(196) as third:
            public, home, cluster = (f"10.{second}.{third}" for second in (196, 197, 198))
            net = NatNetwork(
                router=Namespace(f"fh-{tag}-nat", f"{public}.1", f"{public}.2"),
                caller=Namespace(f"fh-{tag}-home", f"{home}.1", f"{home}.2"),
                cluster=Namespace(f"fh-{tag}-k8s", f"{cluster}.1", f"{cluster}.2"),
                public_if=f"fh{tag}pb",
            )
            for ns in (net.router, net.caller, net.cluster):
                _add_namespace(ns.name)
                made.append(ns.name)
            _veth(None, net.router.name, f"fh{tag}p", net.router.host, net.router.inside)
            _veth(None, net.cluster.name, f"fh{tag}k", net.cluster.host, net.cluster.inside)
        _veth(net.router.name, net.caller.name, f"fh{tag}h", net.caller.host, net.caller.inside)
        net.caller.run("ip", "route", "add", "default", "via", net.caller.host)
        net.router.run("sysctl", "-qw", "net.ipv4.ip_forward=1")
        net.masquerade(ports)
        yield net
    finally:
        for name in made:
            _ip("netns", "del", name, check=False)  # takes its veth pairs with it
        for ifname in (f"fh{tag}pa", f"fh{tag}ka"):
            _ip("link", "del", ifname, check=False)


def make_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed ECDSA certificate for localhost and 127.0.0.1 (its own CA), written to
    `directory`: (certificate, key) paths (a wss:// backend's, SIP over TLS)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "firsthop test")])
    now = datetime.datetime.now(datetime.UTC)
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "test.pem", directory / "test.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


# -- recordings, as a listener reads them -------------------------------------------------------


def probe_recording(data: bytes, suffix: str, rate: int) -> tuple[dict[str, Any], Any]:
    """A recording's bytes read as ffprobe and ffmpeg (Debian's) read them: (the probe's
    first stream with the format's duration in it, its two channels as float64 samples at
    `rate`, shape (n, 2))."""
    import tempfile

    import numpy as np

    for tool in ("ffprobe", "ffmpeg"):
        assert shutil.which(tool), f"{tool} is not installed: run `make test` (it installs ffmpeg)"
    with tempfile.NamedTemporaryFile(suffix=suffix) as f:
        f.write(data)
        f.flush()
        probe = json.loads(
            subprocess.run(
                ["ffprobe", "-v", "error", "-show_streams", "-show_format", "-of", "json", f.name],
                capture_output=True,
                check=True,
                timeout=30,
            ).stdout
        )
        raw = subprocess.run(
            [
                "ffmpeg",
                "-v",
                "error",
                "-i",
                f.name,
                "-f",
                "s16le",
                "-ac",
                "2",
                "-ar",
                str(rate),
                "-",
            ],
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout
    (stream,) = probe["streams"]
    stream["duration"] = float(probe["format"]["duration"])
    return stream, np.frombuffer(raw, "<i2").reshape(-1, 2).astype(np.float64)


def onsets(channel: Any, rate: int) -> list[float]:
    """Seconds where 20 ms frames turn loud (RMS > 1000) after a quiet one."""
    import numpy as np

    size = rate // 50
    frames = channel[: len(channel) // size * size].reshape(-1, size)
    loud = np.sqrt(np.mean(frames**2, axis=1)) > 1000
    return [i * 0.02 for i in range(1, len(loud)) if loud[i] and not loud[i - 1]]


def peak_hz(channel: Any, rate: int) -> float:
    import numpy as np

    spectrum = np.abs(np.fft.rfft(channel))
    return float(np.fft.rfftfreq(len(channel), 1 / rate)[np.argmax(spectrum)])


def drain_limited(
    batch: list[Any], again: Callable[[], list[Any]], more: Callable[[], bool], limit: int
) -> list[Any]:
    """All a reader fed with a frame limit gives: `batch`, then `again()` while `more()`,
    asserting no call gave more than `limit`."""
    out: list[Any] = []
    while True:
        assert len(batch) <= limit
        out += batch
        if not more():
            return out
        batch = again()
