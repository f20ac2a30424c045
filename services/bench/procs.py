"""Start the real services on free loopback ports for benchmarks (and the tests that run them).

Also the UDP tap `bench echo` puts in front of a transceiver's media socket, run as its own
process: `python -m firsthop.services.bench.procs tap TX_PORT` (see `tap`).
"""

from __future__ import annotations

import json
import os
import secrets
import selectors
import socket
import struct
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from firsthop.services.launch import (
    HOST,
    Child,
    Spec,
    agent_command,
    free_port,
    relay_command,
    transceiver_command,
)
from firsthop.shared.address import Address
from firsthop.shared.wire.proxy_v2 import ProxyError, parse_proxy_v2
from firsthop.shared.wire.route_token import format_route_keys

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux


@dataclass
class Stack:
    """relay + agent (echo, or another `--kind`) + transceiver (and optionally the stock
    aiortc reference). A Realtime-protocol agent (`assistant`) is reached through the
    transceiver's Realtime bridge."""

    quiet: bool = True
    agent_kind: str = "echo"
    keys: str = field(default_factory=lambda: format_route_keys({1: os.urandom(32)}))
    token: str = field(default_factory=lambda: secrets.token_urlsafe(16))  # internal API
    children: list[Child] = field(default_factory=list)
    relay_port: int = 0
    relay_tcp_port: int = 0  # its ICE-TCP ingress
    last_session: str = ""  # the session id of the last offer_to_firsthop
    tx_media: int = 0
    tx_api: int = 0
    agent_port: int = 0
    stock_port: int = 0
    relay_metrics: int = 0
    relay_internal: int = 0
    relay_redis: str | None = None  # the relay's flow cache (`bench faults`)
    relay_extra: tuple[str, ...] = ()
    agent_extra: tuple[str, ...] = ()  # more flags for the agent (`--recognizer ...`)

    def _start(self, spec: Spec) -> Child:
        spec.env = {
            "FIRSTHOP_ROUTE_KEYS": self.keys,
            "FIRSTHOP_INTERNAL_TOKEN": self.token,
            "FIRSTHOP_LOG_LEVEL": os.environ.get("FIRSTHOP_LOG_LEVEL", "WARNING"),
            **spec.env,
        }
        child = Child(spec, quiet=self.quiet)
        self.children.append(child)
        return child.start()

    def start(self, *, stock: bool = False, tx_args: tuple[str, ...] = ()) -> Stack:
        # Every service binds port 0 and says what it got (no port picked here can be
        # taken by someone else before the service binds it).
        bound = self._start(self._relay_spec()).bound
        self.relay_port, self.relay_metrics = bound["listen"][1], bound["metrics"][1]
        self.relay_tcp_port, self.relay_internal = bound["listen_tcp"][1], bound["internal"][1]
        agent = agent_command(self.agent_kind, 0, self.agent_extra)
        self.agent_port = self._start(Spec("agent", agent, announces=True)).bound["listen"][1]
        tx = transceiver_command(
            media=0,
            api=0,
            agent_url=self.agent_url,
            extra=("--capacity", "1000", *tx_args),
        )
        bound = self._start(Spec("transceiver", tx, announces=True)).bound
        self.tx_media, self.tx_api = bound["media"][1], bound["api"][1]
        if stock:
            self.stock_port, _ = self.spawn_stock()
        return self

    def _relay_spec(self) -> Spec:
        relay = relay_command(
            listen=self.relay_port,
            internal=self.relay_internal,
            metrics=self.relay_metrics,
            redis=self.relay_redis,
            extra=("--listen-tcp", f"{HOST}:{self.relay_tcp_port}", *self.relay_extra),
        )
        return Spec("relay", relay, announces=True)

    def restart_relay(self, down: float) -> None:
        """Stop the relay (SIGTERM), and `down` seconds after it is gone start it again on
        the same ports."""
        self.children[0].stop()
        time.sleep(down)
        child = Child(self._relay_spec(), quiet=self.quiet)
        child.spec.env = {**self.children[0].spec.env, **child.spec.env}
        self.children[0] = child.start()

    def restart_agent(self) -> None:
        """Stop the agent (SIGTERM) and start it again at once on the same port."""
        old = self.children[1]
        old.stop()
        spec = Spec("agent", agent_command(self.agent_kind, self.agent_port), announces=True)
        spec.env = dict(old.spec.env)
        self.children[1] = Child(spec, quiet=self.quiet).start()

    def spawn_agent(self, kind: str) -> int:
        """Start another agent (`firsthop agent --kind KIND`); returns its port."""
        spec = Spec(f"agent-{kind}", agent_command(kind, 0), announces=True)
        return int(self._start(spec).bound["listen"][1])

    def spawn_stock(self, *args: str) -> tuple[int, int]:
        """Start a stock aiortc answerer (`services/bench/stock.py` with `args`, e.g.
        "--mono"); returns its (port, pid). The one `start(stock=True)` starts is the first."""
        port = free_port(socket.SOCK_STREAM)
        argv = [sys.executable, "-m", "firsthop.services.bench.stock", str(port), *args]
        child = self._start(Spec("stock", argv, ready_tcp=port))
        return port, child.pid

    @property
    def agent_url(self) -> str:
        if self.agent_kind == "assistant":
            return f"realtime+ws://{HOST}:{self.agent_port}/v1/realtime"
        return f"ws://{HOST}:{self.agent_port}"

    @property
    def relay_pid(self) -> int:
        """The relay supervisor; its worker is a child process of it."""
        return self.children[0].pid

    @property
    def agent_pid(self) -> int:
        return self.children[1].pid

    @property
    def tx_pid(self) -> int:
        return self.children[2].pid

    @property
    def stock_pid(self) -> int:
        return self.children[3].pid

    def offer_to_firsthop(
        self,
        offer: str,
        *,
        direct: bool = False,
        ingress: str | None = None,
        session: dict[str, Any] | None = None,
        agent_url: str | None = None,
        tcp_only: bool = False,
    ) -> str:
        """Answer from the transceiver, advertising the relay (or, `direct`, the media
        socket itself; or any `ingress` HOST:PORT given); `session` is a Realtime session
        config for a Realtime agent; `agent_url` another agent than the stack's, this call;
        `tcp_only`: the caller is given the relay's ICE-TCP ingress alone (its UDP candidate
        is taken out of the answer), as if its network dropped UDP."""
        if ingress is None:
            ingress = f"127.0.0.1:{self.tx_media if direct else self.relay_port}"
        fields: dict[str, Any] = {
            "call_id": f"bench-{time.monotonic_ns()}",
            "offer_sdp": offer,
            "ingress": [ingress],
        }
        if session is not None:
            fields["session"] = session
        if agent_url is not None:
            fields["agent_url"] = agent_url
        if tcp_only:
            fields["ingress_tcp"] = [f"127.0.0.1:{self.relay_tcp_port}"]
        body = json.dumps(fields).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.tx_api}/internal/v1/sessions",
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            created = json.loads(resp.read())
        answer = str(created["answer_sdp"])
        self.last_session = str(created["session_id"])
        if tcp_only:
            lines = answer.split("\r\n")
            answer = "\r\n".join(
                line for line in lines if not (line.startswith("a=candidate:") and " udp " in line)
            )
        return answer

    def end_session(self, session_id: str) -> None:
        """End a call at the transceiver (DELETE), as signaling does on a hangup."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.tx_api}/internal/v1/sessions/{session_id}",
            method="DELETE",
            headers={"Authorization": f"Bearer {self.token}"},
        )
        with urllib.request.urlopen(req, timeout=10):
            pass

    def offer_to_stock(self, offer: str, *, port: int | None = None) -> str:
        """Answer from the stock answerer (or the one `spawn_stock` started on `port`)."""
        req = urllib.request.Request(
            f"http://127.0.0.1:{port or self.stock_port}/offer",
            data=offer.encode(),
            method="POST",
            headers={"Content-Type": "application/sdp"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            return str(resp.read().decode())

    def firsthop_sessions(self) -> int:
        """Live sessions on the transceiver (its /healthz)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.tx_api}/healthz", timeout=5) as resp:
            return int(json.loads(resp.read())["sessions"])

    def stock_sessions(self, port: int | None = None) -> int:
        """Live peer connections on a stock answerer (`GET /sessions`)."""
        url = f"http://127.0.0.1:{port or self.stock_port}/sessions"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(json.loads(resp.read())["sessions"])

    def answerer(self, target: str, port: int | None = None) -> Callable[[str], str]:
        """Who answers a caller's offer for `target`: "firsthop", else a stock answerer (the
        first one, or the one `spawn_stock` started on `port`)."""
        if target == "firsthop":
            return self.offer_to_firsthop
        return partial(self.offer_to_stock, port=port)

    def sessions(self, target: str) -> int:
        """Live sessions on `target`'s server: the transceiver, else the first stock answerer."""
        return self.firsthop_sessions() if target == "firsthop" else self.stock_sessions()

    def stop(self) -> None:
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.terminate()
        for child in self.children:
            try:
                if child.proc is not None:
                    child.proc.wait(8)
            except subprocess.TimeoutExpired:
                child.kill()
        self.children.clear()


# -- a timestamping UDP tap ---------------------------------------------------------------


def _udp() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((HOST, 0))
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    return sock


def _receive(sock: socket.socket) -> tuple[bytes, Address, int]:
    data, ancillary, _, src = sock.recvmsg(2048, socket.CMSG_SPACE(16))
    for level, kind, raw in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
            sec, nsec = struct.unpack("qq", raw[:16])
            return data, (src[0], src[1]), sec * 1_000_000_000 + nsec
    return data, (src[0], src[1]), time.time_ns()


def _send(sock: socket.socket, data: bytes, addr: Address) -> None:
    try:
        sock.sendto(data, addr)
    except OSError:
        pass  # as a network would: the datagram is lost


def _is_rtp(payload: bytes) -> bool:
    # RFC 7983: 128..191 is RTP/RTCP; RTCP packet types 192..223 sit in the second byte.
    return len(payload) > 1 and 128 <= payload[0] <= 191 and not 192 <= payload[1] <= 223


def _note(records: list[Any], stamp: int, way: str, data: bytes, client: Address | None) -> None:
    payload = data
    if client is None:  # framed by the relay: the client is in the PROXY v2 header
        try:
            header = parse_proxy_v2(data)
        except ProxyError:
            return
        client = header.src if way == "up" else header.dst
        payload = data[header.payload_offset :]
    if _is_rtp(payload):
        records.append((stamp, way, f"{client[0]}:{client[1]}", len(payload)))


def tap() -> None:
    """Forward relay <-> transceiver on one socket and direct clients <-> transceiver
    through one socket per client; print "ready RELAY_SIDE DIRECT_SIDE"; on "to PORT" forward
    to the transceiver's media port PORT (it is started after the tap: it advertises the
    tap's port) and print "ok"; on "dump" print the records so far as one JSON line and
    forget them; exit at EOF. Until "to", what arrives is dropped."""
    tx: Address = (HOST, 0)
    relay_side, direct_side = _udp(), _udp()
    selector = selectors.DefaultSelector()
    selector.register(relay_side, selectors.EVENT_READ, "relay")
    selector.register(direct_side, selectors.EVENT_READ, "direct")
    selector.register(0, selectors.EVENT_READ, "control")
    relay: Address | None = None
    uplinks: dict[Address, socket.socket] = {}
    records: list[Any] = []
    control = b""
    print(f"ready {relay_side.getsockname()[1]} {direct_side.getsockname()[1]}", flush=True)
    while True:
        for key, _ in selector.select():
            what = key.data
            if what == "control":
                chunk = os.read(0, 4096)
                if not chunk:
                    return
                control += chunk
                while b"\n" in control:
                    line, _, control = control.partition(b"\n")
                    word, _, arg = line.strip().partition(b" ")
                    if word == b"dump":
                        print(json.dumps(records), flush=True)
                        records = []
                    elif word == b"to":
                        tx = (HOST, int(arg))
                        print("ok", flush=True)
                continue
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                data, src, stamp = _receive(sock)
            except OSError:  # an ICMP error for an earlier send (a caller hung up): skip
                continue
            if tx[1] == 0:
                continue
            if what == "relay":
                if src == tx:
                    if relay is not None:
                        _send(relay_side, data, relay)
                    _note(records, stamp, "down", data, None)
                else:
                    relay = src
                    _send(relay_side, data, tx)
                    _note(records, stamp, "up", data, None)
            elif what == "direct":
                uplink = uplinks.get(src)
                if uplink is None:
                    uplink = uplinks[src] = _udp()
                    selector.register(uplink, selectors.EVENT_READ, src)
                _send(uplink, data, tx)
                _note(records, stamp, "up", data, src)
            else:  # from the transceiver, on the uplink socket of direct client `what`
                _send(direct_side, data, what)
                _note(records, stamp, "down", data, what)


if __name__ == "__main__" and sys.argv[1:2] == ["tap"]:
    tap()
