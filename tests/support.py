"""Helpers shared by the tests: tokens, STUN packets, free ports, a real redis-server."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from shared.wire import stun
from shared.wire.route_token import encode_route_token

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
    server_ufrag: bytes, client_ufrag: bytes = b"cLnt", pwd: bytes = b"p" * 22
) -> bytes:
    return stun.build_stun(
        stun.BINDING,
        stun.REQUEST,
        os.urandom(12),
        [
            (stun.USERNAME, server_ufrag + b":" + client_ufrag),
            (stun.ICE_CONTROLLING, os.urandom(8)),
            (stun.PRIORITY, struct.pack("!I", 1853824767)),
        ],
        integrity_key=pwd,
        fingerprint=True,
    )


def rtp(seq: int = 1, size: int = 160) -> bytes:
    return bytes([0x80, 111]) + seq.to_bytes(2, "big") + bytes(size - 4)


def free_udp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_tcp_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A throwaway redis-server on a free loopback port (no persistence)."""

    def __init__(self, port: int | None = None) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server not found: install it (apt-get install redis-server)")
        self.exe = exe
        self.port = port or free_tcp_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                self.exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--protected-mode",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@contextmanager
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
