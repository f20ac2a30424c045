"""Small HTTP pieces shared by services: serve an ASGI app on Hypercorn's Trio worker."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from shared.config import Address, format_hostport

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
Handler = Callable[[str, str], Awaitable[tuple[int, str, bytes]]]


def hypercorn_config(bind: Address) -> Config:
    config = Config()
    config.bind = [format_hostport(bind)]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 2.0
    return config


def bound_address(binds: list[str]) -> Address:
    """'http://127.0.0.1:41234' -> ('127.0.0.1', 41234)."""
    hostport = binds[0].split("://", 1)[-1]
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port)


def simple_app(handler: Handler) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """A minimal ASGI app for GET-only endpoints (`/metrics`, `/healthz`)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
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
