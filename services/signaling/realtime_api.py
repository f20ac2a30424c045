"""OpenAI's Realtime WebRTC API on signaling (§6): the same paths, bodies and headers.

* ``POST /v1/realtime/client_secrets`` (API key): an ephemeral key (``ek_``, `auth`) bound
  to the posted session config (stored by `stores.EkSessions` until it expires) -> 200
  ``{value, expires_at, session}``. ``POST /v1/dev/realtime/client_secrets``: the same with
  no key, on a ``--dev`` server only (the demo page).
* ``POST /v1/realtime/calls``: a raw ``application/sdp`` offer, or ``multipart/form-data``
  with parts ``sdp`` and ``session`` (what ``openai``'s ``calls.create`` sends), with an API
  key or an ephemeral key -> 201, the ``application/sdp`` answer, ``Location:
  /v1/realtime/calls/{call_id}``. ``POST /v1/realtime?model=...``: the older raw form.
  The call's session config is the ephemeral key's, overridden by the ``session`` part and
  ``?model=``; ``session.model`` picks the agent (`realtime_session.choose_agent`), and the
  config goes to the transceiver as ``session`` in its create body.
* ``POST /v1/realtime/calls/{call_id}/hangup`` ends the call (as ``DELETE /v1/calls/...``)
  -> 200 ``{}``. SIP call control (phone calls with ``--sip-webhook``, `sip.py`): ``accept``
  (the body is the call's session config; its model names the agent: the call is placed
  and answered), ``reject`` (``{"status_code"}``, default 603), ``refer``
  (``{"target_uri"}``: the caller is transferred) -> 200 ``{}``; an API key only; a call that
  is not ringing (accept, reject) or not up (refer), or unknown: 404.
* ``GET /v1/realtime?call_id=...`` (WebSocket, API key only): the sideband. Frames are piped
  both ways to the owning transceiver's ``/internal/v1/sessions/{id}/events``; text only;
  a client's message at most 64 KiB (Hypercorn's limit, as on ``/v1/ws``: 1009), the
  transceiver's at most `MAX_SIDEBAND_MESSAGE`; either side closing closes the other.

A call is an API key's when the key or one of the ephemeral keys it minted created it; an
ephemeral key's when it created it. Someone else's call id: 404, as an unknown one.
Errors on these routes have OpenAI's shape (`realtime_session.openai_error`, rendered by
`app`); rate limits and body limits are those of ``/v1/calls``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio
import trio_websocket
from quart import Response, request, websocket
from quart_trio import QuartTrio

from firsthop.services.signaling.auth import DEV_ISSUER, Principal
from firsthop.services.signaling.bodies import take_slot
from firsthop.services.signaling.calls import (
    CallRequest,
    OfferBody,
    parse_offer_body,
    record_flag,
)
from firsthop.services.signaling.errors import Problem
from firsthop.services.signaling.ratelimit import Slots
from firsthop.services.signaling.realtime_session import (
    check_session,
    choose_agent,
    describe_session,
    openai_error,
    parse_json_object,
    parse_multipart,
    secret_request,
)
from firsthop.services.signaling.responses import answer_response, json_response
from firsthop.services.signaling.sip_calls import PhoneRecord
from firsthop.services.sip.uas import referable
from firsthop.shared.redis_store import CallRecord
from firsthop.shared.sdp import MAX_SDP_BYTES
from firsthop.shared.session_config import MAX_SESSION_BYTES, merge_sessions

if TYPE_CHECKING:
    from firsthop.services.signaling.context import Context

log = logging.getLogger("firsthop.signaling.realtime")

# From the transceiver: as big as a backend's event may be (the agent link's 1 MiB; a
# `conversation.item.retrieved` carries its audio), which had closed the app's socket (1009).
MAX_SIDEBAND_MESSAGE = 1 << 20
MAX_CLIENT_MESSAGE = 64 * 1024  # from the client (Hypercorn closes past a bit more: 1009)
SIDEBAND_CONNECT_TIMEOUT = 3.0
MAX_SIDEBANDS_PER_KEY = 64  # sideband sockets open at once, per API key (429 past it)
MAX_SIDEBANDS = 1024  # ... in all (503 past it): each holds up to a message of 1 MiB
CLOSE_GOING_AWAY = 1001
CLOSE_TOO_BIG = 1009
CLOSE_UNSUPPORTED = 1003


@dataclass(frozen=True)
class Tools:
    """What the routes share with `app.create_app`'s own."""

    limit_ip: Callable[[], None]
    limit_key: Callable[[str], None]
    body_bytes: Callable[[], Awaitable[bytes]]
    client_ip: Callable[[], str]
    region_header: Callable[[], str | None]
    call_id_ok: Callable[[str], None]


def is_realtime_path(path: str) -> bool:
    """The routes whose errors have OpenAI's shape."""
    return path == "/v1/realtime" or path.startswith(("/v1/realtime/", "/v1/dev/realtime/"))


def problem_response(problem: Problem) -> Response:
    """A `Problem` in OpenAI's error shape, with its headers."""
    resp = json_response(openai_error(problem.status, problem.reason), problem.status)
    resp.headers.update(problem.headers)
    return resp


def register(app: QuartTrio, ctx: Context, tools: Tools) -> None:
    config = ctx.config

    async def mint(tenant: str) -> Response:
        seconds, session = secret_request(await tools.body_bytes())
        value, expires_at, ek_id = ctx.auth.ephemeral.mint_with_id(tenant, seconds)
        await ctx.ek_sessions.put(tenant, ek_id, json.dumps(session), expires_at)  # or 429
        described = describe_session(session)
        return json_response({"value": value, "expires_at": expires_at, "session": described})

    @app.post("/v1/realtime/client_secrets")
    async def realtime_client_secret() -> Response:
        tools.limit_ip()
        principal = ctx.auth.realtime(request.headers.get("Authorization"), allow_ek=False)
        tools.limit_key(principal.tenant)
        return await mint(principal.tenant)

    @app.post("/v1/dev/realtime/client_secrets")
    async def dev_realtime_client_secret() -> Response:
        if not config.dev:
            raise Problem(404, "not found")
        tools.limit_ip()
        return await mint(DEV_ISSUER)

    async def bound_session(principal: Principal) -> dict[str, Any]:
        if principal.kind != "ek" or principal.secret_id is None:
            return {}
        stored = await ctx.ek_sessions.get(principal.tenant, principal.secret_id)
        if stored is None:
            raise Problem(401, "ephemeral key unknown here (its session config is gone)")
        return dict(json.loads(stored))

    async def offer_and_session() -> tuple[bytes, dict[str, Any] | None]:
        """(raw offer, the call's own session config or None) from either body form."""
        mimetype = request.mimetype
        if request.content_length is not None and request.content_length > MAX_SDP_BYTES:
            raise Problem(413, f"body over {MAX_SDP_BYTES} bytes")
        if mimetype == "application/sdp":
            return await tools.body_bytes(), None
        if mimetype != "multipart/form-data":
            raise Problem(415, "expected Content-Type: application/sdp or multipart/form-data")
        content_type = request.headers.get("Content-Type", "")
        parts = parse_multipart(await tools.body_bytes(), content_type)
        sdp = parts.get("sdp")
        if sdp is None:
            raise Problem(400, "multipart body without an sdp part")
        session_part = parts.get("session")
        if session_part is None:
            return sdp.data, None
        if len(session_part.data) > MAX_SESSION_BYTES:
            raise Problem(413, f"session is over {MAX_SESSION_BYTES} bytes")
        return sdp.data, check_session(parse_json_object(session_part.data, "session"))

    async def create(model: str | None) -> Response:
        tools.limit_ip()
        if request.mimetype not in ("application/sdp", "multipart/form-data"):
            raise Problem(415, "expected Content-Type: application/sdp or multipart/form-data")
        principal = ctx.auth.realtime(request.headers.get("Authorization"), allow_ek=True)
        tools.limit_key(principal.tenant)
        raw, own = await offer_and_session()
        offer = parse_offer_body(raw)
        session = merge_sessions(
            await bound_session(principal), own, {"model": model} if model else None
        )
        session.setdefault("type", "realtime")
        check_session(session)
        agent = choose_agent(
            session.get("model"), request.args.get("agent"), config.agents, config.default_agent
        )
        record, answer = await ctx.calls.create(
            CallRequest(
                offer=offer,
                agent=agent,
                principal=principal,
                region_header=tools.region_header(),
                client_ip=tools.client_ip(),
                traceparent=request.headers.get("traceparent"),
                session=session,
                record=record_flag(request.args.get("record")),
            )
        )
        return answer_response(answer, record, f"/v1/realtime/calls/{record.call_id}")

    @app.post("/v1/realtime/calls")
    async def realtime_call() -> Response:
        return await create(request.args.get("model"))

    @app.post("/v1/realtime")
    async def realtime_call_legacy() -> Response:
        return await create(request.args.get("model"))

    async def owned_call(call_id: str, principal: Principal) -> CallRecord:
        tools.call_id_ok(call_id)
        record = await ctx.calls.store.get(call_id)
        if record is None or not principal.owns(record.owner):
            raise Problem(404, "no such call")
        return record

    @app.post("/v1/realtime/calls/<call_id>/hangup")
    async def realtime_hangup(call_id: str) -> Response:
        tools.limit_ip()
        principal = ctx.auth.realtime(
            request.headers.get("Authorization"), allow_ek=True, allow_expired=True
        )
        record = await owned_call(call_id, principal)
        await ctx.calls.end(record)
        return json_response({})

    async def ringing_call(call_id: str) -> tuple[Principal, PhoneRecord]:
        tools.limit_ip()
        principal = ctx.auth.realtime(request.headers.get("Authorization"), allow_ek=False)
        tools.limit_key(principal.tenant)
        tools.call_id_ok(call_id)
        phone = await ctx.phones.get(call_id)
        if phone is None or phone.state != "ringing":
            raise Problem(404, "no such call ringing")
        return principal, phone

    async def json_object(what: str) -> dict[str, Any]:
        raw = await tools.body_bytes()
        return parse_json_object(raw or b"{}", what)

    @app.post("/v1/realtime/calls/<call_id>/accept")
    async def realtime_accept(call_id: str) -> Response:
        principal, phone = await ringing_call(call_id)
        session = check_session(await json_object("session"))
        session.setdefault("type", "realtime")
        # (extension, as on /v1/calls; a trunk the operator records is recorded whatever
        # the app says, and the file is the accepting key's like the call)
        recorded = record_flag(request.args.get("record")) or phone.trunk in config.sip_record
        if not await ctx.phones.move(call_id, "ringing", state="accepted"):
            raise Problem(404, "no such call ringing")  # (a CANCEL, or another accept, won)
        agent = choose_agent(session.get("model"), None, config.agents, config.default_agent)
        call = CallRequest(
            offer=OfferBody(phone.offer, ""),
            agent=agent,
            principal=principal,
            region_header=tools.region_header(),
            client_ip=phone.source,
            traceparent=request.headers.get("traceparent"),
            session=session,
            media="rtp",
            call_id=call_id,
            record=recorded,
        )
        # Shielded (placing is bounded by its own timeouts): an app that went away mid-accept
        # had left the call "accepted" for good, its session placed and never ended, and
        # the ringing call's task polling it without a pause until the record expired.
        with trio.CancelScope(shield=True):
            try:
                record, answer = await ctx.calls.create(call)
            except Problem as problem:  # the trunk hears it (488 for an offer we cannot take)
                status = 488 if problem.status == 400 else 503
                await ctx.phones.move(call_id, "accepted", state="rejected", status=status)
                raise
            except BaseException:
                await ctx.phones.move(call_id, "accepted", state="rejected", status=503)
                raise
            if not await ctx.phones.move(call_id, "accepted", state="answered", answer=answer):
                await ctx.calls.end(record)  # (the caller hung up while it was being placed)
                raise Problem(404, "the call ended before it was answered")
        return json_response({})

    @app.post("/v1/realtime/calls/<call_id>/reject")
    async def realtime_reject(call_id: str) -> Response:
        _, phone = await ringing_call(call_id)
        body = await json_object("body")
        status = body.get("status_code", 603)
        if type(status) is not int or not 400 <= status <= 699:
            raise Problem(400, "status_code must be a SIP status, 400-699")
        if not await ctx.phones.move(call_id, "ringing", state="rejected", status=status):
            raise Problem(404, "no such call ringing")
        return json_response({})

    @app.post("/v1/realtime/calls/<call_id>/refer")
    async def realtime_refer(call_id: str) -> Response:
        tools.limit_ip()
        principal = ctx.auth.realtime(request.headers.get("Authorization"), allow_ek=False)
        await owned_call(call_id, principal)
        target = (await json_object("body")).get("target_uri")
        if not isinstance(target, str) or not referable(target):
            raise Problem(400, "target_uri must be a sip:, sips: or tel: URI")
        if not await ctx.phones.move(call_id, "answered", refer=target):
            raise Problem(404, "no such phone call up")
        return json_response({})

    sidebands = Slots(MAX_SIDEBANDS, MAX_SIDEBANDS_PER_KEY)  # held while a socket is open

    @app.websocket("/v1/realtime")
    async def sideband() -> Response | None:
        try:
            forwarded = websocket.headers.getlist("X-Forwarded-For")
            retry = ctx.ip_limiter.check(ctx.clients.of(websocket.remote_addr, forwarded))
            if retry:
                ctx.stats.rate_limited["ip"] += 1
                raise Problem(429, "too many requests from this address", retry_after=retry)
            call_id = websocket.args.get("call_id")
            if not call_id:
                raise Problem(400, "a WebSocket to /v1/realtime needs ?call_id= (a call's id)")
            principal = ctx.auth.realtime(websocket.headers.get("Authorization"), allow_ek=False)
            record = await owned_call(call_id, principal)
            take_slot(
                sidebands,
                principal.tenant,
                ctx.stats.counters,
                ("sideband_refused_key", "sideband_refused_total"),
                ("too many sideband sockets for this key", "too many sideband sockets"),
                1,
            )
        except Problem as problem:
            return problem_response(problem)
        try:
            return await Sideband(ctx, record).run()
        finally:
            sidebands.give_back(principal.tenant)


class Sideband:
    """One sideband socket: the client's (Quart) piped to the transceiver's (trio-websocket)."""

    def __init__(self, ctx: Context, record: CallRecord) -> None:
        self.ctx = ctx
        self.record = record

    def upstream_url(self) -> str:
        base = self.record.api_url
        scheme, sep, rest = base.partition("://")
        ws_scheme = {"http": "ws", "https": "wss"}.get(scheme, scheme)
        return f"{ws_scheme}{sep}{rest}/internal/v1/sessions/{self.record.session_id}/events"

    async def run(self) -> Response | None:
        token = self.ctx.config.internal_token
        headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
        client = websocket._get_current_object()  # type: ignore[attr-defined]
        accepted = False
        try:
            async with trio_websocket.open_websocket_url(
                self.upstream_url(),
                extra_headers=headers,
                max_message_size=MAX_SIDEBAND_MESSAGE,
                connect_timeout=SIDEBAND_CONNECT_TIMEOUT,
                disconnect_timeout=SIDEBAND_CONNECT_TIMEOUT,
            ) as upstream:
                await client.accept()
                accepted = True
                self.ctx.stats.counters["sideband_opened"] += 1
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._down, upstream, client, nursery.cancel_scope)
                    nursery.start_soon(self._up, upstream, client, nursery.cancel_scope)
        except trio_websocket.HandshakeError as exc:
            if accepted:  # a slow close of the transceiver's end: both are over anyway
                return None
            status = getattr(exc, "status_code", None)
            if status == 404:
                return problem_response(Problem(404, "call has ended"))
            if status == 429:  # the transceiver's bound on a call's sidebands
                return problem_response(
                    Problem(429, "too many sideband sockets for this call", retry_after=1)
                )
            log.warning("sideband for call %s: transceiver refused: %s", self.record.call_id, exc)
            return problem_response(Problem(503, "transceiver unreachable", retry_after=1))
        except OSError as exc:
            if accepted:
                return None
            log.warning("sideband for call %s: %s", self.record.call_id, exc)
            return problem_response(Problem(503, "transceiver unreachable", retry_after=1))
        return None

    async def _down(
        self, upstream: trio_websocket.WebSocketConnection, client: Any, scope: trio.CancelScope
    ) -> None:
        """Transceiver -> client, until the transceiver closes."""
        try:
            while True:
                message = await upstream.get_message()
                if isinstance(message, str):
                    await client.send(message)
        except trio_websocket.ConnectionClosed as exc:
            code = exc.reason.code if exc.reason is not None else CLOSE_GOING_AWAY
            await _close_client(client, sendable(code), "call ended")
        scope.cancel()

    async def _up(
        self, upstream: trio_websocket.WebSocketConnection, client: Any, scope: trio.CancelScope
    ) -> None:
        """Client -> transceiver, until the client closes or breaks a rule."""
        try:
            while True:
                data = await client.receive()
                if isinstance(data, bytes):
                    await _close_client(client, CLOSE_UNSUPPORTED, "text frames only")
                    break
                if len(data.encode()) > MAX_CLIENT_MESSAGE:
                    await _close_client(client, CLOSE_TOO_BIG, "message too big")
                    break
                await upstream.send_message(data)
        except trio_websocket.ConnectionClosed:
            await _close_client(client, CLOSE_GOING_AWAY, "call ended")
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(SIDEBAND_CONNECT_TIMEOUT):
                await upstream.aclose()
        scope.cancel()


def sendable(code: int) -> int:
    """The transceiver's close code as one we may send on: 1005/1006/1015 are never sent,
    and its 4404 (no such session) means the call is over."""
    if code in (1000, 1001, 1003, 1008, 1009, 1011) or 3000 <= code < 4000:
        return code
    return CLOSE_GOING_AWAY


async def _close_client(client: Any, code: int, reason: str) -> None:
    try:
        await client.close(code, reason)
    except Exception:  # already closed by its peer
        pass
