"""The public HTTP API on Quart-Trio (§6): WHIP-style calls, client secrets, WS, health.

Every failure is ``{"error": "<reason>"}`` with its status (a `Problem`, or a framework
HTTP error such as 404/405/413 rendered the same way); only a bug in this code is a 500.
Checks run cheapest first: per-IP rate limit, Content-Type, declared size, credential,
per-key rate limit, then the body (size while reading, SDP sanity) and finally placement.
PATCH and DELETE spend from the same per-IP bucket; a PATCH is then checked as an sdpfrag and
answered here unless it restarts ICE (`trickle`).
Bodies are read under a deadline and a cap on uploads in progress (`bodies.Bodies`); a request
whose body was not read (an early answer) gets it drained under the same rules, or its
connection closes.

In ``--dev`` mode (client secrets with no key, loopback only) every request and WebSocket
upgrade must name a loopback Host (``localhost``, 127.0.0.0/8, ``[::1]``, any port); anything
else is 403 before any route runs, so a page on another site whose name resolves to 127.0.0.1
(DNS rebinding) cannot mint a secret. Only the demo page is served: no static folder.

CORS: responses on ``/v1/`` carry ``Access-Control-Allow-Origin`` for the configured
origins (``*`` allows any) and expose ``Location`` (WHIP clients need it), ``Retry-After``
and ``ETag``; ``OPTIONS`` preflights are answered 204 before any route runs.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import trio
from quart import Response, g, has_request_context, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from firsthop.services.signaling import realtime_api
from firsthop.services.signaling.auth import DEV_ISSUER
from firsthop.services.signaling.bodies import take_slot
from firsthop.services.signaling.calls import CallRequest, parse_offer_body, record_flag
from firsthop.services.signaling.context import Context
from firsthop.services.signaling.errors import Problem
from firsthop.services.signaling.responses import answer_response, json_response
from firsthop.services.signaling.transceivers import SDPFRAG
from firsthop.services.signaling.trickle import parse_fragment
from firsthop.services.signaling.ws import WsSession
from firsthop.shared.address import is_loopback, parse_hostport, source_key
from firsthop.shared.metrics import CONTENT_TYPE, render
from firsthop.shared.sdp import MAX_SDP_BYTES
from firsthop.shared.session_config import NOISE_REDUCTION_KINDS

DEMO_PAGE = (Path(__file__).parent / "static" / "index.html").read_bytes()

log = logging.getLogger("firsthop.signaling")

CALL_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
CORS_METHODS = "GET, POST, PATCH, DELETE, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type, If-Match, traceparent"
# What OpenAI's client libraries send (X-Stainless-*: any, reflected when asked for).
REALTIME_CORS_HEADERS = {
    "authorization",
    "content-type",
    "accept",
    "openai-beta",
    "openai-organization",
    "openai-project",
    "x-openai-agents-sdk",
    "traceparent",
    "user-agent",
}
CORS_EXPOSE = "Location, Retry-After, ETag, Link, X-Firsthop-Transceiver, X-Firsthop-Region"
BODY_DRAIN_TIMEOUT = 2.0
DOWNLOAD_RETRY = 5.0  # seconds: Retry-After when a recording cannot be streamed now
# The methods a route may have (RFC 9110 §9.3, RFC 5789); any other token is answered 501
# after the per-IP budget is spent, its connection closed, and counted as "other": a metric
# label takes its values from a closed set.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def problem_response(problem: Problem) -> Response:
    if has_request_context() and realtime_api.is_realtime_path(request.path):
        return realtime_api.problem_response(problem)  # OpenAI's error shape
    resp = json_response({"error": problem.reason}, problem.status)
    resp.headers.update(problem.headers)
    return resp


def loopback_host(host: str | None) -> bool:
    """Whether a Host header names this machine's loopback (any port)."""
    try:
        name, _ = parse_hostport(host or "", default_port=80)
    except ValueError:
        return False
    return is_loopback(name)


def create_app(ctx: Context) -> QuartTrio:
    # static_folder=None: Quart's default serves ./static of the working directory.
    app = QuartTrio("firsthop-signaling", static_folder=None)
    config = ctx.config
    app.config["MAX_CONTENT_LENGTH"] = MAX_SDP_BYTES
    app.config["BODY_TIMEOUT"] = config.body_timeout  # Quart's, per read: ours is in total
    origins = set(config.cors_origins)

    def allowed_origin() -> str | None:
        origin = request.headers.get("Origin")
        if origin is None or not origins:
            return None
        if "*" in origins:
            return "*"
        return origin if origin in origins else None

    def allow_headers() -> str:
        if not realtime_api.is_realtime_path(request.path):
            return CORS_HEADERS
        asked = request.headers.get("Access-Control-Request-Headers", "")
        names = [h.strip().lower() for h in asked.split(",") if h.strip()][:64]
        allowed = [h for h in names if h in REALTIME_CORS_HEADERS or h.startswith("x-stainless-")]
        return ", ".join(dict.fromkeys([*sorted(REALTIME_CORS_HEADERS), *allowed]))

    def client_ip() -> str:  # the peer, or who a trusted proxy forwarded for
        return ctx.clients.of(request.remote_addr, request.headers.getlist("X-Forwarded-For"))

    def region_header() -> str | None:  # X-Client-Region, where its sender is believed
        return ctx.clients.region_of(request.remote_addr, request.headers.get("X-Client-Region"))

    def limit_ip() -> None:
        retry = ctx.ip_limiter.check(client_ip())
        if retry:
            ctx.stats.rate_limited["ip"] += 1
            raise Problem(429, "too many requests from this address", retry_after=retry)

    def limit_key(tenant: str) -> None:
        retry = ctx.key_limiter.check(tenant)
        if retry:
            ctx.stats.rate_limited["key"] += 1
            raise Problem(429, "too many requests for this key", retry_after=retry)

    def require_type(mimetype: str) -> None:
        if request.mimetype != mimetype:
            raise Problem(415, f"expected Content-Type: {mimetype}")
        if request.content_length is not None and request.content_length > MAX_SDP_BYTES:
            raise Problem(413, f"body over {MAX_SDP_BYTES} bytes")

    async def body_bytes() -> bytes:
        # 413 past MAX_CONTENT_LENGTH, even when chunked; 408 past the deadline; 429/503
        # when too many uploads are in progress (then nothing more of it is read).
        try:
            return await ctx.bodies.read(request, source_key(client_ip()), g.body_deadline)
        except Problem:
            g.body_abandoned = True
            raise

    def call_id_ok(call_id: str) -> None:
        if not CALL_ID.fullmatch(call_id):  # (`$` alone lets a trailing newline through)
            raise Problem(404, "no such call")

    def dev_host_only(host: str | None) -> None:
        if config.dev and not loopback_host(host):
            raise Problem(403, "--dev server: the Host header must name a loopback address")

    @app.before_request
    async def check_host() -> None:
        g.body_deadline = ctx.bodies.deadline()  # first: the body's clock starts at arrival
        if request.method not in METHODS:
            g.close_connection = True
            limit_ip()
            raise Problem(501, "method not implemented")
        dev_host_only(request.headers.get("Host"))

    @app.before_websocket
    async def check_ws_host() -> None:
        dev_host_only(websocket.headers.get("Host"))

    @app.before_request
    async def preflight() -> Response | None:
        if request.method == "OPTIONS" and request.path.startswith("/v1/"):
            return Response("", status=204)
        return None

    async def body_drained() -> bool:
        """Read what is left of a small request body that an early answer (401, 415, 429,
        404, ...) skipped. Hypercorn may otherwise drop a keep-alive connection with a request
        half read, and the client's next request on it hangs. False: close the connection."""
        length = request.content_length
        if g.get("body_abandoned") or (length is not None and length > MAX_SDP_BYTES):
            return False
        deadline = min(g.body_deadline, trio.current_time() + BODY_DRAIN_TIMEOUT)
        return await ctx.bodies.drain(request, source_key(client_ip()), deadline)

    @app.after_request
    async def finish(response: Response) -> Response:
        if g.get("close_connection") or (
            request.method not in ("GET", "HEAD", "OPTIONS") and not await body_drained()
        ):
            response.headers["Connection"] = "close"
        if request.path.startswith("/v1/"):
            origin = allowed_origin()
            if origin is not None:
                response.headers["Access-Control-Allow-Origin"] = origin
                response.headers["Access-Control-Expose-Headers"] = CORS_EXPOSE
                if origin != "*":
                    response.headers["Vary"] = "Origin"
                if request.method == "OPTIONS":
                    response.headers["Access-Control-Allow-Methods"] = CORS_METHODS
                    response.headers["Access-Control-Allow-Headers"] = allow_headers()
                    response.headers["Access-Control-Max-Age"] = "600"
        rule = request.url_rule.rule if request.url_rule is not None else "unmatched"
        method = request.method if request.method in METHODS else "other"
        ctx.stats.requests[(method, rule, response.status_code)] += 1
        return response

    @app.errorhandler(Problem)
    async def on_problem(problem: Problem) -> Response:
        return problem_response(problem)

    @app.errorhandler(HTTPException)
    async def on_http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        reason = {
            408: f"request body not complete within {config.body_timeout:g} s",
            413: f"body over {MAX_SDP_BYTES} bytes",
        }.get(status, exc.name.lower())
        return problem_response(Problem(status, reason))

    @app.errorhandler(Exception)
    async def on_bug(exc: Exception) -> Response:
        if not has_request_context():  # a WebSocket route's
            log.exception("unhandled error on WebSocket %s", websocket.path)
            return json_response({"error": "internal error"}, 500)
        log.exception("unhandled error on %s %s", request.method, request.path)
        if realtime_api.is_realtime_path(request.path):
            return realtime_api.problem_response(Problem(500, "internal error"))
        return json_response({"error": "internal error"}, 500)

    @app.post("/v1/calls")
    async def create_call() -> Response:
        limit_ip()
        require_type("application/sdp")
        principal = ctx.auth.authenticate(request.headers.get("Authorization"))
        limit_key(principal.tenant)
        offer = parse_offer_body(await body_bytes())
        denoise = request.args.get("noise_reduction")  # the native call's options
        if denoise is not None and denoise not in NOISE_REDUCTION_KINDS:
            raise Problem(400, "noise_reduction must be near_field or far_field")
        recorded = record_flag(request.args.get("record"))
        record, answer = await ctx.calls.create(
            CallRequest(
                offer=offer,
                agent=request.args.get("agent"),
                principal=principal,
                region_header=region_header(),
                client_ip=client_ip(),
                traceparent=request.headers.get("traceparent"),
                session=(
                    {"audio": {"input": {"noise_reduction": {"type": denoise}}}}
                    if denoise is not None
                    else None
                ),
                record=recorded,
            )
        )
        return answer_response(answer, record, f"/v1/calls/{record.call_id}")

    @app.get("/v1/calls/<call_id>/recording")
    async def get_recording(call_id: str) -> Response:
        """The call's recording (Ogg/Opus, or a G.711 phone call's WAVE; caller left, agent
        right), for the credential that placed the call (any route's), once it has ended."""
        limit_ip()
        call_id_ok(call_id)
        principal = ctx.auth.any_credential(request.headers.get("Authorization"))
        tenant = principal.tenant
        take_slot(
            ctx.downloads,
            tenant,
            ctx.stats.counters,
            ("recording_downloads_refused_key", "recording_downloads_refused_total"),
            (
                f"this key streams its most recordings at once ({ctx.downloads.per_key})",
                "too many recordings are being streamed",
            ),
            DOWNLOAD_RETRY,
        )
        try:
            found = await ctx.calls.recording(call_id, principal)
        except BaseException:
            ctx.downloads.give_back(tenant)
            raise
        chunks = ctx.downloads.held_while(tenant, found.chunks)  # (the slot: while it streams)
        resp = Response(chunks, status=200, content_type=found.media_type)
        if found.length is not None and found.length.isascii() and found.length.isdigit():
            resp.headers["Content-Length"] = found.length
        resp.headers["X-Content-Type-Options"] = "nosniff"  # (callers' bytes are in it)
        return resp

    @app.patch("/v1/calls/<call_id>")
    async def patch_call(call_id: str) -> Response:
        limit_ip()
        call_id_ok(call_id)
        principal = ctx.auth.authenticate(request.headers.get("Authorization"), allow_expired=True)
        require_type(SDPFRAG)
        body = await body_bytes()
        record = await ctx.calls.find(call_id, principal)  # (its own call's, before any parse)
        try:
            frag = parse_fragment(body.decode("utf-8"))
        except UnicodeDecodeError:
            raise Problem(400, "sdpfrag is not UTF-8") from None
        answer = await ctx.calls.trickle(record, frag)
        if answer is None:
            return Response("", status=204)
        return Response(answer, status=200, content_type=SDPFRAG)

    @app.delete("/v1/calls/<call_id>")
    async def delete_call(call_id: str) -> Response:
        limit_ip()
        call_id_ok(call_id)
        principal = ctx.auth.authenticate(request.headers.get("Authorization"), allow_expired=True)
        record = await ctx.calls.find(call_id, principal)
        await ctx.calls.end(record)
        return Response("", status=204)

    @app.post("/v1/client_secrets")
    async def client_secret() -> Response:
        limit_ip()
        principal = ctx.auth.api_key_only(request.headers.get("Authorization"))
        limit_key(principal.tenant)
        value, expires_at = ctx.auth.secrets.mint(principal.tenant)
        return json_response({"value": value, "expires_at": expires_at}, 201)

    @app.get("/v1/dev/secret")
    async def dev_secret() -> Response:
        if not config.dev:
            raise Problem(404, "not found")
        limit_ip()
        value, expires_at = ctx.auth.secrets.mint(DEV_ISSUER)
        return json_response({"value": value, "expires_at": expires_at}, 200)

    realtime_api.register(
        app,
        ctx,
        realtime_api.Tools(
            limit_ip=limit_ip,
            limit_key=limit_key,
            body_bytes=body_bytes,
            client_ip=client_ip,
            region_header=region_header,
            call_id_ok=call_id_ok,
        ),
    )

    @app.websocket("/v1/ws")
    async def ws() -> None:
        await WsSession(ctx, websocket._get_current_object()).run()  # type: ignore[attr-defined]

    @app.get("/")
    async def demo_page() -> Response:
        # The demo page (static, no build step). It gets its client secret from
        # /v1/dev/secret, so it places calls only on a --dev server on loopback.
        return Response(DEMO_PAGE, content_type="text/html; charset=utf-8")

    @app.get("/healthz")
    async def healthz() -> Response:
        transceivers = await ctx.calls.directory.snapshot()
        return json_response(
            {"ok": True, "region": config.region, "transceivers": len(transceivers)}
        )

    @app.get("/readyz")
    async def readyz() -> Response:
        # Ready means a call placed now would find a transceiver (Redis's registry re-read
        # when the copy shows none): what a load balancer and `firsthop up` wait for.
        n = await ctx.calls.placeable()
        if not n:
            body = {"ready": False, "reason": "no transceiver can take a call"}
            return json_response(body, 503)
        return json_response({"ready": True, "transceivers": n})

    @app.get("/metrics")
    async def metrics() -> Response:
        families = [*ctx.stats.families(), ctx.bodies.metric()]
        return Response(render(families), content_type=CONTENT_TYPE)

    return app
