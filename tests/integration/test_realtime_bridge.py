"""The transceiver as a Realtime-API client (`realtime+ws(s)://`): a real transceiver process,
real aiortc callers with an `oai-events` data channel, and a scripted Realtime backend — a real
WebSocket server on loopback (the `websockets` library, on the callers' asyncio loop) standing
in for a third-party backend, so the test decides exactly what the backend says and when."""

from __future__ import annotations

import array
import asyncio
import base64
import json
import math
import ssl
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed, InvalidStatus

from firsthop.services.call.caller import Caller, ToneTrack, tone_power
from firsthop.shared.wire.g711 import ulaw_decode, ulaw_encode
from tests.integration.test_transceiver import event_count, heard, hears
from tests.support import TransceiverProcess, eventually, make_cert, wait_until

API_KEY = "sk-test-realtime"
SESSION = {
    "type": "realtime",
    "model": "gpt-realtime",
    "instructions": "You are a test.",
    "audio": {"output": {"voice": "marin"}},
}
CALLER_TONE, AGENT_TONE = 1000.0, 600.0
Event = dict[str, Any]


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def tx(cert: tuple[Path, Path]) -> Iterator[TransceiverProcess]:
    """A transceiver with no default agent (each call names its backend), taking callers
    directly on its media socket, trusting the test backend's certificate."""
    process = TransceiverProcess(
        "--accept-direct", "--agent-ca-file", str(cert[0]), "--realtime-api-key", API_KEY
    ).start()
    yield process
    process.kill()


# -- the scripted backend ----------------------------------------------------------------------


class Backend:
    """A Realtime backend on loopback that says what the test tells it and keeps what it got."""

    def __init__(self) -> None:
        self.received: list[Event] = []
        self.conns: list[ServerConnection] = []
        self.auth: list[str | None] = []
        self.server: Server | None = None
        self.url = ""

    async def start(
        self, tls: ssl.SSLContext | None = None, *, port: int = 0, max_size: int = 1 << 20
    ) -> Backend:
        self.server = await serve(self._handler, "127.0.0.1", port, ssl=tls, max_size=max_size)
        port = next(iter(self.server.sockets)).getsockname()[1]
        self.url = f"realtime+{'wss' if tls else 'ws'}://127.0.0.1:{port}/v1/realtime?model=x"
        return self

    async def restart(self) -> None:
        """A routine backend restart: every connection dropped, then it serves again on the
        same port (so every call's link reconnects to it)."""
        assert self.server is not None
        port = next(iter(self.server.sockets)).getsockname()[1]
        await self.close()
        self.received.clear()
        await self.start(port=port)

    async def _handler(self, ws: ServerConnection) -> None:
        self.conns.append(ws)
        assert ws.request is not None
        self.auth.append(ws.request.headers.get("Authorization"))
        n = len(self.conns)
        await ws.send(
            json.dumps({"type": "session.created", "event_id": f"event_c{n}", "session": {}})
        )
        async for message in ws:
            event = json.loads(message)
            self.received.append(event)
            if event["type"] == "session.update":
                updated = {"type": "session.updated", "event_id": f"event_u{n}"}
                await ws.send(json.dumps({**updated, "session": event["session"]}))

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.received if e["type"] == kind]

    async def send(self, event: Event) -> None:
        await self.conns[-1].send(json.dumps(event))

    async def speak(self, seconds: float, rid: str = "resp_1", item: str = "item_1") -> None:
        """An answer's audio, sent in 100 ms deltas as fast as it can (as backends do)."""
        w = 2 * math.pi * AGENT_TONE / 24000
        for chunk in range(int(seconds * 10)):
            pcm = b"".join(
                int(9000 * math.sin(w * (chunk * 2400 + i))).to_bytes(2, "little", signed=True)
                for i in range(2400)
            )
            delta = base64.b64encode(pcm).decode()
            await self.send(
                {
                    "type": "response.output_audio.delta",
                    "event_id": f"event_d{chunk}",
                    "response_id": rid,
                    "item_id": item,
                    "output_index": 0,
                    "content_index": 0,
                    "delta": delta,
                }
            )

    def heard_from_caller(self) -> bytes:
        """The caller's audio as the backend got it (24 kHz PCM16)."""
        return b"".join(base64.b64decode(e["audio"]) for e in self.of("input_audio_buffer.append"))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def events(c: Caller) -> list[Event]:
    return [json.loads(m) for m in c.result.events if isinstance(m, str)]


def kinds(c: Caller) -> list[str]:
    return [e["type"] for e in events(c)]


async def call(
    tx: TransceiverProcess, backend: Backend, tone: float = CALLER_TONE, **extra: object
) -> tuple[Caller, str]:
    """A connected caller with an `oai-events` channel, its backend named per call."""
    c = Caller(ToneTrack(tone), data_channel=True)
    session: list[str] = []

    async def signal(offer: str) -> str:
        media = [f"{tx.media[0]}:{tx.media[1]}"]
        body = {"agent_url": backend.url, "session": SESSION, **extra}
        status, answer = await asyncio.to_thread(tx.create_session, offer, media, **body)
        assert status == 201, answer
        session.append(answer["session_id"])
        return str(answer["answer_sdp"])

    await c.start(signal)
    await asyncio.wait_for(c.wait_connected(), 10)
    return c, session[0]


def run(main: Callable[[Backend], Any], tls: ssl.SSLContext | None = None) -> Any:
    async def outer() -> Any:
        backend = await Backend().start(tls)
        try:
            return await main(backend)
        finally:
            await backend.close()

    return asyncio.run(outer())


# -- the tests -----------------------------------------------------------------------------------


def test_a_realtime_call_both_ways(tx: TransceiverProcess) -> None:
    async def main(backend: Backend) -> None:
        c, _ = await call(tx, backend)
        # The caller's session config reaches the backend first, as a session.update ...
        await eventually(lambda: backend.received)
        assert backend.received[0] == {"type": "session.update", "session": SESSION}
        assert backend.auth == [f"Bearer {API_KEY}"]
        # ... session.created is the first thing on the caller's channel, then session.updated
        await eventually(lambda: "session.updated" in kinds(c))
        assert kinds(c)[:2] == ["session.created", "session.updated"]
        assert "call.state" not in kinds(c)  # a Realtime channel carries Realtime events only
        # The caller's audio arrives as 24 kHz base64 appends, its tone intact.
        await eventually(lambda: len(backend.heard_from_caller()) > 48000)  # > 1 s at 24 kHz
        tail = backend.heard_from_caller()[-24000:]
        loudest = max([600, 800, CALLER_TONE, 1200], key=lambda f: tone_power(tail, f, 24000))
        assert loudest == CALLER_TONE
        assert tone_power(tail, CALLER_TONE, 24000) > 0.001
        # An answer: audio (played, not forwarded), other events forwarded untouched.
        transcript = {
            "type": "response.output_audio_transcript.delta",
            "event_id": "event_t1",
            "response_id": "resp_1",
            "item_id": "item_1",
            "output_index": 0,
            "content_index": 0,
            "delta": "Hello there",
        }
        await backend.send(transcript)
        await backend.speak(1.0)
        mark = len(c.result.received)
        await backend.send(
            {"type": "response.output_audio.done", "event_id": "event_o", "response_id": "resp_1"}
        )
        await backend.send(
            {"type": "response.done", "event_id": "event_r", "response": {"id": "resp_1"}}
        )
        await eventually(lambda: hears(c, AGENT_TONE, since=mark, window=24000), 10)
        await eventually(lambda: "output_audio_buffer.stopped" in kinds(c), 10)
        got = events(c)
        assert transcript in got
        assert not any(k.endswith("audio.delta") for k in kinds(c))
        started = next(e for e in got if e["type"] == "output_audio_buffer.started")
        stopped = next(e for e in got if e["type"] == "output_audio_buffer.stopped")
        assert started["response_id"] == stopped["response_id"] == "resp_1"
        order = kinds(c)
        assert order.index("output_audio_buffer.started") < order.index("response.done")
        assert order.index("response.done") < order.index("output_audio_buffer.stopped")
        assert all(isinstance(e.get("event_id"), str) for e in got)
        await c.close()

    run(main)


def test_barge_in_silences_the_answer_and_truncates_it_at_what_was_heard(
    tx: TransceiverProcess,
) -> None:
    async def main(backend: Backend) -> None:
        c, _ = await call(tx, backend)
        await eventually(lambda: "session.updated" in kinds(c))
        await backend.speak(5.0)  # five seconds of answer, queued at the transceiver
        await eventually(lambda: "output_audio_buffer.started" in kinds(c), 10)
        await eventually(lambda: hears(c, AGENT_TONE, window=9600), 10)
        speech = {
            "type": "input_audio_buffer.speech_started",
            "event_id": "event_s",
            "audio_start_ms": 1000,
            "item_id": "item_user",
        }
        await backend.send(speech)
        await eventually(lambda: backend.of("conversation.item.truncate"), 10)
        (truncate,) = backend.of("conversation.item.truncate")
        assert truncate["item_id"] == "item_1" and truncate["content_index"] == 0
        assert 0 < truncate["audio_end_ms"] <= 5000
        await eventually(lambda: "output_audio_buffer.cleared" in kinds(c))
        cleared = next(e for e in events(c) if e["type"] == "output_audio_buffer.cleared")
        assert cleared["response_id"] == "resp_1"
        assert kinds(c).index("input_audio_buffer.speech_started") < kinds(c).index(
            "output_audio_buffer.cleared"
        )
        # The backend's late audio of the cut answer is not played either.
        await backend.speak(1.0)
        mark = len(c.result.received) + 9600  # what was on its way when the clear came
        await eventually(lambda: len(c.result.received) >= mark + 48000, 10)
        assert tone_power(heard(c, since=mark), AGENT_TONE) < 0.0005
        # What the caller heard of the answer is about what the truncate says it heard.
        loud = sum(
            1
            for i in range(0, len(c.result.received), 1920)
            if tone_power(bytes(c.result.received[i : i + 1920]), AGENT_TONE) > 0.001
        )
        assert abs(loud * 20 - truncate["audio_end_ms"]) <= 200
        await c.close()

    run(main)


def test_invalid_client_events_get_errors_and_the_call_goes_on(tx: TransceiverProcess) -> None:
    before = event_count(tx, "realtime_client_event_unknown_type")

    async def main(backend: Backend) -> list[Event]:
        c, _ = await call(tx, backend)
        channel = c.channel
        assert channel is not None
        await eventually(lambda: "session.updated" in kinds(c))
        channel.send("not json {")
        channel.send(json.dumps({"event_id": "evt_notype"}))
        channel.send(json.dumps({"type": "made.up", "event_id": "evt_unknown"}))
        channel.send(json.dumps({"type": "conversation.item.create", "pad": "x" * 70_000}))
        channel.send(json.dumps({"type": "response.create", "event_id": "evt_ok"}))
        await eventually(lambda: kinds(c).count("error") >= 4)
        await eventually(lambda: backend.of("response.create"))
        assert backend.of("response.create") == [{"type": "response.create", "event_id": "evt_ok"}]
        assert not backend.of("made.up") and not backend.of("conversation.item.create")
        await c.close()
        return [e["error"] for e in events(c) if e["type"] == "error"]

    errors = run(main)
    assert [e["code"] for e in errors] == [
        "invalid_json",
        "missing_required_parameter",
        "invalid_value",
        "event_too_large",
    ]
    assert errors[2]["event_id"] == "evt_unknown" and errors[2]["param"] == "type"
    assert all(e["type"] == "invalid_request_error" for e in errors)
    wait_until(lambda: event_count(tx, "realtime_client_event_unknown_type") == before + 1)


def test_a_sideband_that_reads_nothing_holds_a_bounded_queue_and_is_paced(
    tx: TransceiverProcess,
) -> None:
    """A helper's read (stop 42): a sideband socket that reads nothing queued 256 events of
    any size (a backend's 250 KB events: 64 MiB a socket, and it outlived the call), and a
    sideband's client events skipped the data channel's 100 a second (31,000 tiny ones a
    second took most of a core). Now a socket's queue holds 1 MiB of events (more are
    dropped and counted), its client events are paced (the socket is read no faster: its
    sender slows), and once the call ends what is queued has 2 s to go."""

    async def main(backend: Backend) -> None:
        c, session_id = await call(tx, backend)
        await eventually(lambda: "session.updated" in kinds(c))
        url = f"ws://127.0.0.1:{tx.api_port}/internal/v1/sessions/{session_id}/events"
        dropped, paced = (
            event_count(tx, name) for name in ("events_dropped_sideband", "sideband_events_paced")
        )
        stalled = await connect(url, additional_headers=tx.auth, max_queue=1)  # never read
        pad = "x" * 250_000
        for n in range(60):  # 15 MB: past what the sockets' buffers take on loopback
            await backend.send({"type": "rate_limits.updated", "event_id": f"e{n}", "pad": pad})
        await eventually(lambda: event_count(tx, "events_dropped_sideband") > dropped + 10, 20)
        for _ in range(400):  # tiny bad events, each answered on this socket
            await stalled.send("{broken")
        await eventually(lambda: event_count(tx, "sideband_events_paced") > paced, 10)
        status, _ = await asyncio.to_thread(
            tx.request, "DELETE", f"/internal/v1/sessions/{session_id}"
        )
        assert status == 204
        await stalled.close()
        await c.close()

    run(main)


def test_a_lost_backend_is_reported_and_reconnected_with_the_session(
    tx: TransceiverProcess,
) -> None:
    async def main(backend: Backend) -> None:
        c, _ = await call(tx, backend)
        await eventually(lambda: "session.updated" in kinds(c))
        await backend.conns[0].close()  # the backend goes away mid-call
        await eventually(lambda: "error" in kinds(c), 10)
        err = next(e for e in events(c) if e["type"] == "error")["error"]
        assert err["type"] == "server_error" and "reconnect" in err["message"]
        await eventually(lambda: len(backend.of("session.update")) == 2, 10)  # back, re-sent
        assert backend.of("session.update")[1]["session"] == SESSION
        assert c.pc.connectionState == "connected"  # the call went on
        mark = len(backend.heard_from_caller())
        await eventually(lambda: len(backend.heard_from_caller()) > mark + 24000)  # audio again
        assert kinds(c).count("session.created") == 1  # to the caller, the same session
        await c.close()

    run(main)


def test_sideband_gets_server_events_and_sends_client_events(tx: TransceiverProcess) -> None:
    async def main(backend: Backend) -> None:
        c, session_id = await call(tx, backend)
        await eventually(lambda: "session.updated" in kinds(c))
        url = f"ws://127.0.0.1:{tx.api_port}/internal/v1/sessions/{session_id}/events"
        async with connect(url, additional_headers=tx.auth) as side:
            note = {"type": "rate_limits.updated", "event_id": "event_rl", "rate_limits": []}
            await backend.send(note)
            got = json.loads(await asyncio.wait_for(side.recv(), 10))
            assert got == note  # the same event the caller's channel gets
            await side.send(json.dumps({"type": "response.create", "event_id": "evt_side"}))
            await eventually(lambda: backend.of("response.create"), 10)
            # An error answers only the socket that sent the bad event: not the caller's
            # channel, not another sideband socket (as OpenAI answers one connection).
            other = await connect(url, additional_headers=tx.auth)
            await side.send("{broken")
            err = json.loads(await asyncio.wait_for(side.recv(), 10))
            assert err["type"] == "error" and err["error"]["code"] == "invalid_json"
            assert c.channel is not None
            c.channel.send(json.dumps({"type": "no.such.event"}))
            await eventually(lambda: "error" in kinds(c))
            (mine,) = [e for e in events(c) if e["type"] == "error"]
            assert mine["error"]["code"] == "invalid_value"  # its own, not the sideband's
            await backend.send(note)  # the next event the other socket gets is this one
            assert json.loads(await asyncio.wait_for(other.recv(), 10)) == note
            assert json.loads(await asyncio.wait_for(side.recv(), 10)) == note
            await other.close()
            # At most four sockets a session.
            more = [await connect(url, additional_headers=tx.auth) for _ in range(3)]
            with pytest.raises(InvalidStatus) as full:
                await connect(url, additional_headers=tx.auth)
            assert full.value.response.status_code == 429
            for ws in more:
                await ws.close()
        await eventually(lambda: events(c).count(note) == 2)
        with pytest.raises(InvalidStatus) as unknown:
            await connect(url.replace(session_id, "nope"), additional_headers=tx.auth)
        assert unknown.value.response.status_code == 404
        with pytest.raises(InvalidStatus) as unauthorized:
            await connect(url)
        assert unauthorized.value.response.status_code == 401
        # The session's end closes its sideband sockets.
        last = await connect(url, additional_headers=tx.auth)
        status, _ = await asyncio.to_thread(
            tx.request, "DELETE", f"/internal/v1/sessions/{session_id}"
        )
        assert status == 204
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(last.recv(), 10)
        await c.close()

    run(main)


def test_wss_backend_with_a_ca_file(tx: TransceiverProcess, cert: tuple[Path, Path]) -> None:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert[0], cert[1])

    async def main(backend: Backend) -> None:
        assert backend.url.startswith("realtime+wss://")
        c, _ = await call(tx, backend)
        await eventually(lambda: "session.updated" in kinds(c), 10)
        assert backend.received[0]["type"] == "session.update"
        assert backend.auth == [f"Bearer {API_KEY}"]
        await backend.speak(0.6)
        await eventually(lambda: hears(c, AGENT_TONE, window=9600), 10)
        await c.close()

    run(main, tls)


def test_wss_backend_with_a_certificate_not_trusted(tx: TransceiverProcess, tmp_path: Path) -> None:
    other = make_cert(tmp_path)  # self-signed, and not in --agent-ca-file
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(other[0], other[1])
    failures = event_count(tx, "agent_failures")

    async def main(backend: Backend) -> None:
        c, _ = await call(tx, backend)
        await asyncio.to_thread(wait_until, lambda: event_count(tx, "agent_failures") > failures)
        assert backend.received == []  # nothing got past the TLS handshake
        assert c.pc.connectionState == "connected"  # the call goes on, in silence
        await c.close()

    run(main, tls)


def test_a_g711_session(tx: TransceiverProcess) -> None:
    """A session that asks for μ-law both ways gets 8 kHz G.711 appends and is heard in it."""
    pcmu = {"type": "audio/pcmu"}
    g711 = {**SESSION, "audio": {"input": {"format": pcmu}, "output": {"format": pcmu}}}

    async def main(backend: Backend) -> None:
        c, _ = await call(tx, backend, session=g711)
        await eventually(lambda: len(backend.heard_from_caller()) > 8000, 10)  # > 1 s at 8 kHz
        tail = ulaw_decode(backend.heard_from_caller()[-4000:])
        loudest = max([600, 800, CALLER_TONE, 1200], key=lambda f: tone_power(tail, f, 8000))
        assert loudest == CALLER_TONE
        w = 2 * math.pi * AGENT_TONE / 8000
        pcm = array.array("h", (int(9000 * math.sin(w * i)) for i in range(8000))).tobytes()
        for off in range(0, len(ulaw_encode(pcm)), 800):
            await backend.send(
                {
                    "type": "response.output_audio.delta",
                    "response_id": "resp_g",
                    "item_id": "item_g",
                    "delta": base64.b64encode(ulaw_encode(pcm)[off : off + 800]).decode(),
                }
            )
        await eventually(lambda: hears(c, AGENT_TONE, window=9600), 10)
        await c.close()

    run(main)


def test_session_config_is_checked(tx: TransceiverProcess) -> None:
    for bad, reason in (([1], "JSON object"), ({"pad": "x" * 17000}, "16384")):
        status, body = tx.create_session("v=0\r\n", ["127.0.0.1:1"], session=bad)
        assert status == 400 and reason in body["error"], body
    deep = b'{"session": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"
    status, reply = tx.request("POST", "/internal/v1/sessions", deep, "application/json")
    assert status == 400, reply
