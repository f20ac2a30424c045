"""The assistant's Trio I/O: a Realtime WebSocket server around the sans-IO session core.

One Hypercorn (Trio worker) ASGI app serves the Realtime protocol on a WebSocket at any
path (clients use `/v1/realtime`), `GET /healthz` and `GET /metrics`. Per connection: a
reader feeds client frames to `RealtimeSession`; its commands run as tasks — recognition and
synthesis in worker threads (`trio.to_thread`: synthesis at most `WORKERS` at a time across
sessions, recognition one turn at a time, each with its own limiter),
so the loop keeps reading and sending while a model runs. Synthesis goes sentence by
sentence, each sentence's audio sent as soon as it exists. Server events leave through one
lock, in the order the core made them. Each connection is an `agent.session` span (joined
to the caller's trace when the upgrade carries a W3C `traceparent` header).

Bounds: `MAX_SESSIONS` at once (then 503); client messages up to `MAX_MESSAGE`; at most
`MAX_TRANSCRIPTIONS` recognitions pending per session (more: an `error` event, the turn is
dropped); one response at a time (the core). `--api-key` makes `Authorization: Bearer
<key>` (or the browser's `openai-insecure-api-key.<key>` subprotocol) required (else 401).
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import secrets
from collections import Counter
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

import trio
from hypercorn.trio import serve
from opentelemetry.trace import SpanKind

from firsthop.services.agent.assistant import brain
from firsthop.services.agent.assistant.commands import Speak, StopSpeaking, Transcribe
from firsthop.services.agent.assistant.config import SessionConfig
from firsthop.services.agent.assistant.recognizer import (
    Recognizer,
    RecognizerError,
    load_recognizer,
)
from firsthop.services.agent.assistant.session import RealtimeSession
from firsthop.services.agent.assistant.voice import Voice, VoiceError
from firsthop.shared.address import Address
from firsthop.shared.http import bound_address, hypercorn_config, lifespan, serve_simple
from firsthop.shared.lifecycle import announce
from firsthop.shared.metrics import CONTENT_TYPE, Histogram, MetricFamily, render
from firsthop.shared.telemetry import context_from_traceparent, tracer

log = logging.getLogger("firsthop.agent.assistant")
TRACER = tracer("firsthop.agent")

MAX_MESSAGE = 1 << 20  # one client event (an append of ~20 s of audio fits)
MAX_TRANSCRIPTIONS = 4  # pending per session
MAX_SESSIONS = 64  # at once; more get 503 (the models are shared, the CPU is not infinite)
WORKERS = 2  # model threads across all sessions (the machine's cores)
SUBPROTOCOL_KEY = "openai-insecure-api-key."

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0)


class Stats:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.vad_hangover = Histogram(
            "firsthop_assistant_vad_hangover_seconds",
            "End of the caller's speech to speech_stopped (audio time)",
            BUCKETS,
        )
        self.recognition = Histogram(
            "firsthop_assistant_recognition_seconds", "Recognition of one turn", BUCKETS
        )
        self.first_chunk = Histogram(
            "firsthop_assistant_synthesis_first_chunk_seconds",
            "Response start to its first audio chunk",
            BUCKETS,
        )

    def render(self) -> str:
        active = MetricFamily("firsthop_assistant_sessions", "gauge", "Sessions in progress")
        active.add(self.counts["active"])
        started = MetricFamily("firsthop_assistant_sessions_total", "counter", "Sessions started")
        started.add(self.counts["started"])
        turns = MetricFamily("firsthop_assistant_turns_total", "counter", "Caller turns heard")
        turns.add(self.counts["turns"])
        responses = MetricFamily("firsthop_assistant_responses_total", "counter", "Responses")
        responses.add(self.counts["completed"], status="completed")
        responses.add(self.counts["cancelled"], status="cancelled")
        errors = MetricFamily("firsthop_assistant_errors_total", "counter", "error events sent")
        errors.add(self.counts["errors"])
        return render(
            [active, started, turns, responses, errors]
            + [self.vad_hangover, self.recognition, self.first_chunk]
        )


class Assistant:
    """What every session shares: the models, the worker limit, the counters."""

    def __init__(
        self,
        voice: Voice,
        recognizer: Recognizer,
        api_key: str | None = None,
        max_sessions: int = MAX_SESSIONS,
    ):
        self.max_sessions = max_sessions
        self.voice = voice
        self.recognizer = recognizer
        self.api_key = api_key
        self.workers = trio.CapacityLimiter(WORKERS)  # synthesis
        # Recognition has its own: one turn at a time (the model's threads are the turn's),
        # and turns waiting for it never hold a slot synthesis needs.
        self.recognizing = trio.CapacityLimiter(1)
        self.stats = Stats()

    def authorized(self, scope: Scope) -> bool:
        if self.api_key is None:
            return True
        offered: list[str] = []
        authorization = _header(scope, b"authorization")
        if authorization is not None:
            offered.append(authorization.removeprefix("Bearer ").strip())
        for proto in scope.get("subprotocols", []):
            if proto.startswith(SUBPROTOCOL_KEY):
                offered.append(proto[len(SUBPROTOCOL_KEY) :])
        key = self.api_key.encode()
        return any(hmac.compare_digest(o.encode(), key) for o in offered)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] == "http":
            await self.http(scope, send)
        elif scope["type"] == "websocket":
            await self.websocket(scope, receive, send)

    def http_response(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method != "GET":
            return 405, "text/plain", b"method not allowed\n"
        if path == "/metrics":
            return 200, CONTENT_TYPE, self.stats.render().encode()
        if path == "/healthz":
            health = {
                "ok": True,
                "kind": "assistant",
                "voice": self.voice.name,
                "recognizer": self.recognizer.name,
            }
            return 200, "application/json", json.dumps(health).encode()
        return 404, "text/plain", b"not found\n"

    async def http(self, scope: Scope, send: Send) -> None:
        status, ctype, body = self.http_response(scope["method"], scope["path"])
        headers = [(b"content-type", ctype.encode()), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (await receive())["type"] != "websocket.connect":
            return
        if not self.authorized(scope):
            await _refuse(send, 401, "invalid_api_key", "missing or wrong API key")
            return
        if self.stats.counts["active"] >= self.max_sessions:
            await _refuse(send, 503, "server_busy", f"{self.max_sessions} sessions in progress")
            return
        # Counted before the first await: upgrades arriving together all saw room otherwise.
        self.stats.counts["active"] += 1
        try:
            accept: Message = {"type": "websocket.accept"}
            if "realtime" in scope.get("subprotocols", []):
                accept["subprotocol"] = "realtime"
            await send(accept)
            self.stats.counts["started"] += 1
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            connection = Connection(self, receive, send, model=(query.get("model") or [None])[0])
            with TRACER.start_as_current_span(
                "agent.session",
                context=context_from_traceparent(_header(scope, b"traceparent")),
                kind=SpanKind.SERVER,
                attributes={
                    "firsthop.agent": "assistant",
                    "firsthop.session_id": connection.core.config.session_id,
                },
            ):
                await connection.run()
        finally:
            self.stats.counts["active"] -= 1


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    """Answer an upgrade with an HTTP error in OpenAI's JSON shape (hypercorn's ASGI
    websocket.http.response extension), instead of accepting it."""
    body = json.dumps(
        {"error": {"type": "invalid_request_error", "code": code, "message": message}}
    )
    headers = [(b"content-type", b"application/json")]
    await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body.encode()})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


class Connection:
    """One client: its session core, its send lock, its model tasks."""

    def __init__(
        self, assistant: Assistant, receive: Receive, send: Send, model: str | None = None
    ) -> None:
        self.a = assistant
        self.receive = receive
        self.send = send
        config = SessionConfig(
            session_id=f"sess_{secrets.token_hex(10)}",
            voice=assistant.voice.name,
            recognizer=assistant.recognizer.name,
        )
        if model:  # `?model=` of the URL, as OpenAI's session.created reports it
            config.model = model[:128]
        self.core = RealtimeSession(config)
        self.lock = trio.Lock()
        self.speakers: dict[str, Speaker] = {}
        self.transcribing = 0
        self.nursery: trio.Nursery | None = None

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            await self.flush()
            while True:
                msg = await self.receive()
                if msg["type"] != "websocket.receive":
                    break
                data = msg.get("text")
                if data is None:
                    data = msg.get("bytes") or b""
                try:
                    self.core.receive(data, datetime.now(UTC))
                except Exception:  # a bug here must not end the caller's session
                    log.exception("assistant: client event failed")
                    self.core.error("event not handled", code="server_error", kind="server_error")
                await self.flush()
            nursery.cancel_scope.cancel()

    async def flush(self) -> None:
        """Send what the core queued, in order, and start what it asked for."""
        events, commands = self.core.take()
        for command in commands:
            self.run_command(command)
        async with self.lock:
            for event in events:
                kind = event["type"]
                if kind == "error":
                    self.a.stats.counts["errors"] += 1
                elif kind == "response.done":
                    self.a.stats.counts[event["response"]["status"]] += 1
                await self.send({"type": "websocket.send", "text": json.dumps(event)})

    def run_command(self, command: Transcribe | Speak | StopSpeaking) -> None:
        assert self.nursery is not None
        if isinstance(command, Transcribe):
            if self.transcribing >= MAX_TRANSCRIPTIONS:
                self.core.error("too many turns waiting for recognition", code="rate_limited")
                return
            self.transcribing += 1
            self.nursery.start_soon(self.transcribe, command)
        elif isinstance(command, Speak):
            speaker = Speaker()
            self.speakers[command.response_id] = speaker
            self.nursery.start_soon(self.speak, command, speaker)
        else:
            stopping = self.speakers.pop(command.response_id, None)
            if stopping is not None:
                stopping.stop()

    async def transcribe(self, command: Transcribe) -> None:
        self.a.stats.counts["turns"] += 1
        if command.vad_hangover_ms is not None:
            self.a.stats.vad_hangover.observe(command.vad_hangover_ms / 1000)
        try:
            start = trio.current_time()
            text = await trio.to_thread.run_sync(
                self.a.recognizer.transcribe, command.audio, limiter=self.a.recognizing
            )
            took = trio.current_time() - start
            self.a.stats.recognition.observe(took)
            log.info("turn %s: heard %r in %.3f s", command.item_id, text, took)
        finally:
            self.transcribing -= 1
        self.core.transcribed(command.item_id, text, datetime.now(UTC), respond=command.respond)
        await self.flush()

    async def speak(self, command: Speak, speaker: Speaker) -> None:
        start = trio.current_time()
        first = True
        for sentence in brain.sentences(command.text):
            pcm = await speaker.synthesize(self.a, sentence)
            if speaker.stopped:
                break
            if pcm is None:
                continue
            if first:
                took = trio.current_time() - start
                self.a.stats.first_chunk.observe(took)
                log.info("response %s: first audio after %.3f s", command.response_id, took)
                first = False
            # Outside any cancel scope of the speaker's: a stop never cuts a batch of events.
            self.core.spoken(command.response_id, sentence, pcm)
            await self.flush()
        else:
            self.core.speech_done(command.response_id)
            await self.flush()
        self.speakers.pop(command.response_id, None)


class Speaker:
    """One response's synthesis; `stop()` abandons the sentence being made."""

    def __init__(self) -> None:
        self.stopped = False
        self._scope: trio.CancelScope | None = None

    def stop(self) -> None:
        self.stopped = True
        if self._scope is not None:
            self._scope.cancel()

    async def synthesize(self, assistant: Assistant, sentence: str) -> bytes | None:
        with trio.CancelScope() as scope:
            self._scope = scope
            if self.stopped:
                return None
            try:
                return await trio.to_thread.run_sync(
                    assistant.voice.synthesize,
                    sentence,
                    limiter=assistant.workers,
                    abandon_on_cancel=True,
                )
            except VoiceError as exc:
                log.warning("synthesis failed: %s", exc)
            finally:
                self._scope = None
        return None


async def serve_assistant(
    assistant: Assistant,
    listen: Address,
    metrics: Address | None = None,
    *,
    task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve on `listen` (WebSocket, /healthz, /metrics) and, like the other agents, /healthz
    and /metrics on `metrics` too when given."""
    config = hypercorn_config(listen)
    config.websocket_max_message_size = MAX_MESSAGE
    config.max_app_queue_size = 16  # appends arrive faster than real time from some clients

    async def _serve(*, task_status: trio.TaskStatus[list[str]]) -> None:
        app: Any = assistant.app
        await serve(app, config, task_status=task_status)

    async def plain(method: str, path: str) -> tuple[int, str, bytes]:
        return assistant.http_response(method, path)

    async with trio.open_nursery() as nursery:
        bound = bound_address(await nursery.start(_serve))
        addresses = {"listen": bound}
        if metrics is not None:
            addresses["metrics"] = await nursery.start(serve_simple, plain, metrics)
        log.info(
            "assistant (voice %s, recognizer %s) listening on %s:%d",
            assistant.voice.name,
            assistant.recognizer.name,
            *bound,
        )
        announce(**addresses)
        task_status.started(bound)


def run(args: argparse.Namespace) -> int:
    """`firsthop agent --kind assistant`: load the models, then serve until a signal."""
    from firsthop.services.agent.assistant.voice import load_voice
    from firsthop.shared.config import hostport_arg
    from firsthop.shared.lifecycle import run_until_signal, setup_logging
    from firsthop.shared.telemetry import setup_tracing, shutdown_tracing

    setup_logging("agent[assistant]")
    setup_tracing("agent")
    try:
        voice = load_voice(args.voice)
        recognizer = load_recognizer(args.recognizer)
    except (VoiceError, RecognizerError, ImportError) as exc:
        raise SystemExit(f"firsthop agent --kind assistant: {exc}") from exc
    assistant = Assistant(voice, recognizer, api_key=args.api_key or None)
    try:
        metrics = hostport_arg(args.metrics) if args.metrics else None
        trio.run(run_until_signal, serve_assistant, assistant, hostport_arg(args.listen), metrics)
    finally:
        recognizer.close()
        shutdown_tracing()
    return 0
