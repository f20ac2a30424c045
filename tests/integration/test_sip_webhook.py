"""OpenAI's SIP call control on the edge, driven by the official `openai` SDK.

With `--sip-webhook`, an INVITE rings while `realtime.call.incoming` is posted to the app,
signed as OpenAI signs it (the SDK's `webhooks.unwrap` checks it), and the app answers with
`client.realtime.calls.accept/reject/refer/hangup` against the edge's base URL, exactly as it
would against OpenAI's. The phone is the scripted one on real sockets (`tests/sip_phone.py`).
"""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import os
import queue
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from firsthop.services.signaling.sip_calls import RING_TTL
from firsthop.shared.wire import sip

from ..sip_phone import Phone, PhoneStack, power_at, tone
from ..support import (
    SignalingProcess,
    free_tcp_port,
    onsets,
    peak_hz,
    probe_recording,
    wait_until,
)

pytestmark = pytest.mark.slow

SECRET = "whsec_" + base64.b64encode(os.urandom(24)).decode()
RECORDED_TRUNK = "127.0.0.3"


@dataclass
class App:
    """The app's side: a webhook endpoint (a real HTTP server) and the official SDK."""

    stack: PhoneStack
    events: queue.Queue[tuple[bytes, dict[str, str]]]
    client: openai.OpenAI
    records: Path  # the transceiver's --record-dir

    def incoming(self, timeout: float = 10.0) -> Any:
        """The next webhook, verified by the SDK (it raises on a bad signature)."""
        body, headers = self.events.get(timeout=timeout)
        return self.client.webhooks.unwrap(body, headers)


@contextlib.contextmanager
def webhook_endpoint() -> Iterator[tuple[str, queue.Queue[tuple[bytes, dict[str, str]]]]]:
    """The app's webhook: a real HTTP server on loopback; (its URL, what it was posted)."""
    events: queue.Queue[tuple[bytes, dict[str, str]]] = queue.Queue()

    class Hook(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            events.put((body, {k.lower(): v for k, v in self.headers.items()}))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_tcp_port()), Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", events
    finally:
        server.shutdown()
        server.server_close()


def sipcall_keys(stack: PhoneStack) -> list[str]:
    import redis

    client = redis.Redis.from_url(stack.redis.url, decode_responses=True)
    try:
        return list(client.scan_iter("firsthop:sipcall:*"))
    finally:
        client.close()


def client_for(stack: PhoneStack) -> openai.OpenAI:
    return openai.OpenAI(
        api_key=SignalingProcess.API_KEY,
        base_url=f"{stack.sig.url}/v1",
        webhook_secret=SECRET,
        max_retries=0,
    )


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[App]:
    records = tmp_path_factory.mktemp("records")
    with webhook_endpoint() as (url, events):
        flags = ["--sip-webhook", url, "--sip-webhook-secret", SECRET]
        # a second trunk, whose every call the operator records (`--sip-record`)
        flags += ["--sip-trunk", f"recorded={RECORDED_TRUNK}/32", "--sip-record", "recorded"]
        with PhoneStack.running(*flags, transceiver=("--record-dir", str(records))) as stack:
            with client_for(stack) as client:  # (its pooled connections closed with it)
                yield App(stack, events, client, records)


def answered(app: App, phone: Phone, **accept: Any) -> str:
    """The phone calls, the app accepts (`accept`: the SDK call's extra arguments), the phone
    acknowledges the 200: the call's id."""
    phone.send(phone.request("INVITE", body=phone.offer()))
    call_id = str(app.incoming().data.call_id)
    app.client.realtime.calls.accept(call_id, type="realtime", model="echo", **accept)
    final = phone.responses_until_final()[-1]
    assert final.status == 200
    phone.remote_tag = sip.parse_name_addr(final.get("to") or "").tag
    phone.answer = final.body.decode()
    phone.send(phone.request("ACK", cseq=1, cseq_method="ACK"))
    return call_id


def hung_up(app: App, phone: Phone, call_id: str) -> None:
    """The app hangs up; the phone answers the edge's BYE."""
    app.client.realtime.calls.hangup(call_id)
    bye = phone.receive(timeout=5)
    assert isinstance(bye, sip.SipRequest) and bye.method == "BYE"
    phone.sock.sendto(sip.response_to(bye, 200, "OK").encode(), app.stack.sip)


def test_the_app_accepts_and_the_phone_hears_its_agent(app: App) -> None:
    phone = Phone(app.stack.sip)
    try:
        phone.send(phone.request("INVITE", body=phone.offer()))
        event = app.incoming()  # signed: unwrap verified it
        assert event.type == "realtime.call.incoming"
        call_id = event.data.call_id
        headers = {h.name: h.value for h in event.data.sip_headers}
        assert headers["Call-ID"] == phone.call_id and "+15550100" in headers["From"]
        assert "Via" not in headers
        app.client.realtime.calls.accept(call_id, type="realtime", model="echo")
        final = phone.responses_until_final()[-1]
        assert final.status == 200
        phone.remote_tag = sip.parse_name_addr(final.get("to") or "").tag
        phone.answer = final.body.decode()
        phone.send(phone.request("ACK", cseq=1, cseq_method="ACK"))
        heard = phone.talk(tone(750.0, 2.0))
        assert power_at(heard[-4000:], 750.0) > 0.5
        # the accepting key owns the call: its sideband (realtime.connect(call_id=...)'s
        # route) reaches the call's agent, whose answer comes back on it
        from websockets.sync.client import connect

        url = f"ws://127.0.0.1:{app.stack.sig.port}/v1/realtime?call_id={call_id}"
        auth = {"Authorization": f"Bearer {SignalingProcess.API_KEY}"}
        with connect(url, additional_headers=auth) as sideband:
            sideband.send(json.dumps({"type": "hello"}))
            echoed = json.loads(sideband.recv(timeout=5))
        assert echoed == {"type": "echo", "event": {"type": "hello"}}
        hung_up(app, phone, call_id)  # the app hangs up: the phone gets a BYE
    finally:
        phone.close()
    assert not list(app.records.glob(f"{call_id}*"))  # not asked: nothing written for it


def recorded_call(app: App, phone: Phone, said: bytes, **accept: Any) -> tuple[str, httpx.Response]:
    """A call the app accepts (`accept`), `said` on it, the app hangs up: (its id, its
    recording as the accepting key fetched it once there was one, 409 before)."""
    try:
        call_id = answered(app, phone, **accept)
        url = f"{app.stack.sig.url}/v1/calls/{call_id}/recording"
        auth = {"Authorization": f"Bearer {SignalingProcess.API_KEY}"}
        phone.talk(said)
        assert httpx.get(url, headers=auth).status_code == 409  # not while it lasts
        hung_up(app, phone, call_id)
    finally:
        phone.close()
    wait_until(lambda: httpx.get(url, headers=auth).status_code == 200, timeout=10)
    got = httpx.get(url, headers=auth)
    assert got.headers["content-type"] == "audio/wav"
    return call_id, got


def test_a_phone_call_the_app_asked_to_record_is_a_wave_of_both_sides_for_its_key(
    app: App,
) -> None:
    """`accept?record=true` (extension): the call's G.711 both ways, not coded again, in one
    two-channel WAVE file (the trunk left, the agent right), served to the accepting key once
    the call ended, its beeps where the phone said them and the echo's just after."""
    beep = tone(750.0, 0.3) + bytes(2 * 4000)  # 0.3 s on, 0.5 s off
    began = time.monotonic()
    call_id, got = recorded_call(
        app, Phone(app.stack.sip), beep * 4, extra_query={"record": "true"}
    )
    lasted = time.monotonic() - began
    assert httpx.get(got.url, headers={"Authorization": "Bearer nobody"}).status_code == 401
    stream, pcm = probe_recording(got.content, ".wav", 8000)
    assert (stream["codec_name"], stream["channels"], stream["sample_rate"]) == (
        "pcm_mulaw", 2, "8000",
    )  # fmt: skip
    meta = json.loads((app.records / f"{call_id}.json").read_text())
    assert meta["format"] == "audio/wav" and meta["channels"] == ["caller", "agent"]
    assert abs(stream["duration"] - meta["seconds"]) <= 0.02  # to a frame
    assert 3.2 <= stream["duration"] < lasted + 1.5, (stream["duration"], lasted)
    left, right = pcm[:, 0], pcm[:, 1]
    assert abs(peak_hz(left, 8000) - 750) < 5 and abs(peak_hz(right, 8000) - 750) < 5
    said, echoed = onsets(left, 8000), onsets(right, 8000)
    assert len(said) == 4 and len(echoed) >= 3, (said, echoed)
    lags = [min((e - s for e in echoed if e >= s - 0.02), default=9.0) for s in said[:-1]]
    assert all(-0.021 <= lag <= 0.3 for lag in lags), lags


def test_a_trunk_the_operator_records_is_recorded_whatever_the_app_says(app: App) -> None:
    """`--sip-record recorded`: its call is recorded though the app's accept did not ask, and
    the file is the accepting key's, like the call."""
    phone = Phone(app.stack.sip, host=RECORDED_TRUNK)
    _, got = recorded_call(app, phone, tone(500.0, 1.0))
    stream, pcm = probe_recording(got.content, ".wav", 8000)
    assert stream["channels"] == 2 and stream["duration"] >= 1.0
    assert abs(peak_hz(pcm[:, 0], 8000) - 500) < 5  # the phone's tone, on the left


def test_the_app_rejects(app: App) -> None:
    phone = Phone(app.stack.sip)
    try:
        invite = phone.request("INVITE", body=phone.offer())
        phone.send(invite)
        call_id = app.incoming().data.call_id
        app.client.realtime.calls.reject(call_id, status_code=486)
        assert phone.responses_until_final()[-1].status == 486
        with pytest.raises(openai.NotFoundError):  # decided already: nothing to accept
            app.client.realtime.calls.accept(call_id, type="realtime", model="echo")
        # a trunk's INVITEs leave nothing behind once they end: the ringing record goes too
        wait_until(lambda: not sipcall_keys(app.stack), 5)
    finally:
        phone.close()


def test_the_app_transfers_the_caller(app: App) -> None:
    phone = Phone(app.stack.sip)
    try:
        phone.send(phone.request("INVITE", body=phone.offer()))
        call_id = app.incoming().data.call_id
        app.client.realtime.calls.accept(call_id, type="realtime", model="echo")
        final = phone.responses_until_final()[-1]
        assert final.status == 200
        phone.remote_tag = sip.parse_name_addr(final.get("to") or "").tag
        phone.send(phone.request("ACK", cseq=1, cseq_method="ACK"))
        app.client.realtime.calls.refer(call_id, target_uri="tel:+14155550123")
        refer = phone.receive(timeout=5)
        assert isinstance(refer, sip.SipRequest) and refer.method == "REFER"
        assert refer.get("refer-to") == "<tel:+14155550123>"
        phone.sock.sendto(sip.response_to(refer, 202, "Accepted").encode(), app.stack.sip)
        for evil in ("sip:x@y>\r\nX-Evil: 1", "sip:x@y?Replaces=abc%3Bto-tag%3D1"):
            with pytest.raises(openai.BadRequestError):  # no header injection through a target
                app.client.realtime.calls.refer(call_id, target_uri=evil)
        # the trunk tells how the transfer went (RFC 3515 §2.4.4): the target answered
        for frag in (b"SIP/2.0 100 Trying\r\n", b"SIP/2.0 200 OK\r\n"):
            notify = phone.request("NOTIFY")
            extra = (("event", "refer"), ("content-type", "message/sipfrag;version=2.0"))
            phone.send(replace(notify, headers=notify.headers + extra, body=frag))
            assert phone.responses_until_final()[-1].status == 200
        assert app.stack.signaling_event("sip_transfers_completed") == 1
        assert app.stack.signaling_event("sip_refers_accepted") == 1
        phone.send(phone.request("BYE"))  # the trunk ends our leg once it has transferred
        assert phone.responses_until_final()[-1].status == 200
    finally:
        phone.close()


def test_a_cancel_while_the_app_decides_ends_it_and_a_late_accept_finds_nothing(app: App) -> None:
    phone = Phone(app.stack.sip)
    try:
        invite = phone.request("INVITE", body=phone.offer())
        phone.send(invite)
        call_id = app.incoming().data.call_id
        phone.cancel(invite)

        def accept_refused() -> bool:
            try:
                app.client.realtime.calls.accept(call_id, type="realtime", model="echo")
            except openai.NotFoundError:
                return True
            return False

        wait_until(accept_refused, 3)
        assert not app.stack.live_sessions()
    finally:
        phone.close()


def final_or_bye(phone: Phone, timeout: float) -> tuple[str, sip.SipResponse | None]:
    """What the phone hears next that ends its ring: a final status (and the response), or
    a BYE (answered 200)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            got = phone.receive(max(0.01, left))
        except TimeoutError:
            break
        if isinstance(got, sip.SipResponse) and got.status >= 200:
            return str(got.status), got
        if isinstance(got, sip.SipRequest) and got.method == "BYE":
            phone.sock.sendto(sip.response_to(got, 200, "OK").encode(), phone.edge)
            return "BYE", None
    return "still ringing", None


def ended(stack: PhoneStack, call_id: str) -> bool:
    """Its session is over: signaling's record of the call is gone."""
    return not stack.call_record(call_id)


def test_an_app_that_hangs_up_as_it_accepts_ends_the_ring_at_once(app: App) -> None:
    """accept, then hangup at once: the ringing replica found the call answered but its
    session gone, and had said nothing to the trunk, which rang on to its ring timeout."""
    for _ in range(3):  # (the hangup lands before the ringing task's next look, or after)
        phone = Phone(app.stack.sip)
        try:
            phone.send(phone.request("INVITE", body=phone.offer()))
            call_id = str(app.incoming().data.call_id)
            app.client.realtime.calls.accept(call_id, type="realtime", model="echo")
            app.client.realtime.calls.hangup(call_id)
            heard, final = final_or_bye(phone, 5.0)
            assert heard in ("480", "200"), heard
            if final is not None and heard == "200":  # (answered before the hangup)
                phone.remote_tag = sip.parse_name_addr(final.get("to") or "").tag
                phone.send(phone.request("ACK", cseq=1, cseq_method="ACK"))
                assert final_or_bye(phone, 5.0)[0] == "BYE"
            wait_until(partial(ended, app.stack, call_id), 5)
        finally:
            phone.close()


def test_redis_paused_while_a_call_rings_loses_nothing(app: App) -> None:
    """Redis unanswering for 2 s while the app decides: a look that could not read the
    call's record had been taken for "the call is gone", and the ringing task ended without
    a word to the trunk, while the record (its delete failed too) took a later accept: a
    session placed for a phone that never got its 200 OK. Now the ring waits for Redis."""
    import redis as redis_lib

    phone = Phone(app.stack.sip)
    client = redis_lib.Redis.from_url(app.stack.redis.url)
    try:
        phone.send(phone.request("INVITE", body=phone.offer()))
        call_id = str(app.incoming().data.call_id)
        client.execute_command("CLIENT", "PAUSE", "2000")  # type: ignore[no-untyped-call]
        time.sleep(2.5)
        app.client.realtime.calls.accept(call_id, type="realtime", model="echo")
        final = phone.responses_until_final()[-1]
        assert final.status == 200
        phone.remote_tag = sip.parse_name_addr(final.get("to") or "").tag
        phone.send(phone.request("ACK", cseq=1, cseq_method="ACK"))
        assert client.ttl(f"firsthop:sipcall:{call_id}") > RING_TTL  # (answered: hours)
        hung_up(app, phone, call_id)
        wait_until(partial(ended, app.stack, call_id), 5)
        assert app.stack.signaling_event("sip_decision_unreadable") > 0
    finally:
        client.close()
        phone.close()


def test_a_forged_or_stale_webhook_does_not_verify(app: App) -> None:
    """What the app's SDK checks, shown failing: the edge's signature is the only one that
    passes (a body changed after signing, a wrong secret)."""
    phone = Phone(app.stack.sip)
    try:
        phone.send(phone.request("INVITE", body=phone.offer()))
        body, headers = app.events.get(timeout=10)
        event = json.loads(body)
        tampered = json.dumps({**event, "data": {**event["data"], "call_id": "rtc_forged"}})
        with pytest.raises(openai.InvalidWebhookSignatureError):
            app.client.webhooks.unwrap(tampered, headers)
        other = openai.OpenAI(
            api_key="x", webhook_secret="whsec_" + base64.b64encode(b"k" * 24).decode()
        )
        with pytest.raises(openai.InvalidWebhookSignatureError):
            other.webhooks.unwrap(body, headers)
        app.client.realtime.calls.reject(event["data"]["call_id"], status_code=603)
        assert phone.responses_until_final()[-1].status == 603
    finally:
        phone.close()


def test_an_app_accepts_for_a_realtime_backend_with_g711_straight_through(tmp_path: object) -> None:
    """The app accepts with a session whose audio is `audio/pcmu` both ways: the phone's
    mu-law goes to the Realtime backend (the offline assistant) as it came, and its answer
    to the phone as it was said (never decoded, resampled and encoded again)."""
    from websockets.sync.client import connect

    from firsthop.services.transceiver.resample import resample

    from ..sip_phone import PhoneStack as Stack
    from ..support import AgentProcess, events_until, spoken

    assistant = AgentProcess("assistant")
    assistant.start(timeout=60)
    backend = f"realtime+ws://127.0.0.1:{assistant.port}/v1/realtime"
    try:
        with (
            webhook_endpoint() as (url, events),
            Stack.running(
                *("--sip-webhook", url, "--sip-webhook-secret", SECRET),
                *("--agent-url", f"assistant={backend}"),
            ) as stack,
        ):
            client = client_for(stack)
            phone = Phone(stack.sip)
            try:
                phone.send(phone.request("INVITE", body=phone.offer("0 101")))
                body, headers = events.get(timeout=10)
                call_id = client.webhooks.unwrap(body, headers).data.call_id  # type: ignore[union-attr]
                client.realtime.calls.accept(
                    call_id,
                    type="realtime",
                    model="assistant",
                    audio={
                        "input": {"format": {"type": "audio/pcmu"}},
                        "output": {"format": {"type": "audio/pcmu"}},
                    },
                )
                final = phone.responses_until_final()[-1]
                assert final.status == 200
                phone.remote_tag = sip.parse_name_addr(final.get("to") or "").tag
                phone.answer = final.body.decode()
                phone.send(phone.request("ACK", cseq=1, cseq_method="ACK"))
                url = f"ws://127.0.0.1:{stack.sig.port}/v1/realtime?call_id={call_id}"
                auth = {"Authorization": f"Bearer {SignalingProcess.API_KEY}"}
                with connect(url, additional_headers=auth) as sideband:
                    question = resample(spoken("what time is it"), 24000, 8000)
                    heard = phone.talk(question + bytes(16000 * 4))
                    seen = events_until(sideband, "response.output_audio_transcript.done")
                done = [e for e in seen if e.get("type") == "response.output_audio_transcript.done"]
                # the question was heard and answered (what Whisper makes of espeak-ng's voice
                # through G.711 is `test_assistant.py`'s and the hearing bench's business)
                heard_text = [
                    e for e in seen if e.get("type", "").endswith("transcription.completed")
                ]
                assert heard_text and heard_text[0].get("transcript"), seen
                assert done and done[0].get("transcript"), [e.get("type") for e in seen]
                text = stack.tx.request("GET", "/metrics")[1].decode()
                straight = re.search(r'event="agent_audio_straight_through"} (\d+)', text)
                assert straight and int(straight[1]) > 100  # the question went as it came
                back = re.search(r'event="agent_frames_straight_through"} (\d+)', text)
                assert back and int(back[1]) > 25  # and the answer came as it was said
                answer = heard[len(question) :]
                assert max(abs(x) for x in memoryview(answer).cast("h")) > 1000  # aloud
                client.realtime.calls.hangup(call_id)
            finally:
                phone.close()
                client.close()  # (a pooled connection left to the collector fails another test)
    finally:
        assistant.kill()
