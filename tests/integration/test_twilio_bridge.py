"""The transceiver as a Twilio Media Streams client (`twilio+ws://`): a real relay and
transceiver, real aiortc callers, and two kinds of bot —

* a real Pipecat pipeline from PyPI (`tests/pipecat_bot.py`, its own process: FastAPI +
  uvicorn, `parse_telephony_websocket`, `TwilioFrameSerializer`), which says back what it hears;
* a scripted bot (the `websockets` library, on the callers' asyncio loop), so a test decides
  exactly what the bot sends and when: marks, clear, garbage, hanging up.
"""

from __future__ import annotations

import array
import asyncio
import base64
import json
import math
import re
import ssl
import sys
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from firsthop.services.call.caller import Caller, ToneTrack, tone_power
from firsthop.shared.wire.g711 import ulaw_decode, ulaw_encode
from tests.integration.test_transceiver import event_count, heard, hears, ingress
from tests.support import (
    AgentProcess,
    RelayProcess,
    ServiceProcess,
    SignalingProcess,
    TransceiverProcess,
    eventually,
    free_tcp_port,
    make_cert,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
CALLER_TONE, BOT_TONE = 1000.0, 600.0
Event = dict[str, Any]
Stack = tuple[RelayProcess, TransceiverProcess]


@pytest.fixture(scope="module")
def cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return make_cert(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def stack(cert: tuple[Path, Path]) -> Iterator[Stack]:
    """A relay and a transceiver with no default agent (each call names its bot), trusting
    the test bots' certificate."""
    relay = RelayProcess().start()
    tx = TransceiverProcess("--agent-ca-file", str(cert[0])).start()
    yield relay, tx
    tx.kill()
    relay.kill()


@pytest.fixture(scope="module")
def pipecat_bot() -> Iterator[str]:
    port = free_tcp_port()
    argv = [sys.executable, "-m", "tests.pipecat_bot", str(port)]
    bot = ServiceProcess("pipecat-bot", argv, ready_tcp=port)
    bot.cwd = str(ROOT)
    bot.start(timeout=60)  # importing pipecat takes a while
    yield f"http://127.0.0.1:{port}"
    bot.kill()


async def call(
    stack: Stack, agent_url: str, tone: float = CALLER_TONE, **extra: object
) -> tuple[Caller, str]:
    """A connected caller through the relay, its agent named per call; (caller, session id)."""
    relay, tx = stack
    c = Caller(ToneTrack(tone))
    ids: list[str] = []

    async def signal(offer: str) -> str:
        status, body = await asyncio.to_thread(
            tx.create_session,
            offer,
            ingress(relay),
            agent_url=agent_url,
            region="eu-test",
            **extra,
        )
        assert status == 201, body
        ids.append(body["session_id"])
        return str(body["answer_sdp"])

    await c.start(signal)
    await asyncio.wait_for(c.wait_connected(), 10)
    return c, ids[0]


# -- a real Pipecat bot ------------------------------------------------------------------------


def bot_calls(base: str) -> list[dict[str, Any]]:
    """The `start` messages the Pipecat bot got, as its runner parsed them."""
    with urllib.request.urlopen(base + "/calls", timeout=5) as resp:
        calls: list[dict[str, Any]] = json.loads(resp.read())
    return calls


def test_a_pipecat_bot_hears_the_caller_and_says_it_back(stack: Stack, pipecat_bot: str) -> None:
    url = "twilio+ws://" + pipecat_bot.removeprefix("http://") + "/ws"

    async def main() -> None:
        c, session_id = await call(stack, url)
        await eventually(lambda: hears(c, CALLER_TONE), 20)  # its own tone, through the bot
        assert tone_power(heard(c), 600) < 0.001
        calls = await asyncio.to_thread(bot_calls, pipecat_bot)
        (seen,) = [x for x in calls if x["custom"].get("session_id") == session_id]
        assert re.fullmatch(r"MZ[0-9a-f]{32}", seen["stream_sid"])
        assert re.fullmatch(r"CA[0-9a-f]{32}", seen["call_sid"])
        assert seen["custom"]["region"] == "eu-test" and seen["custom"]["call_id"]
        await c.close()

    asyncio.run(main())


def test_firsthop_agent_twilio_echo_is_a_media_streams_bot(stack: Stack) -> None:
    """`firsthop agent --kind twilio-echo`, the echo bench's Media Streams target."""
    bot = AgentProcess("twilio-echo").start()
    try:

        async def main() -> None:
            c, _ = await call(stack, f"twilio+ws://127.0.0.1:{bot.port}/")
            await eventually(lambda: hears(c, CALLER_TONE), 15)
            await c.close()

        asyncio.run(main())
    finally:
        bot.kill()


def test_a_pipecat_interruption_clears_what_the_bot_queued(stack: Stack, pipecat_bot: str) -> None:
    """The bot hands five seconds of answer to its transport at once (Pipecat sends it at
    twice real time: the transceiver queues it), then interrupts itself 1.5 s in: Pipecat's
    serializer sends `clear`, and the caller hears no more of it."""
    _, tx = stack
    url = "twilio+ws://" + pipecat_bot.removeprefix("http://") + "/ws"
    session = {"pipecat": "speak-then-interrupt"}
    cleared = event_count(tx, "output_cleared")

    async def main() -> None:
        c, _ = await call(stack, url, tone=CALLER_TONE, session=session)
        await eventually(lambda: hears(c, BOT_TONE, window=9600), 20)
        # Pipecat's `clear` reached the transceiver's output queue ...
        await asyncio.to_thread(wait_until, lambda: event_count(tx, "output_cleared") > cleared)
        since = len(c.result.received)
        # ... and silence comes long before the five seconds could have played.
        await eventually(lambda: len(c.result.received) >= since + 2 * 96000, 10)
        assert loud_ms(c) < 3500
        assert tone_power(heard(c, window=96000), BOT_TONE) < 0.0005  # the last second
        await c.close()

    asyncio.run(main())


# -- a scripted bot ------------------------------------------------------------------------------


def bot_tone(seconds: float, amplitude: float = 0.3) -> bytes:
    """μ-law 8 kHz of BOT_TONE."""
    w = 2 * math.pi * BOT_TONE / 8000
    n = int(8000 * seconds)
    pcm = array.array("h", (int(32767 * amplitude * math.sin(w * i)) for i in range(n)))
    return ulaw_encode(pcm.tobytes())


class Bot:
    """A Media Streams bot on loopback that says what the test tells it and keeps what it got;
    `echo` sends each `media` straight back."""

    def __init__(self, echo: bool = False) -> None:
        self.echo = echo
        self.received: list[Event] = []
        self.conns: list[ServerConnection] = []
        self.server: Server | None = None
        self.url = ""

    async def start(self, port: int = 0, tls: ssl.SSLContext | None = None) -> Bot:
        self.server = await serve(self._handler, "127.0.0.1", port, ssl=tls, max_size=1 << 20)
        port = next(iter(self.server.sockets)).getsockname()[1]
        self.url = f"twilio+{'wss' if tls else 'ws'}://127.0.0.1:{port}/media"
        return self

    async def _handler(self, ws: ServerConnection) -> None:
        self.conns.append(ws)
        try:
            async for message in ws:
                event = json.loads(message)
                self.received.append(event)
                if self.echo and event["event"] == "media":
                    payload = event["media"]["payload"]
                    await self.send({"event": "media", "media": {"payload": payload}})
        except ConnectionClosed:
            pass

    @property
    def sid(self) -> str:
        return str(self.of("start")[0]["streamSid"])

    def of(self, kind: str) -> list[Event]:
        return [e for e in self.received if e["event"] == kind]

    async def send(self, event: Event) -> None:
        await self.conns[-1].send(json.dumps({"streamSid": self.sid, **event}))

    async def speak(self, seconds: float) -> None:
        """`seconds` of BOT_TONE in 20 ms media messages, as fast as it can (bots send ahead)."""
        ulaw = bot_tone(seconds)
        for i in range(0, len(ulaw), 160):
            payload = base64.b64encode(ulaw[i : i + 160]).decode()
            await self.send({"event": "media", "media": {"payload": payload}})

    def marks(self) -> list[str]:
        return [e["mark"]["name"] for e in self.of("mark")]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def run(main: Callable[[Bot], Any], bot: Bot | None = None, port: int = 0) -> Any:
    async def outer() -> Any:
        b = await (bot or Bot()).start(port)
        try:
            return await main(b)
        finally:
            await b.close()

    return asyncio.run(outer())


def loud_ms(c: Caller, since: int = 0) -> int:
    """ms of BOT_TONE the caller got after its first `since` bytes."""
    got = c.result.received
    return 20 * sum(
        1
        for i in range(since, len(got) - 1919, 1920)
        if tone_power(bytes(got[i : i + 1920]), BOT_TONE) > 0.001
    )


def test_the_stream_is_what_twilio_sends_and_a_mark_waits_for_its_audio(stack: Stack) -> None:
    async def main(bot: Bot) -> None:
        c, session_id = await call(stack, bot.url)
        await eventually(lambda: len(bot.of("media")) >= 50)
        connected, start = bot.received[:2]
        assert connected == {"event": "connected", "protocol": "Call", "version": "1.0.0"}
        assert start["event"] == "start" and start["sequenceNumber"] == "1"
        body = start["start"]
        assert body["mediaFormat"] == {
            "encoding": "audio/x-mulaw",
            "sampleRate": 8000,
            "channels": 1,
        }
        assert body["tracks"] == ["inbound"] and body["streamSid"] == start["streamSid"]
        custom = body["customParameters"]
        assert custom["session_id"] == session_id and custom["region"] == "eu-test"
        media = bot.of("media")
        assert [int(m["sequenceNumber"]) for m in media] == list(range(2, len(media) + 2))
        assert [int(m["media"]["chunk"]) for m in media] == list(range(1, len(media) + 1))
        assert [int(m["media"]["timestamp"]) for m in media] == [20 * i for i in range(len(media))]
        caller_audio = b"".join(base64.b64decode(m["media"]["payload"]) for m in media[-50:])
        assert tone_power(ulaw_decode(caller_audio), CALLER_TONE, 8000) > 0.001
        # Three seconds of answer sent at once, then a mark: echoed once it has been played.
        since = len(c.result.received)
        await bot.speak(3.0)
        await bot.send({"event": "mark", "mark": {"name": "answer-end"}})
        await eventually(lambda: hears(c, BOT_TONE, since=since, window=9600), 10)
        assert bot.marks() == []  # the answer is playing: the mark waits
        await eventually(lambda: bot.marks() == ["answer-end"], 10)
        assert loud_ms(c, since) >= 2500  # the caller got (nearly) all of it first
        # A mark with nothing queued is echoed at once.
        await bot.send({"event": "mark", "mark": {"name": "idle"}})
        await eventually(lambda: bot.marks() == ["answer-end", "idle"], 5)
        echo = bot.of("mark")[0]
        assert echo == {
            "event": "mark",
            "sequenceNumber": echo["sequenceNumber"],
            "streamSid": bot.sid,
            "mark": {"name": "answer-end"},
        }
        await c.close()
        await eventually(lambda: bot.of("stop"), 10)  # the call's end is the stream's
        (stop,) = bot.of("stop")
        assert stop["streamSid"] == bot.sid and stop["stop"]["callSid"] == body["callSid"]

    run(main)


def test_clear_silences_queued_audio_and_echoes_pending_marks(stack: Stack) -> None:
    async def main(bot: Bot) -> None:
        c, _ = await call(stack, bot.url)
        await eventually(lambda: bot.of("start"))
        since = len(c.result.received)
        await bot.speak(6.0)  # six seconds queued at the transceiver
        await bot.send({"event": "mark", "mark": {"name": "after-answer"}})
        await eventually(lambda: hears(c, BOT_TONE, since=since, window=9600), 10)
        await bot.send({"event": "clear"})
        await eventually(lambda: bot.marks() == ["after-answer"], 5)  # at once, as Twilio does
        mark = len(c.result.received) + 9600  # what was on its way when the clear came
        await eventually(lambda: len(c.result.received) >= mark + 48000, 10)
        assert tone_power(heard(c, since=mark), BOT_TONE) < 0.0005
        assert loud_ms(c, since) < 4000  # most of the six seconds was never played
        await c.close()

    run(main)


def test_bad_input_from_the_bot_is_counted_and_the_call_goes_on(stack: Stack) -> None:
    _, tx = stack
    reasons = [
        "twilio_not_json",
        "twilio_unknown_event",
        "twilio_bad_base64",
        "twilio_missing_fields",
        "twilio_oversize",
        "twilio_binary",
        "twilio_wrong_stream",
    ]
    before = {r: event_count(tx, r) for r in reasons}

    async def main(bot: Bot) -> None:
        c, _ = await call(stack, bot.url)
        await eventually(lambda: bot.of("start"))
        ws = bot.conns[-1]
        await ws.send("not json {")
        await bot.send({"event": "dance"})
        await bot.send({"event": "media", "media": {"payload": "***"}})
        await bot.send({"event": "mark"})
        await bot.send({"event": "media", "media": {"payload": "A" * 600_000}})
        await ws.send(b"\x00\x01binary")
        await ws.send(json.dumps({"event": "clear", "streamSid": "MZ" + "f" * 32}))
        await asyncio.to_thread(
            wait_until, lambda: all(event_count(tx, r) > before[r] for r in reasons)
        )
        since = len(c.result.received)
        await bot.speak(2.0)  # the call goes on
        await eventually(lambda: hears(c, BOT_TONE, since=since, window=9600), 10)
        await c.close()

    run(main)


async def hang_up(bot: Bot) -> None:
    await bot.conns[-1].close()


async def overflow(bot: Bot) -> None:
    """Over 1 MiB the transceiver's link to any agent gives up (it bounds what it buffers)."""
    try:
        await bot.send({"event": "media", "media": {"payload": "A" * (1 << 20)}})
    except (ConnectionError, ConnectionClosed):
        pass  # it may cut the link before the bot has written it all: what this checks


@pytest.mark.parametrize(("end", "reason"), [(hang_up, "agent_closed"), (overflow, "agent_lost")])
def test_the_end_of_the_bots_stream_ends_the_call_and_says_why(
    stack: Stack, end: Callable[[Bot], Awaitable[None]], reason: str
) -> None:
    """The bot hangs up, or its link fails: the stream is the call, so the call ends."""
    _, tx = stack
    ids: list[str] = []

    async def main(bot: Bot) -> None:
        c, session_id = await call(stack, bot.url)
        ids.append(session_id)
        try:
            await eventually(lambda: bot.of("start"))
            await end(bot)
            await eventually(lambda: c.pc.connectionState in ("closed", "failed"), 10)
        finally:  # (a failure here must not leave the caller's sockets to later tests)
            await c.close()

    run(main)
    assert tx.end_reason(ids[0]) == {"error": "session ended", "reason": reason}
    assert event_count(tx, f"ended_{reason}") >= 1


def test_a_wss_bot_with_a_ca_file(stack: Stack, cert: tuple[Path, Path]) -> None:
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert[0], cert[1])

    async def main() -> None:
        bot = await Bot(echo=True).start(tls=tls)
        try:
            assert bot.url.startswith("twilio+wss://")
            c, _ = await call(stack, bot.url)
            await eventually(lambda: hears(c, CALLER_TONE), 15)
            await c.close()
        finally:
            await bot.close()

    asyncio.run(main())


def test_the_callers_signaling_socket_says_the_bot_hung_up(stack: Stack) -> None:
    """Through signaling: `--agent-url bot=twilio+ws://...`, a call over its WebSocket, the
    bot hangs up; the caller's call events end with that reason."""
    from websockets.asyncio.client import connect

    relay, tx = stack
    port = free_tcp_port()
    sig = SignalingProcess(
        *["--transceiver", tx.api, "--ingress", f"{relay.listen[0]}:{relay.listen[1]}"],
        *["--agent-url", f"bot=twilio+ws://127.0.0.1:{port}/media", "--ip-rate", "0"],
    ).start()

    async def main(bot: Bot) -> list[Event]:
        c = Caller(ToneTrack(CALLER_TONE))
        async with connect(sig.ws_url) as ws:
            await ws.send(json.dumps({"type": "auth", "token": sig.API_KEY}))

            async def signal(offer: str) -> str:
                await ws.send(json.dumps({"type": "offer", "sdp": offer, "agent": "bot"}))
                answer = json.loads(await ws.recv())
                assert answer["type"] == "answer", answer
                return str(answer["sdp"])

            await c.start(signal)
            await asyncio.wait_for(c.wait_connected(), 10)
            await eventually(lambda: bot.of("start"))
            await bot.conns[-1].close()
            said: list[Event] = []
            async with asyncio.timeout(15):
                async for message in ws:
                    said.append(json.loads(message))
        await c.close()
        return said

    try:
        said = run(main, Bot(), port)
    finally:
        sig.kill()
    assert said[-2:] == [
        {"type": "state", "state": "ended"},
        {"type": "bye", "reason": "agent_closed"},
    ]


def test_a_bot_that_is_down_at_call_start_is_retried_as_a_native_agent_is(stack: Stack) -> None:
    _, tx = stack
    port = free_tcp_port()
    failures = event_count(tx, "agent_failures")

    async def main() -> None:
        c, _ = await call(stack, f"twilio+ws://127.0.0.1:{port}/media")  # nobody there yet
        await asyncio.to_thread(wait_until, lambda: event_count(tx, "agent_failures") > failures)
        mark = len(c.result.received)  # the call goes on, in silence
        await eventually(lambda: len(c.result.received) >= mark + 48000)
        assert tone_power(heard(c, since=mark), CALLER_TONE) < 0.001
        bot = await Bot(echo=True).start(port)
        try:
            started = len(c.result.received)
            await eventually(lambda: hears(c, CALLER_TONE, since=started), 15)  # backoff <= 5 s
            assert bot.received[0]["event"] == "connected"
            assert bot.received[1]["event"] == "start"
        finally:
            await c.close()
            await bot.close()

    asyncio.run(main())
