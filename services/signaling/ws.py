"""`GET /v1/ws`: call set-up and call events over one WebSocket of JSON messages (§6).

Client → server: ``auth`` (first, unless the upgrade carried ``Authorization: Bearer``),
``offer`` (``sdp``, optional ``agent``), ``candidate`` (``candidate``, optional ``sdpMid``;
an empty candidate means end-of-candidates: checked, counted and capped per call like a
PATCH, never forwarded — see `trickle`), ``bye``.
Server → client: ``answer`` (``sdp``, ``call_id``), ``state`` (``live`` once the session
exists, ``unreachable`` while its transceiver does not answer, ``ended``), ``bye``
(``reason``), ``error`` (``code`` — the HTTP status the same failure gets on the REST API —
and ``message``).

One call per socket. Deadlines: the auth message within `ws_auth_timeout`; with no call in
progress, some message within `ws_idle_timeout`; messages over 64 KiB close the socket
(1009). After the answer a watcher probes the session every `call_poll_interval` with an
empty trickle PATCH (204 alive, 404 gone — nothing added to the transceiver for it); the
call ends from the server side when the session is gone, or when its transceiver has been
unreachable for `call_lost_after` seconds (at once if it also left the registry). A ``bye``
from the client ends the call (DELETE). A socket that just closes leaves the call running:
media does not depend on signaling, and the call can still be ended with REST DELETE.
"""

from __future__ import annotations

import json
import logging
import math
from typing import TYPE_CHECKING, Any

import trio
from quart.wrappers.websocket import Websocket

from firsthop.services.signaling.auth import Principal
from firsthop.services.signaling.calls import CallRequest, parse_offer_body
from firsthop.services.signaling.errors import Problem
from firsthop.services.signaling.realtime_session import loads_strict
from firsthop.services.signaling.transceivers import TransceiverDown
from firsthop.services.signaling.trickle import Fragment, check_candidate
from firsthop.shared.redis_store import CallRecord
from firsthop.shared.sdp import MAX_SDP_BYTES

if TYPE_CHECKING:
    from firsthop.services.signaling.context import Context

log = logging.getLogger("firsthop.signaling.ws")

MAX_MESSAGE = 64 * 1024
MAX_BAD_MESSAGES = 8
CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008  # RFC 6455 §7.4.1
CLOSE_TOO_BIG = 1009


class _Closed(Exception):
    """The session is over (the socket has been closed by us)."""


class WsSession:
    def __init__(self, ctx: Context, ws: Websocket) -> None:
        self.ctx = ctx
        self.ws = ws
        self.client_ip = ctx.clients.of(ws.remote_addr, ws.headers.getlist("X-Forwarded-For"))
        self.region_header = ctx.clients.region_of(
            ws.remote_addr, ws.headers.get("X-Client-Region")
        )
        self.principal: Principal | None = None
        self.call: CallRecord | None = None
        self.bad_messages = 0
        self._send_lock = trio.Lock()
        self._closed = False

    async def send(self, message: dict[str, Any]) -> None:
        async with self._send_lock:
            if not self._closed:
                await self.ws.send(json.dumps(message))

    async def error(self, problem: Problem) -> None:
        msg: dict[str, Any] = {"type": "error", "code": problem.status, "message": problem.reason}
        if problem.retry_after is not None:
            msg["retry_after"] = max(1, math.ceil(problem.retry_after))
        await self.send(msg)

    async def close(self, code: int, reason: str = "") -> None:
        async with self._send_lock:
            if not self._closed:
                self._closed = True
                await self.ws.close(code, reason)
        raise _Closed

    async def run(self) -> None:
        self.ctx.stats.ws_active += 1
        try:
            await self.ws.accept()
            async with trio.open_nursery() as nursery:
                try:
                    await self._session(nursery)
                except _Closed:
                    pass
                nursery.cancel_scope.cancel()
        finally:
            self.ctx.stats.ws_active -= 1

    async def _session(self, nursery: trio.Nursery) -> None:
        ctx = self.ctx
        retry = ctx.ip_limiter.check(self.client_ip)
        if retry:
            ctx.stats.rate_limited["ip"] += 1
            await self.error(Problem(429, "too many requests from this address", retry_after=retry))
            await self.close(CLOSE_POLICY, "rate limited")
        header = self.ws.headers.get("Authorization")
        if header:
            await self._authenticate(header)
        auth_deadline = trio.current_time() + ctx.config.ws_auth_timeout
        while True:
            if self.principal is None:
                timeout = auth_deadline - trio.current_time()
            elif self.call is None:
                timeout = ctx.config.ws_idle_timeout
            else:
                timeout = math.inf
            with trio.move_on_after(max(0.0, timeout)) as scope:
                data = await self.ws.receive()
            if scope.cancelled_caught:
                if self.principal is None:
                    await self.error(Problem(401, "no auth message before the deadline"))
                    await self.close(CLOSE_POLICY, "auth deadline")
                await self.error(Problem(408, "idle: no offer"))
                await self.close(CLOSE_NORMAL, "idle")
            await self._handle(data, nursery)

    async def _authenticate(self, header: str) -> None:
        try:
            self.principal = self.ctx.auth.authenticate(header)
        except Problem as problem:
            await self.error(problem)
            await self.close(CLOSE_POLICY, "unauthorized")

    async def _bad(self, problem: Problem) -> None:
        await self.error(problem)
        self.bad_messages += 1
        if self.bad_messages >= MAX_BAD_MESSAGES:
            await self.close(CLOSE_POLICY, "too many bad messages")

    async def _handle(self, data: str | bytes, nursery: trio.Nursery) -> None:
        if len(data) > MAX_MESSAGE:
            await self.error(Problem(413, f"message over {MAX_MESSAGE} bytes"))
            await self.close(CLOSE_TOO_BIG, "message too big")
        if isinstance(data, bytes):
            return await self._bad(Problem(400, "binary messages are not supported"))
        try:
            msg = loads_strict(data)  # (no NaN, no Infinity, not even as 1e999)
        except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested too deep
            return await self._bad(Problem(400, "message is not valid JSON"))
        if not isinstance(msg, dict) or not isinstance(msg.get("type"), str):
            return await self._bad(Problem(400, "message must be an object with a type"))
        kind = msg["type"]
        if self.principal is None:
            if kind != "auth":
                await self.error(Problem(401, "the first message must be auth"))
                await self.close(CLOSE_POLICY, "unauthorized")
            token = msg.get("token")
            if not isinstance(token, str) or not token:
                await self.error(Problem(401, "auth needs a token"))
                await self.close(CLOSE_POLICY, "unauthorized")
            return await self._authenticate(f"Bearer {token}")
        try:
            if kind == "offer":
                await self._offer(msg, nursery)
            elif kind == "candidate":
                await self._candidate(msg)
            elif kind == "bye":
                await self._bye()
            elif kind == "auth":
                raise Problem(400, "already authenticated")
            else:
                raise Problem(400, f"unknown message type {kind[:32]!r}")
        except Problem as problem:
            await self._bad(problem)

    async def _offer(self, msg: dict[str, Any], nursery: trio.Nursery) -> None:
        ctx = self.ctx
        assert self.principal is not None
        if self.call is not None:
            raise Problem(409, "a call is already in progress on this socket")
        sdp, agent = msg.get("sdp"), msg.get("agent")
        if not isinstance(sdp, str):
            raise Problem(400, "offer needs an sdp string")
        if agent is not None and not isinstance(agent, str):
            raise Problem(400, "agent must be a string")
        retry = ctx.key_limiter.check(self.principal.tenant)
        if retry:
            ctx.stats.rate_limited["key"] += 1
            raise Problem(429, "too many requests for this key", retry_after=retry)
        offer = parse_offer_body(sdp.encode("utf-8", "replace")[: MAX_SDP_BYTES + 1])
        record, answer = await ctx.calls.create(
            CallRequest(
                offer=offer,
                agent=agent,
                principal=self.principal,
                region_header=self.region_header,
                client_ip=self.client_ip,
                traceparent=self.ws.headers.get("traceparent"),
            )
        )
        self.call = record
        await self.send({"type": "answer", "sdp": answer, "call_id": record.call_id})
        await self.send({"type": "state", "state": "live"})
        nursery.start_soon(self._watch, record, nursery)

    async def _candidate(self, msg: dict[str, Any]) -> None:
        if self.call is None:
            raise Problem(409, "no call yet: send an offer first")
        candidate = msg.get("candidate")
        mid = msg.get("sdpMid")
        if not isinstance(candidate, str) or (mid is not None and not isinstance(mid, str)):
            raise Problem(400, "candidate must be a string (sdpMid too, when given)")
        if any(c in candidate for c in "\r\n") or (mid and any(c in mid for c in "\r\n")):
            raise Problem(400, "candidate must be one line")
        try:
            candidate.encode()
        except UnicodeEncodeError:  # a lone surrogate from a JSON \u escape
            raise Problem(400, "candidate is not valid text") from None
        candidate = candidate.removeprefix("a=")
        if candidate:  # empty: end-of-candidates
            check_candidate(candidate)
        frag = Fragment(None, None, (candidate,) if candidate else ())
        await self.ctx.calls.trickle(self.call, frag)  # counted and capped; never forwarded

    async def _bye(self) -> None:
        if self.call is not None:
            try:
                await self.ctx.calls.end(self.call)
            except Problem as problem:
                if problem.status != 404:
                    await self.error(problem)
        await self.send({"type": "bye", "reason": "client_bye"})
        await self.close(CLOSE_NORMAL, "bye")

    async def _watch(self, record: CallRecord, nursery: trio.Nursery) -> None:
        """Tell the client when its call ends from the server side."""
        ctx = self.ctx
        client = ctx.calls.client
        last_ok = trio.current_time()
        reachable = True
        try:
            while True:
                await trio.sleep(ctx.config.call_poll_interval)
                try:
                    ended = await client.session_alive(record.api_url, record.session_id)
                except TransceiverDown:
                    if reachable:
                        reachable = False
                        await self.send({"type": "state", "state": "unreachable"})
                    registered = await ctx.calls.directory.is_registered(record.transceiver_id)
                    lost = trio.current_time() - last_ok >= ctx.config.call_lost_after
                    if lost or registered is False:
                        await self._server_bye(record, "transceiver_lost")
                    continue
                if ended is not None:
                    await self._server_bye(record, ended)
                last_ok = trio.current_time()
                if not reachable:
                    reachable = True
                    await self.send({"type": "state", "state": "live"})
        except _Closed:
            nursery.cancel_scope.cancel()  # the receive loop has nothing left to wait for

    async def _server_bye(self, record: CallRecord, reason: str) -> None:
        await self.ctx.calls.store.delete(record.call_id)
        await self.send({"type": "state", "state": "ended"})
        await self.send({"type": "bye", "reason": reason})
        await self.close(CLOSE_NORMAL, reason)
