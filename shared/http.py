"""Small HTTP pieces shared by services: serve an ASGI app on Hypercorn's Trio worker.

`hypercorn_config` is where every service's server limits come from, sized to what the APIs
need (docs/security.md): request heads up to 16 KiB, and whole within `keep_alive_timeout` (5 s);
no more than `READ_TIMEOUT` between two reads from a peer (WebSockets get a ping every
`WS_PING_INTERVAL`, so a live client always has a pong to send); WebSocket messages up to
64 KiB (signaling adds its margin); a few messages queued per connection; HTTP/1.1 only, and
hypercorn's WebSocket stream bounded (`shared.hypercorn_bounds`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from firsthop.shared.address import Address, format_hostport
from firsthop.shared.hypercorn_bounds import install as install_bounds

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Handler = Callable[[str, str], Awaitable[tuple[int, str, bytes]]]

MAX_HEAD_BYTES = 16 * 1024  # request line + headers
READ_TIMEOUT = 30  # seconds with nothing from the peer (a request, a body, a WebSocket)
WS_PING_INTERVAL = 10.0
MAX_WS_MESSAGE = 64 * 1024
APP_QUEUE = 4  # request body chunks / WebSocket messages queued between hypercorn and the app


def hypercorn_config(bind: Address) -> Config:
    install_bounds()
    config = Config()
    config.bind = [format_hostport(bind)]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 2.0
    config.alpn_protocols = ["http/1.1"]  # HTTP/2 ends at the ingress, with TLS
    config.h11_max_incomplete_size = MAX_HEAD_BYTES
    config.read_timeout = READ_TIMEOUT
    config.websocket_ping_interval = WS_PING_INTERVAL
    config.websocket_max_message_size = MAX_WS_MESSAGE
    config.max_app_queue_size = APP_QUEUE
    return config


def bound_address(binds: list[str]) -> Address:
    """'http://127.0.0.1:41234' -> ('127.0.0.1', 41234)."""
    hostport = binds[0].split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port)


async def lifespan(receive: Receive, send: Send) -> None:
    """An ASGI lifespan with nothing to start or stop: acknowledge both, return at shutdown."""
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def simple_app(handler: Handler) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """A minimal ASGI app for GET-only endpoints (`/metrics`, `/healthz`)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
        if scope["type"] != "http":
            return
        status, ctype, body = await handler(scope["method"], scope["path"])
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", ctype.encode()),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


async def serve_simple(
    handler: Handler,
    bind: Address,
    *,
    task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `handler` on `bind`; reports the bound address (port 0 allowed)."""

    async def _serve(*, task_status: trio.TaskStatus[list[str]]) -> None:
        app: Any = simple_app(handler)
        await serve(app, hypercorn_config(bind), task_status=task_status)

    async with trio.open_nursery() as nursery:
        binds = await nursery.start(_serve)
        task_status.started(bound_address(binds))
