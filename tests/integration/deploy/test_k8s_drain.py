"""How a transceiver pod ends: its preStop hook drains it and waits for calls to end, within a
grace period sized to the overlay's drain time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from tests.integration.deploy.manifests import (
    TARGETS,
    Obj,
    containers,
    find,
    k8s_config,
    objs,
)


def test_grace_periods_follow_the_overlays(monkeypatch: pytest.MonkeyPatch) -> None:
    drains = {t: k8s_config(objs(t), "transceiver", monkeypatch)[2].drain_seconds for t in TARGETS}
    assert drains["prod"] >= 3600 and drains["dev"] <= 60


class FakeApi(BaseHTTPRequestHandler):
    def reply(self, body: Obj) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def fake_transceiver_api(
    calls: list[tuple[str, str, str | None]], sessions: list[int]
) -> type[BaseHTTPRequestHandler]:
    """/internal/v1/drain and /healthz, reporting `sessions` one poll after another."""

    class Handler(FakeApi):
        def do_POST(self) -> None:
            calls.append(("POST", self.path, self.headers.get("Authorization")))
            self.reply({"draining": True, "sessions": sessions[0]})

        def do_GET(self) -> None:
            calls.append(("GET", self.path, self.headers.get("Authorization")))
            self.reply({"ok": True, "draining": True, "sessions": sessions.pop(0)})

    return Handler


def test_prestop_hook_drains_then_waits_for_calls_to_end() -> None:
    (container,) = containers(find(objs("dev"), "StatefulSet", "transceiver"))
    script = container["lifecycle"]["preStop"]["exec"]["command"][2]
    calls: list[tuple[str, str, str | None]] = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake_transceiver_api(calls, [2, 0]))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {
            "PATH": os.environ.get("PATH", ""),
            "FIRSTHOP_API": f"127.0.0.1:{server.server_address[1]}",
            "FIRSTHOP_INTERNAL_TOKEN": "secret",
            "FIRSTHOP_DRAIN_SECONDS": "20",
        }
        subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=30)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert calls == [
        ("POST", "/internal/v1/drain", "Bearer secret"),
        ("GET", "/healthz", None),  # 2 sessions: keep waiting
        ("GET", "/healthz", None),  # 0: done, SIGTERM may come
    ]
