"""The transceiver's internal HTTP API (docs/architecture.md §7) on Quart-Trio.

`POST /internal/v1/sessions` (offer -> answer), `PATCH` (trickle-ice-sdpfrag: candidates are
accepted and ignored — an ICE-lite server never checks them — and new ice-ufrag/ice-pwd mean
an ICE restart, answered with the new server credentials), `DELETE`, `POST /internal/v1/drain`,
`GET /healthz`, `GET /metrics`; and the sideband WebSocket `/internal/v1/sessions/<id>/events`:
copies of every server event the call's caller gets, and client events handled as if they came
on its data channel (`Session.open_sideband`: at most 4 a session, each with a bounded queue).
Bad input is a 4xx with a reason, never a 500.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import trio
from quart import Response, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from firsthop.services.transceiver.recordings import MEDIA_TYPES
from firsthop.services.transceiver.service import Transceiver
from firsthop.services.transceiver.table import Refusal
from firsthop.shared import memory
from firsthop.shared.address import parse_hostport
from firsthop.shared.metrics import CONTENT_TYPE, MetricFamily, render
from firsthop.shared.sdp import MAX_SDP_BYTES, sdpfrag_credentials
from firsthop.shared.session_config import (
    MAX_SESSION_BYTES,
    SessionConfigError,
    check_bounds,
    noise_reduction,
)

MAX_TCP_INGRESS = 8  # ICE-TCP ingress addresses one answer advertises
MAX_PROBED = 1000  # session ids one /sessions/ended probe may ask about
MAX_BODY = MAX_SDP_BYTES + MAX_SESSION_BYTES + 4096
BODY_TIMEOUT = 10.0  # bodies come from signaling, whole: seconds is generous
RECORDING_CHUNK = 1 << 16  # bytes of a recording read and sent at a time
SIDEBAND_DRAIN = 2.0  # seconds a sideband may take for what was queued when its call ended


def _error(status: int, reason: str) -> Response:
    return Response(json.dumps({"error": reason}), status=status, content_type="application/json")


def create_app(tx: Transceiver) -> QuartTrio:
    app = QuartTrio("firsthop-transceiver", static_folder=None)  # no ./static of the cwd
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY
    app.config["BODY_TIMEOUT"] = BODY_TIMEOUT
    token = tx.config.internal_token

    @app.before_request
    async def guard() -> Response | None:
        if request.path.startswith("/internal/") and token:
            got = request.headers.get("Authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
                return _error(401, "missing or wrong internal token")
        if request.content_length is not None and request.content_length > MAX_BODY:
            return _error(413, f"body over {MAX_BODY} bytes")
        return None

    @app.before_websocket
    async def ws_guard() -> Response | None:
        if websocket.path.startswith("/internal/") and token:
            got = websocket.headers.get("Authorization", "")
            if not hmac.compare_digest(got.encode(), f"Bearer {token}".encode()):
                return _error(401, "missing or wrong internal token")
        return None

    @app.errorhandler(HTTPException)
    async def on_http_error(exc: HTTPException) -> Response:  # 404, 405, 408, 413, ...
        return _error(exc.code or 500, exc.name.lower())

    async def _json_body() -> dict[str, Any] | Response:
        if request.mimetype != "application/json":
            return _error(415, "expected application/json")
        try:
            body = json.loads(await request.get_data(as_text=True))
        except (ValueError, RecursionError):  # RecursionError: nested too deep
            return _error(400, "body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "body must be a JSON object")
        return body

    @app.post("/internal/v1/sessions")
    async def create() -> Response:
        body = await _json_body()
        if isinstance(body, Response):
            return body
        offer = body.get("offer_sdp")
        call_id = body.get("call_id")
        ingress_raw = body.get("ingress")
        if not isinstance(offer, str) or not offer:
            return _error(400, "offer_sdp (string) is required")
        if not isinstance(call_id, str) or not call_id:
            return _error(400, "call_id (string) is required")
        if not isinstance(ingress_raw, list) or not all(isinstance(i, str) for i in ingress_raw):
            return _error(400, "ingress must be a list of HOST:PORT strings")
        try:
            ingress = [parse_hostport(i) for i in ingress_raw]
        except ValueError as exc:
            return _error(400, f"bad ingress: {exc}")
        tcp_raw = body.get("ingress_tcp", [])
        if (
            not isinstance(tcp_raw, list)
            or len(tcp_raw) > MAX_TCP_INGRESS
            or not all(isinstance(i, str) for i in tcp_raw)
        ):
            return _error(400, f"ingress_tcp must be a list of at most {MAX_TCP_INGRESS} HOST:PORT")
        try:
            ingress_tcp = [parse_hostport(i) for i in tcp_raw]
        except ValueError as exc:
            return _error(400, f"bad ingress_tcp: {exc}")
        agent_url = body.get("agent_url")
        region = body.get("region")
        if agent_url is not None and not isinstance(agent_url, str):
            return _error(400, "agent_url must be a string")
        session_config = body.get("session")
        if session_config is not None:
            if not isinstance(session_config, dict):
                return _error(400, "session must be a JSON object")
            try:
                check_bounds(session_config)
                noise_reduction(session_config)
            except SessionConfigError as exc:
                return _error(400, exc.reason)
        media = body.get("media", "webrtc")
        if media not in ("webrtc", "rtp"):
            return _error(400, "media must be webrtc or rtp")
        record = body.get("record", False)
        if not isinstance(record, bool):
            return _error(400, "record must be true or false")
        try:
            if media == "rtp":  # a phone call: the trunk's plain RTP offer
                session_id, answer = await tx.create_phone_session(
                    call_id=call_id,
                    offer_sdp=offer,
                    ingress=ingress,
                    agent_url=agent_url,
                    region=region if isinstance(region, str) else None,
                    traceparent=request.headers.get("traceparent"),
                    session_config=session_config,
                    record=record,
                )
            else:
                session_id, answer = await tx.create_session(
                    call_id=call_id,
                    offer_sdp=offer,
                    ingress=ingress,
                    ingress_tcp=ingress_tcp,
                    agent_url=agent_url,
                    region=region if isinstance(region, str) else None,
                    traceparent=request.headers.get("traceparent"),
                    session_config=session_config,
                    record=record,
                )
        except Refusal as exc:
            resp = _error(exc.status, exc.reason)
            if exc.status == 503:
                resp.headers["Retry-After"] = "1"
            return resp
        return Response(
            json.dumps({"session_id": session_id, "answer_sdp": answer}),
            status=201,
            content_type="application/json",
        )

    def _gone(session_id: str) -> Response:
        reason = tx.table.ended.get(session_id)
        if reason is None:
            return _error(404, "no such session")
        tx.reason_read(session_id)
        body = {"error": "session ended", "reason": reason}
        return Response(json.dumps(body), status=404, content_type="application/json")

    @app.get("/internal/v1/recordings/<call_id>")
    async def recording(call_id: str) -> Response:
        """A finished recording: Ogg/Opus, or a G.711 call's WAVE (signaling serves it to the
        call's owner)."""
        found = tx.recordings.find(call_id) if tx.recordings is not None else None
        if found == "live":
            return _error(409, "the call is still being recorded")
        if not isinstance(found, Path):
            return _error(404, "no recording of this call")
        try:  # (opened now: a sweep that removes it meanwhile leaves this read whole)
            file = await trio.to_thread.run_sync(found.open, "rb")
        except OSError:
            return _error(404, "no recording of this call")

        async def body() -> AsyncIterator[bytes]:  # streamed: a long call's file is big
            try:
                while chunk := await trio.to_thread.run_sync(file.read, RECORDING_CHUNK):
                    yield chunk
            finally:
                file.close()

        resp = Response(body(), status=200, content_type=MEDIA_TYPES[found.suffix])
        resp.headers["Content-Length"] = str(os.fstat(file.fileno()).st_size)
        return resp

    @app.post("/internal/v1/sessions/ended")
    async def ended() -> Response:
        """Which of `ids` have ended, and why: one probe for many calls (signaling's SIP
        front watches every phone call it holds on this transceiver with one request)."""
        body = await _json_body()
        if isinstance(body, Response):
            return body
        ids = body.get("ids")
        if (
            not isinstance(ids, list)
            or len(ids) > MAX_PROBED
            or not all(isinstance(i, str) and len(i) <= 64 for i in ids)
        ):
            return _error(400, f"ids must be a list of at most {MAX_PROBED} session ids")
        gone: dict[str, str] = {}
        for session_id in ids:
            if session_id not in tx.table.entries:
                gone[session_id] = tx.table.ended.get(session_id) or "session_ended"
                tx.reason_read(session_id)
        return Response(json.dumps({"ended": gone}), content_type="application/json")

    @app.patch("/internal/v1/sessions/<session_id>")
    async def patch(session_id: str) -> Response:
        if session_id not in tx.table.entries:
            return _gone(session_id)
        if request.mimetype != "application/trickle-ice-sdpfrag":
            return _error(415, "expected application/trickle-ice-sdpfrag")
        raw = await request.get_data(as_text=False)
        try:
            frag = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError:
            return _error(400, "sdpfrag is not UTF-8")
        ufrag, pwd, candidates = sdpfrag_credentials(frag)
        tx.counters["trickle_candidates_ignored"] += len(candidates)
        if ufrag is None and pwd is None:
            return Response("", status=204)
        if not ufrag or not pwd:
            return _error(400, "an ICE restart needs both a=ice-ufrag and a=ice-pwd")
        if ufrag == tx.table.creds(session_id).remote_ufrag:
            return Response("", status=204)  # same credentials: plain trickle
        creds = tx.restart_ice(session_id, ufrag, pwd)
        body = f"a=ice-ufrag:{creds.local_ufrag}\r\na=ice-pwd:{creds.local_pwd}\r\n"
        return Response(body, status=200, content_type="application/trickle-ice-sdpfrag")

    @app.delete("/internal/v1/sessions/<session_id>")
    async def delete(session_id: str) -> Response:
        if not tx.end_session(session_id, "deleted"):
            return _gone(session_id)
        return Response("", status=204)

    @app.websocket("/internal/v1/sessions/<session_id>/events")
    async def sideband(session_id: str) -> Response | None:
        session = tx.session(session_id)
        if session is None:
            return _error(404, "no such session")
        feed = session.open_sideband()
        if feed is None:
            tx.counters["sideband_refused"] += 1
            return _error(429, "too many sideband sockets for this session")
        send, receive = feed
        accepted = False
        try:
            await websocket.accept()
            accepted = True
            tx.counters["sideband_opened"] += 1
            async with trio.open_nursery() as nursery:

                async def events_out() -> None:
                    async for text, size in receive:
                        session.sideband_took(send, size)
                        await websocket.send(text)
                    nursery.cancel_scope.cancel()  # the session is over

                async def call_over() -> None:
                    await session.ended.wait()  # what is queued gets a moment, not forever
                    nursery.cancel_scope.deadline = trio.current_time() + SIDEBAND_DRAIN

                nursery.start_soon(events_out)
                nursery.start_soon(call_over)
                while True:
                    message = await websocket.receive()
                    await session.sideband_turn()
                    session.client_message(message, send)
        finally:
            session.close_sideband(send)
            if accepted:  # (opened less closed: the sockets still held)
                tx.counters["sideband_closed"] += 1
        return None

    @app.post("/internal/v1/drain")
    async def drain() -> Response:
        tx.start_drain(tx.config.drain_seconds)
        return Response(
            json.dumps({"draining": True, "sessions": len(tx.table)}),
            content_type="application/json",
        )

    @app.get("/healthz")
    async def healthz() -> Response:
        # 503 until it is in the registry: a transceiver said ready is one signaling finds
        body = {"ok": tx.ready, "draining": tx.draining, "sessions": len(tx.table)}
        status = 200 if tx.ready else 503
        return Response(json.dumps(body), status=status, content_type="application/json")

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(transceiver_metrics(tx), content_type=CONTENT_TYPE)

    return app


# Exported from the start, at 0, so that the alert rules' rate() sees the first one
# (monitoring/rules.yml): a series that first appears at 1 shows no increase.
ALERTED_EVENTS = frozenset({"agent_failures", "session_errors"})


def transceiver_metrics(tx: Transceiver) -> str:
    sessions = MetricFamily("firsthop_transceiver_sessions", "gauge", "Live sessions")
    sessions.add(len(tx.table))
    capacity = MetricFamily(
        "firsthop_transceiver_capacity", "gauge", "Most concurrent sessions (--capacity)"
    )
    capacity.add(tx.config.capacity)
    drops = MetricFamily(
        "firsthop_transceiver_drops_total", "counter", "Datagrams dropped by the mux, by reason"
    )
    for reason, n in sorted(tx.table.mux.drops.items()):
        drops.add(n, reason=reason)
    events = MetricFamily("firsthop_transceiver_events_total", "counter", "Counted events")
    counts = tx.event_counts()
    for name in sorted(counts.keys() | ALERTED_EVENTS):
        events.add(counts[name], event=name)
    received = MetricFamily(
        "firsthop_transceiver_packets_total", "counter", "Datagrams on the media socket"
    )
    received.add(tx.table.mux.received, direction="in").add(
        tx.counters["packets_out"], direction="out"
    )
    draining = MetricFamily("firsthop_transceiver_draining", "gauge", "1 while draining")
    draining.add(1 if tx.draining else 0)
    resident = MetricFamily(
        "firsthop_transceiver_resident_bytes", "gauge", "The process's resident set size"
    )
    resident.add(memory.rss_bytes())
    released = MetricFamily(
        "firsthop_transceiver_memory_released_bytes_total",
        "counter",
        "RSS handed back to the OS when the last call ended",
    )
    released.add(tx.memory_released)
    return render(
        [
            sessions,
            capacity,
            received,
            drops,
            events,
            draining,
            resident,
            released,
            tx.setup_seconds,
            tx.call_rtt,
            tx.call_jitter,
            *memory.gc_metrics(),
        ]
    )
