"""`firsthop agent --kind echo|parrot|twilio-echo`: reference agents (§8).

(`--kind assistant` is another protocol, OpenAI Realtime: `services/agent/assistant/`.)
`--kind twilio-echo` speaks Twilio Media Streams instead (the server side, a bot's): after
`connected` and `start` it sends each `media` message's payload straight back, until `stop`;
the transceiver dials it as `twilio+ws://` (the bench's Media Streams target).

One WebSocket per session. Text frames are JSON control messages, binary frames are 20 ms of
PCM16 mono 48 kHz audio, both ways.

* echo returns each input frame at once (the latency probe) and answers every client event
  with an agent.event carrying it back (and a phone's key, `dtmf`, with `{"type": "dtmf",
  "digit"}`);
* parrot waits for the caller to finish a sentence (~600 ms of silence), says it back at real
  time, and stops talking (`output.clear`) as soon as the caller talks over it; it reports
  speech_started / speech_stopped / response_started / response_done as agent events.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
from opentelemetry.trace import SpanKind

from firsthop.services.agent.connection import AgentConnection, ConnectionClosed, serve_websockets
from firsthop.services.agent.vad import FRAME_MS, TurnTaker
from firsthop.shared.config import add_option, hostport_arg
from firsthop.shared.http import serve_simple
from firsthop.shared.lifecycle import (
    address_clash_is_one_line,
    announce,
    run_until_signal,
    setup_logging,
)
from firsthop.shared.metrics import CONTENT_TYPE, MetricFamily, render
from firsthop.shared.telemetry import (
    context_from_traceparent,
    setup_tracing,
    shutdown_tracing,
    tracer,
)

log = logging.getLogger("firsthop.agent")

TRACER = tracer("firsthop.agent")
MAX_MESSAGE = 1 << 20
PLAYBACK_LEAD = 3  # frames sent ahead of real time, so the transceiver's queue never runs dry


async def _send_event(ws: AgentConnection, data: dict[str, Any]) -> None:
    await ws.send_message(json.dumps({"type": "agent.event", "data": data}))


async def echo_session(ws: AgentConnection, start: dict[str, Any]) -> None:
    while True:
        message = await ws.get_message()
        if isinstance(message, bytes):
            STATS["frames_in"] += 1
            await ws.send_message(message)
            STATS["frames_out"] += 1
            continue
        try:
            msg = json.loads(message)
        except ValueError:
            continue
        if not isinstance(msg, dict):
            continue
        if msg.get("type") == "client.event":
            await _send_event(ws, {"type": "echo", "event": msg.get("data")})
        elif msg.get("type") == "dtmf":
            digit = msg.get("digit")
            digit = digit if isinstance(digit, str) and digit in DTMF_DIGITS else "other"
            DTMF[digit] += 1
            await _send_event(ws, {"type": "dtmf", "digit": digit})  # a phone's key, said back
        elif msg.get("type") == "session.end":
            return


async def parrot_session(ws: AgentConnection, start: dict[str, Any]) -> None:
    turns = TurnTaker()
    replies_send, replies_recv = trio.open_memory_channel[list[bytes]](4)
    speaking = trio.Event()  # set while the caller talks: barge-in for the player

    async def player() -> None:
        nonlocal speaking
        async for frames in replies_recv:
            await _send_event(ws, {"type": "response_started", "frames": len(frames)})
            start = trio.current_time()
            interrupted = False
            for i, pcm in enumerate(frames):
                if speaking.is_set():
                    interrupted = True
                    break
                await trio.sleep_until(start + max(0, i - PLAYBACK_LEAD) * FRAME_MS / 1000)
                await ws.send_message(pcm)
                STATS["frames_out"] += 1
            if interrupted:
                await ws.send_message(json.dumps({"type": "output.clear"}))
                await _send_event(ws, {"type": "response_done", "interrupted": True})
            else:
                await _send_event(ws, {"type": "response_done", "interrupted": False})

    async with trio.open_nursery() as nursery:
        nursery.start_soon(player)
        while True:
            message = await ws.get_message()
            if isinstance(message, str):
                try:
                    msg = json.loads(message)
                except ValueError:
                    continue
                if isinstance(msg, dict) and msg.get("type") == "session.end":
                    nursery.cancel_scope.cancel()
                    return
                continue
            STATS["frames_in"] += 1
            for name, utterance in turns.feed(message):
                if name == "speech_started":
                    speaking.set()
                    await _send_event(ws, {"type": "speech_started"})
                elif name == "speech_stopped":
                    speaking = trio.Event()
                    await _send_event(ws, {"type": "speech_stopped"})
                    if utterance:
                        try:
                            replies_send.send_nowait(utterance)
                        except trio.WouldBlock:
                            log.warning("parrot: reply queue full, dropping a reply")


async def twilio_echo_session(ws: AgentConnection, start: dict[str, Any]) -> None:
    """A Media Streams bot that says back what it hears, message by message."""
    sid = start["stream_sid"]
    while True:
        message = await ws.get_message()
        try:
            msg = json.loads(message)
        except ValueError:
            continue
        event = msg.get("event") if isinstance(msg, dict) else None
        if event == "media":
            STATS["frames_in"] += 1
            body = msg.get("media")
            payload = body.get("payload") if isinstance(body, dict) else None
            reply = {"event": "media", "streamSid": sid, "media": {"payload": payload}}
            await ws.send_message(json.dumps(reply))
            STATS["frames_out"] += 1
        elif event == "stop":
            return


async def native_start(ws: AgentConnection) -> dict[str, Any] | None:
    """The native protocol's first message, `session.start` (None: something else came)."""
    first = await ws.get_message()
    start = json.loads(first) if isinstance(first, str) else {}
    return start if isinstance(start, dict) and start.get("type") == "session.start" else None


async def twilio_start(ws: AgentConnection) -> dict[str, Any] | None:
    """Media Streams' `connected` then `start`: the call's ids from its customParameters."""
    for expected in ("connected", "start"):
        message = await ws.get_message()
        msg = json.loads(message) if isinstance(message, str) else {}
        if not isinstance(msg, dict) or msg.get("event") != expected:
            return None
    body = msg.get("start")
    custom = body.get("customParameters") if isinstance(body, dict) else None
    if not isinstance(custom, dict) or not isinstance(msg.get("streamSid"), str):
        return None
    return {**custom, "stream_sid": msg["streamSid"]}


Handler = Callable[[AgentConnection, dict[str, Any]], Awaitable[None]]
Opening = Callable[[AgentConnection], Awaitable[dict[str, Any] | None]]
KINDS: dict[str, tuple[Opening, Handler]] = {
    "echo": (native_start, echo_session),
    "parrot": (native_start, parrot_session),
    "twilio-echo": (twilio_start, twilio_echo_session),
}


STATS: Counter[str] = Counter()
DTMF_DIGITS = "0123456789*#ABCD"  # (RFC 4733's keys: the metric's label is a closed set)
DTMF: Counter[str] = Counter()


def agent_metrics(kind: str) -> str:
    sessions = MetricFamily("firsthop_agent_sessions", "gauge", "Sessions in progress")
    sessions.add(STATS["active"], kind=kind)
    total = MetricFamily("firsthop_agent_sessions_total", "counter", "Sessions started")
    total.add(STATS["started"], kind=kind)
    frames = MetricFamily("firsthop_agent_frames_total", "counter", "20 ms audio frames")
    frames.add(STATS["frames_in"], kind=kind, direction="in")
    frames.add(STATS["frames_out"], kind=kind, direction="out")
    dtmf = MetricFamily("firsthop_agent_dtmf_total", "counter", "Phone keys heard (echo)")
    for digit, n in sorted(DTMF.items()):
        dtmf.add(n, kind=kind, digit=digit)
    return render([sessions, total, frames, dtmf])


async def serve_agent(
    kind: str,
    listen: tuple[str, int],
    metrics: tuple[str, int] | None = None,
    *,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    opening, handler = KINDS[kind]

    async def http(method: str, path: str) -> tuple[int, str, bytes]:
        if path == "/metrics":
            return 200, CONTENT_TYPE, agent_metrics(kind).encode()
        if path == "/healthz":
            return 200, "application/json", json.dumps({"ok": True, "kind": kind}).encode()
        return 404, "text/plain", b"not found\n"

    async def on_connection(ws: AgentConnection) -> None:
        STATS["active"] += 1
        try:
            start = await opening(ws)
            if start is None:
                await ws.aclose(code=1002, reason="expected the protocol's opening")
                return
            log.info("%s session %s started", kind, start.get("session_id"))
            STATS["started"] += 1
            with TRACER.start_as_current_span(
                "agent.session",
                context=context_from_traceparent(start.get("traceparent")),
                kind=SpanKind.SERVER,
                attributes={
                    "firsthop.session_id": str(start.get("session_id")),
                    "firsthop.call_id": str(start.get("call_id")),
                    "firsthop.agent": kind,
                },
            ):
                await handler(ws, start)
        except (ConnectionClosed, ValueError):
            pass
        finally:
            STATS["active"] -= 1
            await ws.aclose()

    async with trio.open_nursery() as nursery:
        if metrics is not None:
            await nursery.start(serve_simple, http, metrics)
        port = await nursery.start(
            partial(serve_websockets, on_connection, listen[0], listen[1], max_message=MAX_MESSAGE)
        )
        log.info("agent %s listening on %s:%d", kind, listen[0], port)
        announce(listen=(listen[0], port))
        task_status.started((listen[0], port))


def run(args: argparse.Namespace) -> int:
    if args.kind == "assistant":  # the Realtime-protocol assistant (needs firsthop[assistant])
        from firsthop.services.agent.assistant.server import run as run_assistant

        return run_assistant(args)
    setup_logging(f"agent[{args.kind}]")
    setup_tracing("agent")
    if args.kind not in KINDS:
        kinds = ", ".join([*KINDS, "assistant"])
        raise SystemExit(f"firsthop agent: --kind must be one of {kinds}")
    metrics = hostport_arg(args.metrics) if args.metrics else None
    listens = [("tcp", hostport_arg(args.listen)), *([("tcp", metrics)] if metrics else [])]
    try:
        with address_clash_is_one_line(f"agent --kind {args.kind}", listens):
            trio.run(run_until_signal, serve_agent, args.kind, hostport_arg(args.listen), metrics)
    finally:
        shutdown_tracing()
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser], help: str) -> None:
    p = sub.add_parser("agent", help=help)
    add_option(p, "--listen", default="0.0.0.0:8090", help="WebSocket address", metavar="HOST:PORT")
    add_option(p, "--kind", default="echo", help="echo | parrot | twilio-echo | assistant")
    add_option(
        p, "--metrics", default=None, help="/metrics and /healthz (off if unset)", metavar="ADDR"
    )
    add_option(
        p, "--voice", default="piper", help="assistant: piper (espeak-ng if missing) | espeak"
    )
    add_option(
        p,
        "--recognizer",
        default="whisper",
        help="assistant: whisper (Whisper tiny.en; pocketsphinx if missing) | pocketsphinx",
    )
    add_option(
        p,
        "--api-key",
        default=None,
        help="assistant: require Authorization: Bearer KEY on the WebSocket",
        metavar="KEY",
    )
    p.set_defaults(func=run)
