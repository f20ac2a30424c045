"""Phone calls through the edge: SIP on signaling, plain RTP through the relay's one port.

The whole edge runs as processes (`tests/sip_phone.py`'s `PhoneStack`: Redis, relay,
transceiver, echo agent, signaling with `--sip-listen`); the calls come from real user agents
(baresip, sipp) and, where a case has to happen on cue, from a scripted phone on real sockets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import pytest

from firsthop.shared.wire import g711, rtp, sip

from ..sip_phone import (
    SIPP_BYE,
    Phone,
    PhoneStack,
    baresip_call,
    play_pcap,
    power_at,
    run_sipp,
    sipp_invite,
    tone,
)
from ..support import (
    AgentProcess,
    SignalingProcess,
    events_until,
    peak_hz,
    probe_recording,
    spoken,
    wait_until,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def stack() -> Iterator[PhoneStack]:
    with PhoneStack.running() as running:
        yield running


@pytest.mark.parametrize(("payload_type", "codecs"), [(0, "0 101"), (8, "8 101")])
def test_a_phone_hears_its_own_tone_back_through_the_relay(
    stack: PhoneStack, payload_type: int, codecs: str
) -> None:
    phone = Phone(stack.sip)
    try:
        _, responses = phone.invite("echo", codecs)
        assert [r.status for r in responses][-2:] == [180, 200]
        assert phone.media_target == stack.relay.listen  # the one public port, not the transceiver
        assert f"RTP/AVP {payload_type} 101" in (phone.answer or "")
        heard = phone.talk(tone(700.0, 3.0), payload_type)
        assert len(heard) > 8000  # over a second of it came back
        assert power_at(heard[-8000:], 700.0) > 0.5  # and it is the caller's own tone
        phone.send(phone.request("BYE"))
        assert phone.responses_until_final()[-1].status == 200
    finally:
        phone.close()


def test_an_unknown_agent_is_404_and_a_stranger_403(stack: PhoneStack) -> None:
    phone = Phone(stack.sip)
    stranger = Phone(stack.sip, host="127.0.0.2")  # no trunk has it
    try:
        _, responses = phone.invite("nobody")
        assert responses[-1].status == 404
        _, responses = stranger.invite("echo")
        assert responses[-1].status == 403
    finally:
        phone.close()
        stranger.close()


def test_cancel_while_it_rings(stack: PhoneStack) -> None:
    phone = Phone(stack.sip)
    try:
        invite = phone.request("INVITE", body=phone.offer())
        phone.send(invite)
        first = phone.receive()
        assert isinstance(first, sip.SipResponse) and first.status == 100
        branch = sip.parse_via(invite.vias()[0]).branch
        phone.send(phone.request("CANCEL", branch=branch, cseq=invite.cseq, cseq_method="CANCEL"))
        statuses: set[int] = set()
        deadline = time.monotonic() + 5
        while not {200, 487} <= statuses and time.monotonic() < deadline:
            message = phone.receive()
            if isinstance(message, sip.SipResponse):
                statuses.add(message.status)
        assert {200, 487} <= statuses
    finally:
        phone.close()


def test_baresip_hears_its_own_voice_back(stack: PhoneStack, tmp_path: Path) -> None:
    """A real SIP user agent (baresip, PCMU) through signaling, the relay and the echo agent."""
    heard, log = baresip_call(stack.sip, "echo", tone(600.0, 6.0, level=12000), 5, str(tmp_path))
    assert "180 Ringing" in log and "PCMU" in log, log[-2000:]
    assert len(heard) >= 2 * 8000 * 2, log[-2000:]  # 2 s and more of what came back
    assert power_at(heard[-2 * 8000 :], 600.0) > 0.5  # its own tone, not silence
    wait_until(lambda: not stack.live_sessions(), 10)  # its BYE ended the session


def test_dtmf_from_sipp_reaches_the_agent(stack: PhoneStack, tmp_path: Path) -> None:
    """RFC 4733 events (sipp's own captures of keys 1 and #) reach the agent, one each."""
    before = {
        d: stack.agent.metric("firsthop_agent_dtmf_total", kind="echo", digit=d) for d in "1#"
    }
    scenario = sipp_invite("echo") + '  <pause milliseconds="500"/>\n'  # (the call settles)
    scenario += play_pcap("/usr/share/sip-tester/dtmf_2833_1.pcap")
    scenario += play_pcap("/usr/share/sip-tester/dtmf_2833_pound.pcap")
    # (the pound's last packets a moment to arrive before the BYE ends the call: on a loaded
    # machine a CI run once had the call end first, and that key never reached the agent)
    scenario += '  <pause milliseconds="1500"/>\n' + SIPP_BYE
    status, said = run_sipp(stack.sip, scenario, str(tmp_path))
    assert status == 0, said

    def dtmf(digit: str) -> float:
        return stack.agent.metric("firsthop_agent_dtmf_total", kind="echo", digit=digit)

    # (on a busy machine the events may reach the agent after sipp's BYE)
    wait_until(lambda: all(dtmf(d) >= before[d] + 1 for d in "1#"))
    assert {d: dtmf(d) for d in "1#"} == {d: before[d] + 1 for d in "1#"}


def test_options_pings_and_methods_nobody_serves(stack: PhoneStack) -> None:
    phone = Phone(stack.sip)
    try:
        ping = phone.request("OPTIONS")  # as carriers send it (a short one's 200 may leave
        ping = dataclasses.replace(  # its Allow out: an answer is no bigger than a question)
            ping,
            headers=(
                *ping.headers,
                ("user-agent", "Carrier SBC 4.2"),
                ("accept", "application/sdp"),
                ("supported", "replaces, timer"),
            ),
        )
        phone.send(ping)
        ok = phone.responses_until_final()[-1]
        assert ok.status == 200 and "INVITE" in (ok.get("allow") or "")
        phone.send(phone.request("REGISTER"))
        assert phone.responses_until_final()[-1].status == 405
        phone.send(phone.request("MESSAGE", body=b"hi"))
        assert phone.responses_until_final()[-1].status == 405
    finally:
        phone.close()


def test_the_edge_hangs_up_with_a_bye(stack: PhoneStack) -> None:
    """A session that ends on the edge's side (here: DELETE on the transceiver, as a drain
    or the agent would) is found by signaling's watch, and the phone gets a BYE."""
    phone = Phone(stack.sip)
    try:
        _, responses = phone.invite("echo")
        assert responses[-1].status == 200
        wait_until(lambda: stack.live_sessions(), 5)
        (session,) = stack.live_sessions()
        assert stack.tx.request("DELETE", f"/internal/v1/sessions/{session}")[0] == 204
        bye = phone.receive(timeout=5)
        assert isinstance(bye, sip.SipRequest) and bye.method == "BYE"
        assert bye.call_id == phone.call_id
        phone.sock.sendto(sip.response_to(bye, 200, "OK").encode(), stack.sip)
    finally:
        phone.close()


def test_over_tcp_the_edges_bye_finds_the_trunks_new_connection(stack: PhoneStack) -> None:
    """A call placed over TCP whose connection then went (the trunk reconnects from another
    port): the edge's BYE goes on the trunk's new connection, not by UDP, and not lost."""

    def messages(conn: socket.socket, framer: sip.SipStream, until: float) -> list[object]:
        conn.settimeout(max(0.1, until - time.monotonic()))
        return [sip.parse_sip(m) for m in framer.feed(conn.recv(65536))]

    phone = Phone(stack.sip)  # (its requests, sent on connections instead)
    before = set(stack.live_sessions())  # (an earlier test's may not have gone yet)
    first = socket.create_connection(stack.sip, timeout=5)
    try:
        invite = phone.request("INVITE", body=phone.offer())
        first.sendall(invite.encode().replace(b"SIP/2.0/UDP", b"SIP/2.0/TCP"))
        framer, final, deadline = sip.SipStream(), None, time.monotonic() + 10
        while final is None and time.monotonic() < deadline:
            for m in messages(first, framer, deadline):
                if isinstance(m, sip.SipResponse) and m.status >= 200:
                    final = m
        assert final is not None and final.status == 200
        phone.remote_tag = sip.parse_name_addr(final.get("to") or "").tag
        ack = phone.request("ACK", cseq=invite.cseq, cseq_method="ACK")
        first.sendall(ack.encode().replace(b"SIP/2.0/UDP", b"SIP/2.0/TCP"))
        wait_until(lambda: set(stack.live_sessions()) - before, 5)
        (session,) = set(stack.live_sessions()) - before
        first.close()
        second = socket.create_connection(stack.sip, timeout=5)
        try:
            second.sendall(b"\r\n\r\n")
            assert second.recv(100) == b"\r\n"  # (the edge holds it now)
            assert stack.tx.request("DELETE", f"/internal/v1/sessions/{session}")[0] == 204
            framer, deadline = sip.SipStream(), time.monotonic() + 5
            got: list[object] = []
            while not any(isinstance(m, sip.SipRequest) for m in got):
                got += messages(second, framer, deadline)
            bye = next(m for m in got if isinstance(m, sip.SipRequest))  # (after any 200 again)
            assert isinstance(bye, sip.SipRequest) and bye.method == "BYE", got
            assert bye.call_id == phone.call_id
            assert (bye.get("via") or "").startswith("SIP/2.0/TCP ")
            second.sendall(sip.response_to(bye, 200, "OK").encode())
        finally:
            second.close()
    finally:
        first.close()
        phone.close()


def test_torture_messages_and_an_invite_flood_leave_calls_working(
    stack: PhoneStack, tmp_path: Path
) -> None:
    """RFC 4475's kinds of malformed messages and garbage get a 400 (when it is no bigger
    than the message) or a counted drop; a flood of INVITEs from a stranger gets a bounded
    number of 403s; a call works all along."""
    vectors = Path(__file__).parent.parent / "vectors" / "sip"
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        raw.bind(("127.0.0.1", 0))
        raw.settimeout(5.0)
        sizes = {}  # what may be answered, by Call-ID: a request that parsed, or salvages
        for path in sorted(vectors.glob("invalid_*.sip")):
            data = path.read_bytes()
            raw.sendto(data, stack.sip)
            message: sip.SipRequest | sip.SipResponse | None
            try:
                message = sip.parse_sip(data)  # (its check fails: 400)
            except sip.SipError:
                message = sip.salvage_request(data)
            if message is not None:
                sizes[message.get("call-id")] = len(data)
        for junk in (
            b"",
            b"\x00" * 100,
            b"INVITE\r\n\r\n",
            os.urandom(1400),
            b"SIP/2.0 200 OK\r\n\r\n",
        ):
            raw.sendto(junk, stack.sip)
        assert len(sizes) >= 8
        answered = 0
        with contextlib.suppress(TimeoutError):  # (the first may take a while)
            while True:
                data = raw.recv(65536)
                answer = sip.parse_sip(data)
                assert isinstance(answer, sip.SipResponse) and answer.status == 400
                assert len(data) <= sizes[answer.get("call-id")]  # never a reflector
                answered += 1
                raw.settimeout(0.5)
        assert answered >= 4  # (and nothing for the garbage)
        stranger.bind(("127.0.0.3", 0))
        flood = Phone(stack.sip, host="127.0.0.3")
        for _ in range(300):
            stranger.sendto(flood.request("INVITE", body=flood.offer()).encode(), stack.sip)
        flood.close()
        forbidden = 0
        stranger.settimeout(5.0)  # (the first may take a while on a loaded machine)
        with contextlib.suppress(TimeoutError):
            while True:
                reply = sip.parse_sip(stranger.recv(65536))
                assert isinstance(reply, sip.SipResponse) and reply.status == 403
                forbidden += 1
                stranger.settimeout(0.5)
        assert 0 < forbidden <= 60  # rate-bounded: never a reflector
        phone = Phone(stack.sip)
        try:
            _, responses = phone.invite("echo")
            assert responses[-1].status == 200
            heard = phone.talk(tone(900.0, 2.0))
            assert power_at(heard[-4000:], 900.0) > 0.5
            phone.send(phone.request("BYE"))
            assert phone.responses_until_final()[-1].status == 200
        finally:
            phone.close()
    finally:
        raw.close()
        stranger.close()


def test_the_assistant_answers_a_spoken_question_on_the_phone(tmp_path: Path) -> None:
    """The offline assistant behind the Realtime bridge, called on the phone: a question
    spoken (espeak-ng, sent as PCMU) is heard and answered aloud; the call's sideband (the
    transceiver's, as an app would reach it) gets the Realtime events of the answer."""
    from websockets.sync.client import connect

    from firsthop.services.transceiver.resample import resample

    assistant = AgentProcess("assistant")
    backend = f"realtime+ws://127.0.0.1:{assistant.port}/v1/realtime"
    assistant.start(timeout=60)
    try:
        with PhoneStack.running("--agent-url", f"assistant={backend}") as stack:
            phone = Phone(stack.sip)
            try:
                assert phone.invite("assistant")[1][-1].status == 200
                wait_until(lambda: stack.live_sessions(), 5)
                (session,) = stack.live_sessions()
                url = f"ws://127.0.0.1:{stack.tx.api_port}/internal/v1/sessions/{session}/events"
                with connect(url, additional_headers=stack.tx.auth) as sideband:
                    question = resample(spoken("what time is it"), 24000, 8000)
                    heard = phone.talk(question + bytes(16000 * 4))  # and 4 s to answer
                    events = events_until(sideband, "response.output_audio_transcript.done")
                types = [e.get("type") for e in events]
                assert "conversation.item.input_audio_transcription.completed" in types, types
                done = [
                    e for e in events if e.get("type") == "response.output_audio_transcript.done"
                ]
                assert done and "UTC" in str(done[0].get("transcript")), types
                answer = np.frombuffer(heard[len(question) :], "<i2").astype(float)
                assert np.sqrt((answer**2).mean()) > 300  # it said it aloud, not silence
                phone.send(phone.request("BYE"))
                assert phone.responses_until_final()[-1].status == 200
            finally:
                phone.close()
    finally:
        assistant.kill()


def test_a_trunk_whose_calls_are_recorded_leaves_a_wave_of_each_in_the_record_dir(
    tmp_path: Path,
) -> None:
    """`--sip-record local`: every call from that trunk is recorded (its A-law both ways, as
    carried, caller left), the file in the transceiver's --record-dir; no API credential owns
    a trunk's call, so none fetches it."""
    with PhoneStack.running(
        "--sip-record", "local", transceiver=("--record-dir", str(tmp_path))
    ) as stack:
        phone = Phone(stack.sip)
        try:
            _, responses = phone.invite("echo", "8 101")
            assert responses[-1].status == 200
            wait_until(lambda: stack.live_sessions(), 5)
            heard = phone.talk(tone(600.0, 2.0), 8)
            assert power_at(heard[-4000:], 600.0) > 0.5
            phone.send(phone.request("BYE"))
            assert phone.responses_until_final()[-1].status == 200
        finally:
            phone.close()
        wait_until(lambda: list(tmp_path.glob("*.wav")), 10)
        (found,) = tmp_path.glob("*.wav")
        meta = json.loads(found.with_suffix(".json").read_text())
        key = {"Authorization": f"Bearer {SignalingProcess.API_KEY}"}
        got = httpx.get(f"{stack.sig.url}/v1/calls/{found.stem}/recording", headers=key)
        assert got.status_code == 403  # the trunk's call: not an API key's
    stream, pcm = probe_recording(found.read_bytes(), ".wav", 8000)
    assert (stream["codec_name"], stream["channels"]) == ("pcm_alaw", 2)
    assert abs(stream["duration"] - meta["seconds"]) <= 0.02 and stream["duration"] >= 2.0
    left, right = pcm[:, 0], pcm[:, 1]
    assert abs(peak_hz(left, 8000) - 600) < 5 and abs(peak_hz(right, 8000) - 600) < 5


def test_rtp_from_anywhere_but_the_offered_address_reaches_no_call(stack: PhoneStack) -> None:
    """The relay forwards a phone call's media only from the address the trunk's offer
    named (the flow the transceiver published): a spoofer elsewhere is a counted drop at the
    relay (no flow, and none in Redis), never heard by the call, never answered."""
    phone = Phone(stack.sip)
    spoofer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert phone.invite("echo")[1][-1].status == 200
        spoofer.bind(("127.0.0.1", 0))
        spoofer.settimeout(0.2)

        def drops() -> float:
            metrics = stack.relay.metrics()
            return sum(
                v for (name, _), v in metrics.items() if name == "firsthop_relay_drops_total"
            )

        before = drops()
        payload = g711.ulaw_encode(tone(300.0, 0.02))
        for i in range(50):
            spoofer.sendto(
                rtp.RtpPacket(0, i, 160 * i, 0xBAD, payload).encode(), phone.media_target
            )
        with pytest.raises(TimeoutError):
            spoofer.recv(2048)  # nothing comes back to it
        wait_until(lambda: drops() >= before + 50, 5)  # each one: no flow (held, then not)
        heard = phone.talk(tone(1100.0, 1.5))  # the call itself goes on, its own tone only
        assert power_at(heard[-4000:], 1100.0) > 0.5 and power_at(heard, 300.0) < 0.01
        phone.send(phone.request("BYE"))
        assert phone.responses_until_final()[-1].status == 200
    finally:
        phone.close()
        spoofer.close()


def test_a_trunk_cannot_claim_another_calls_media_address(stack: PhoneStack) -> None:
    """An offer naming the media address of a live call (of another trunk, or a caller's)
    would take its relay flow: it is refused (488), and the first call goes on."""
    first, second = Phone(stack.sip), Phone(stack.sip)
    try:
        assert first.invite("echo")[1][-1].status == 200
        port = first.media.getsockname()[1]
        offer = second.offer().replace(
            f"m=audio {second.media.getsockname()[1]} ".encode(), f"m=audio {port} ".encode()
        )
        second.send(second.request("INVITE", body=offer))
        assert second.responses_until_final()[-1].status == 488
        heard = first.talk(tone(1300.0, 1.5))
        assert power_at(heard[-4000:], 1300.0) > 0.5
        first.send(first.request("BYE"))
        assert first.responses_until_final()[-1].status == 200
    finally:
        first.close()
        second.close()


def test_baresip_over_tcp(stack: PhoneStack, tmp_path: Path) -> None:
    """SIP over TCP (its media still RTP over UDP through the relay)."""
    before = stack.signaling_event("sip_tcp_connections")
    heard, log = baresip_call(
        stack.sip, "echo", tone(450.0, 5.0, level=12000), 4, str(tmp_path), "tcp"
    )
    assert stack.signaling_event("sip_tcp_connections") == before + 1, log[-2000:]
    assert len(heard) >= 2 * 8000 * 2, log[-2000:]
    assert power_at(heard[-2 * 8000 :], 450.0) > 0.5


def test_tcp_connections_are_a_trunks_only_and_framed_strictly(stack: PhoneStack) -> None:
    """A connection from no trunk's address is closed at once; a keep-alive gets its pong;
    a stream that cannot be framed is closed; a request on a connection is answered on it."""
    stranger = socket.create_connection(stack.sip, timeout=5, source_address=("127.0.0.2", 0))
    try:
        assert stranger.recv(100) == b""  # closed by the edge, nothing said
    finally:
        stranger.close()
    trunk = socket.create_connection(stack.sip, timeout=5)
    try:
        trunk.sendall(b"\r\n\r\n")
        assert trunk.recv(100) == b"\r\n"
        trunk.sendall(b"\r\n\r\n" * 2000)  # one write of pings: a pong a read, not each
        pongs = trunk.recv(100)
        trunk.settimeout(0.3)
        with contextlib.suppress(TimeoutError):
            while more := trunk.recv(65536):  # (whatever else comes within 0.3 s)
                pongs += more
        trunk.settimeout(5)
        assert pongs and set(pongs) <= set(b"\r\n") and len(pongs) <= 2 * 8, len(pongs)
        phone = Phone(stack.sip)
        options = phone.request("OPTIONS").encode().replace(b"SIP/2.0/UDP", b"SIP/2.0/TCP")
        phone.close()
        trunk.sendall(options)
        answer = sip.parse_sip(trunk.recv(65536))
        assert isinstance(answer, sip.SipResponse) and answer.status == 200
        # a UDP request from the connection's own address is answered by UDP (RFC 3261
        # §18.2.2), never on the connection (a forger of the address could put it there)
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            udp.bind(trunk.getsockname())
            udp.settimeout(5)
            udp.sendto(options.replace(b"SIP/2.0/TCP", b"SIP/2.0/UDP"), stack.sip)
            answer = sip.parse_sip(udp.recv(65536))
            assert isinstance(answer, sip.SipResponse) and answer.status == 200
            trunk.settimeout(0.5)
            with pytest.raises(TimeoutError):
                trunk.recv(100)
            trunk.settimeout(5)
        finally:
            udp.close()
        trunk.sendall(b"OPTIONS sip:x SIP/2.0\r\nContent-Length: nope\r\n\r\n")
        assert trunk.recv(100) == b""  # unframeable: the connection goes
    finally:
        trunk.close()


def test_baresip_with_sdes_srtp(stack: PhoneStack, tmp_path: Path) -> None:
    """RTP/SAVP keyed in the SDP (RFC 4568): baresip insists on it (srtp-mand), hears its
    echo, and every packet of the call authenticated."""

    def events_now() -> dict[str, float]:
        from firsthop.shared.metrics import parse_text

        text = stack.tx.request("GET", "/metrics")[1].decode()
        return {
            dict(labels)["event"]: value
            for (name, labels), value in parse_text(text).items()
            if name == "firsthop_transceiver_events_total"
        }

    before = events_now()
    heard, log = baresip_call(
        stack.sip, "echo", tone(520.0, 5.0, level=12000), 4, str(tmp_path), mediaenc="srtp-mand"
    )
    assert "srtp" in log.lower(), log[-2000:]
    assert len(heard) >= 2 * 8000 * 2, log[-2000:]
    assert power_at(heard[-2 * 8000 :], 520.0) > 0.5
    after = events_now()
    assert after.get("rtp_packets_in", 0) >= before.get("rtp_packets_in", 0) + 150
    for failure in ("srtp_auth_fail", "srtp_replay_fail", "srtp_malformed"):
        assert after.get(failure, 0) == before.get(failure, 0), failure


def test_hold_and_resume_by_reinvite(stack: PhoneStack) -> None:
    """A re-INVITE putting the call on hold (sendonly) is answered recvonly, one resuming it
    (sendrecv) sendrecv; the call's audio goes on after."""
    phone = Phone(stack.sip)
    try:
        invite, responses = phone.invite("echo")
        assert responses[-1].status == 200
        for direction, answered in (("sendonly", "recvonly"), ("sendrecv", "sendrecv")):
            offer = phone.offer().replace(b"a=sendrecv", f"a={direction}".encode())
            reinvite = phone.request("INVITE", body=offer)
            phone.send(reinvite)
            final = phone.responses_until_final()[-1]
            assert final.status == 200 and f"a={answered}".encode() in final.body
            assert b" 2 IN IP4" in final.body or b" 3 IN IP4" in final.body  # o= version up
            phone.send(phone.request("ACK", cseq=reinvite.cseq, cseq_method="ACK"))
        heard = phone.talk(tone(1200.0, 1.5))
        assert power_at(heard[-4000:], 1200.0) > 0.5
        phone.send(phone.request("BYE"))
        assert phone.responses_until_final()[-1].status == 200
    finally:
        phone.close()


def test_a_media_streams_bot_answers_the_phone() -> None:
    """The third kind of agent: a Twilio Media Streams bot (`twilio+ws://`, here the echo
    bot) behind a phone call hears the caller (8 kHz mu-law, as Twilio sends it) and what it
    sends back is heard on the phone."""
    bot = AgentProcess("twilio-echo")
    bot.start()
    try:
        url = f"twilio+ws://127.0.0.1:{bot.port}/"
        with PhoneStack.running("--agent-url", f"bot={url}") as stack:
            phone = Phone(stack.sip)
            try:
                assert phone.invite("bot", "0 101")[1][-1].status == 200  # PCMU
                heard = phone.talk(tone(850.0, 2.5))
                assert power_at(heard[-6000:], 850.0) > 0.5
                # a PCMU call's mu-law went to the bot as it came, never transcoded
                text = stack.tx.request("GET", "/metrics")[1].decode()
                straight = re.search(r'event="agent_audio_straight_through"} (\d+)', text)
                assert straight and int(straight[1]) > 50
                phone.send(phone.request("BYE"))
                assert phone.responses_until_final()[-1].status == 200
            finally:
                phone.close()
    finally:
        bot.kill()


def test_sipp_gets_its_session_timer_in_the_answer(stack: PhoneStack, tmp_path: Path) -> None:
    """RFC 4028 with sipp: an INVITE that supports and requires timers (refresher=uac) is
    answered with its interval, its refresher and `Require: timer`; sipp's refresh (an
    UPDATE without an offer) gets 200 with no body; BYE ends it."""
    scenario = sipp_invite("echo").replace(
        "Max-Forwards: 70\n      Content-Type: application/sdp",
        "Max-Forwards: 70\n      Session-Expires: 90;refresher=uac\n      Supported: timer\n"
        "      Require: timer\n      Content-Type: application/sdp",
        1,
    )
    check = (
        '<recv response="200"><action>'
        '<ereg regexp="90;refresher=uac" search_in="hdr" header="Session-Expires:" '
        'check_it="true" assign_to="se"/>'
        '<ereg regexp="timer" search_in="hdr" header="Require:" check_it="true" assign_to="rq"/>'
        "</action></recv>"
    )
    scenario = scenario.replace('<recv response="200"/>', check, 1)
    scenario += """
  <send retrans="500"><![CDATA[
      UPDATE sip:echo@[remote_ip]:[remote_port] SIP/2.0
      Via: SIP/2.0/[transport] [local_ip]:[local_port];branch=[branch]
      From: <sip:sipp@[local_ip]:[local_port]>;tag=[pid]SIPpTag[call_number]
      To: <sip:echo@[remote_ip]:[remote_port]>[peer_tag_param]
      Call-ID: [call_id]
      CSeq: 2 UPDATE
      Contact: <sip:sipp@[local_ip]:[local_port]>
      Session-Expires: 90;refresher=uac
      Max-Forwards: 70
      Content-Length: 0
  ]]></send>
  <recv response="200"><action>
    <ereg regexp="^$" search_in="body" check_it="true" assign_to="body"/>
  </action></recv>
""" + SIPP_BYE.replace("CSeq: 2 BYE", "CSeq: 3 BYE")
    scenario += '  <Reference variables="se,rq,body"/>\n'  # (sipp: each checked, none used)
    status, said = run_sipp(stack.sip, scenario, str(tmp_path))
    assert status == 0, said


def test_one_probe_tells_which_sessions_ended(stack: PhoneStack) -> None:
    """The transceiver's batched liveness probe (signaling watches its phone calls with it):
    bounded, and an unknown or ended session says why it is not there."""
    probe = partial(
        stack.tx.request, "POST", "/internal/v1/sessions/ended", ctype="application/json"
    )
    status, body = probe(json.dumps({"ids": ["nope"]}).encode())
    assert status == 200 and json.loads(body) == {"ended": {"nope": "session_ended"}}
    assert probe(json.dumps({"ids": ["x"] * 1001}).encode())[0] == 400
    assert probe(json.dumps({"ids": "x"}).encode())[0] == 400
    assert probe(b"[1, 2]")[0] == 400
    assert (
        stack.tx.request("POST", "/internal/v1/sessions/ended", b"{}", "application/json", auth={})[
            0
        ]
        == 401
    )


def test_a_reoffer_may_hold_but_not_move_or_change_the_media(stack: PhoneStack) -> None:
    """A re-INVITE that drops the call's codec, or names another media address, is refused
    (488) and the call goes on as it was: the relay's flow and the pin cannot follow it."""
    phone = Phone(stack.sip)
    try:
        assert phone.invite("echo", "0 101")[1][-1].status == 200  # PCMU
        port = phone.media.getsockname()[1]
        for offer in (
            phone.offer("8 101"),  # PCMA only: a codec change
            phone.offer("0 101").replace(
                f"m=audio {port}".encode(), f"m=audio {port + 1}".encode()
            ),
        ):
            reinvite = phone.request("INVITE", body=offer)
            phone.send(reinvite)
            assert phone.responses_until_final()[-1].status == 488
            branch = sip.parse_via(reinvite.vias()[0]).branch
            phone.send(phone.request("ACK", branch=branch, cseq=reinvite.cseq, cseq_method="ACK"))
        heard = phone.talk(tone(1500.0, 1.5))
        assert power_at(heard[-4000:], 1500.0) > 0.5
        phone.send(phone.request("BYE"))
        assert phone.responses_until_final()[-1].status == 200
    finally:
        phone.close()
