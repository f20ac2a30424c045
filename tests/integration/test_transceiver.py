"""The transceiver through a real relay with real aiortc callers and a real echo agent."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Iterator
from functools import partial
from typing import Any, Required, TypedDict

import pytest

from firsthop.services.call.caller import Caller, Signal, ToneTrack, dominant, tone_power
from firsthop.shared.wire import stun
from tests.support import (
    AgentProcess,
    RelayProcess,
    TransceiverProcess,
    eventually,
    free_tcp_port,
    tx_metrics,
    wait_until,
)

FREQS = [300.0 + 150 * i for i in range(12)]

Stack = tuple[RelayProcess, AgentProcess, TransceiverProcess]


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    relay = RelayProcess().start()
    agent = AgentProcess("echo").start()
    tx = TransceiverProcess("--accept-direct", agent_url=agent.url).start()
    yield relay, agent, tx
    tx.kill()
    agent.kill()
    relay.kill()


def ingress(relay: RelayProcess) -> list[str]:
    return [f"{relay.listen[0]}:{relay.listen[1]}"]


def signal_via(tx: TransceiverProcess, where: list[str], **extra: object) -> Signal:
    """Signaling straight to the transceiver's internal API, advertising `where`."""

    async def signal(offer: str) -> str:
        status, body = await asyncio.to_thread(tx.create_session, offer, where, **extra)
        assert status == 201, body
        return str(body["answer_sdp"])

    return signal


class CallerEvent(TypedDict, total=False):
    """A message on the caller's data channel: the call's state from the transceiver, or
    an event of the agent's (services/agent/server.py)."""

    type: Required[str]
    state: str  # call.state
    event: dict[str, object]  # echo: the caller's own event, back
    frames: int  # response_started
    interrupted: bool  # response_done


def caller_events(c: Caller) -> list[CallerEvent]:
    return [json.loads(m) for m in c.result.events if isinstance(m, str)]


def heard(c: Caller, since: int = 0, window: int = 48000) -> bytes:
    """The last `window` bytes of what `c` received after its first `since` (PCM16 mono
    48 kHz: 48000 bytes is 0.5 s); fewer if less has arrived."""
    received = c.result.received
    return bytes(received[max(since, len(received) - window) :])


def hears(c: Caller, freq: float, since: int = 0, window: int = 48000) -> bool:
    """Whether `c` hears `freq`: a whole `window` arrived after `since`, and the tone is
    clearly audible in it (silence is ~1e-8)."""
    tail = heard(c, since, window)
    return len(tail) == window and tone_power(tail, freq) > 0.001


def metric(tx: TransceiverProcess, name: str, **labels: str) -> float:
    from firsthop.shared.metrics import parse_text

    status, body = tx.request("GET", "/metrics")
    assert status == 200
    return parse_text(body.decode()).get((name, frozenset(labels.items())), 0.0)


def event_count(tx: TransceiverProcess, event: str) -> float:
    return metric(tx, "firsthop_transceiver_events_total", event=event)


def test_ten_sessions_on_one_socket_each_hear_only_their_own_tone(stack: Stack) -> None:
    relay, _, tx = stack

    tones = FREQS[:10]

    async def main() -> list[tuple[float, float]]:
        callers = [Caller(ToneTrack(f)) for f in tones]
        await asyncio.gather(*(c.start(signal_via(tx, ingress(relay))) for c in callers))
        await asyncio.gather(*(asyncio.wait_for(c.wait_connected(), 15) for c in callers))
        # each hears a second of its own tone back ...
        await eventually(
            lambda: all(hears(c, f, window=96000) for c, f in zip(callers, tones, strict=True))
        )
        # ... all of it through the relay, both ways
        packets = partial(relay.metric, "firsthop_relay_packets_total")
        await asyncio.to_thread(
            wait_until,
            lambda: packets(direction="upstream") > 500 and packets(direction="downstream") > 500,
        )
        out = []
        for c, f in zip(callers, tones, strict=True):
            tail = heard(c, window=96000)
            out.append((f, dominant(tail, FREQS)))
            # still its own tone at the end (a whole clear second was heard above); ten
            # callers in this one process on two cores may leave a late frame or two in it
            assert tone_power(tail, f) > 0.0002  # not silence (~1e-8)
        releases = await asyncio.to_thread(event_count, tx, "memory_releases")
        await asyncio.gather(*(c.close() for c in callers))
        # the last call gone, the freed heap is handed back (not while calls were live)
        await asyncio.to_thread(
            wait_until, lambda: event_count(tx, "memory_releases") == releases + 1
        )
        # each call's quality, observed at its end (the media core's RTCP and jitter)
        jitter = await asyncio.to_thread(metric, tx, "firsthop_call_jitter_seconds_count")
        assert jitter >= len(callers)
        return out

    results = asyncio.run(main())
    assert all(sent == loudest for sent, loudest in results), results  # and no one else's
    assert relay.metric("firsthop_relay_packets_total", direction="upstream") > 500
    assert relay.metric("firsthop_relay_packets_total", direction="downstream") > 500
    assert metric(tx, "firsthop_transceiver_drops_total", reason="unframed") == 0  # no bypass
    assert metric(tx, "firsthop_transceiver_resident_bytes") > 10 * 1024 * 1024
    # what the process loaded to start (~97,000 objects) is out of every collection's walk,
    # and the collections since were timed (`shared/memory.py`)
    assert metric(tx, "firsthop_gc_frozen_objects") > 50_000
    assert metric(tx, "firsthop_gc_full_pause_seconds_count") > 0
    status, body = tx.request("GET", "/metrics")  # (metric() reads a missing one as 0)
    assert status == 200 and b"\nfirsthop_transceiver_memory_released_bytes_total " in body


def test_answer_advertises_only_the_ingress_and_is_ice_lite(stack: Stack) -> None:
    relay, _, tx = stack

    async def main() -> str:
        c = Caller()
        await c.start(signal_via(tx, ingress(relay)))
        await c.close()
        return c.result.answer_sdp

    answer = asyncio.run(main())
    cands = [line for line in answer.splitlines() if line.startswith("a=candidate:")]
    assert cands and all(f" {relay.listen[1]} typ host" in c for c in cands)
    assert str(tx.media[1]) not in "".join(cands)
    assert "a=ice-lite" in answer
    ufrag = next(line for line in answer.splitlines() if line.startswith("a=ice-ufrag:"))
    assert len(ufrag.split(":", 1)[1]) == 40  # an IPv4 route token


def test_direct_mode(stack: Stack) -> None:
    _, _, tx = stack

    async def main() -> float:
        c = Caller(ToneTrack(700))
        await c.start(signal_via(tx, [f"{tx.media[0]}:{tx.media[1]}"]))
        await asyncio.wait_for(c.wait_connected(), 10)
        await eventually(lambda: hears(c, 700))
        loudest = dominant(heard(c), [500, 700, 900])
        await c.close()
        return loudest

    assert asyncio.run(main()) == 700


def test_wrong_dtls_fingerprint_is_rejected(stack: Stack) -> None:
    relay, _, tx = stack
    before = event_count(tx, "ended_connection_failed")

    async def main() -> None:
        c = Caller()

        async def forged(offer: str) -> str:
            lines = offer.splitlines()
            for i, line in enumerate(lines):
                if line.startswith("a=fingerprint:sha-256 "):
                    head, last = line[:-2], line[-2:]
                    lines[i] = head + ("00" if last != "00" else "11")
            return await signal_via(tx, ingress(relay))("\r\n".join(lines) + "\r\n")

        await c.start(forged)
        # The caller may believe it connected (the server checks the certificate at the
        # end of the handshake), but the server refuses: the session ends, and no audio
        # came back before it did (none can after).
        await asyncio.to_thread(
            wait_until, lambda: event_count(tx, "ended_connection_failed") > before
        )
        assert tone_power(bytes(c.result.received), 440) < 0.0005
        await c.close()

    asyncio.run(main())


VALID_OFFER_HEAD = "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
AUDIO = (
    "m=audio 9 UDP/TLS/RTP/SAVPF 111\r\nc=IN IP4 0.0.0.0\r\na=mid:0\r\n"
    "a=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuvwx\r\n"
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32) + "\r\na=setup:actpass\r\n"
    "a=rtpmap:111 opus/48000/2\r\na=sendrecv\r\na=rtcp-mux\r\n"
)


@pytest.mark.parametrize(
    ("offer", "reason"),
    [
        ("", "offer_sdp"),
        ("hello", "v=0"),
        (VALID_OFFER_HEAD, "no m-line"),
        (VALID_OFFER_HEAD + AUDIO.replace("m=audio", "m=video"), "no audio"),
        (VALID_OFFER_HEAD + AUDIO.replace("a=ice-ufrag:abcd\r\n", ""), "ice-ufrag"),
        (VALID_OFFER_HEAD + AUDIO.replace("abcdefghijklmnopqrstuvwx", "short"), "ice-pwd"),
        (
            VALID_OFFER_HEAD + AUDIO.replace("a=fingerprint:sha-256 AB", "a=fingerprint:md5 AB"),
            "fingerprint",
        ),
        (VALID_OFFER_HEAD + AUDIO * 4, "m-lines"),
        (VALID_OFFER_HEAD + AUDIO + AUDIO.replace("a=mid:0", "a=mid:1"), "BUNDLE"),
        (
            VALID_OFFER_HEAD
            + AUDIO
            + "".join(
                f"a=candidate:{i} 1 udp 1 203.0.113.1 {1000 + i} typ host\r\n" for i in range(21)
            ),
            "candidates",
        ),
        (
            VALID_OFFER_HEAD + AUDIO.replace("a=rtpmap:111 opus/48000/2", "a=rtpmap:111 foo/8000"),
            "offers no opus",
        ),
        (
            VALID_OFFER_HEAD + AUDIO.replace("a=rtpmap:111 opus/48000/2", "a=rtpmap:111 PCMU/8000"),
            "offers no opus",  # the agent's voice goes out as Opus: G.711 alone cannot carry it
        ),
    ],
)
def test_malformed_offers_get_400_with_a_reason(stack: Stack, offer: str, reason: str) -> None:
    relay, _, tx = stack
    status, body = tx.create_session(offer, ingress(relay))
    assert status == 400, body
    assert reason.lower() in body["error"].lower()


def test_bad_api_requests(stack: Stack) -> None:
    _, _, tx = stack
    assert tx.request("POST", "/internal/v1/sessions", b"{", "application/json")[0] == 400
    assert tx.request("POST", "/internal/v1/sessions", b"x", "text/plain")[0] == 415
    assert tx.request("POST", "/internal/v1/sessions", b"[]", "application/json")[0] == 400
    big = json.dumps({"offer_sdp": "v" * 100_000}).encode()
    assert tx.request("POST", "/internal/v1/sessions", big, "application/json")[0] == 413
    assert tx.request("DELETE", "/internal/v1/sessions/nope")[0] == 404
    assert (
        tx.request(
            "PATCH", "/internal/v1/sessions/nope", b"a=x", "application/trickle-ice-sdpfrag"
        )[0]
        == 404
    )


def test_junk_and_truncated_stun_at_the_media_socket(stack: Stack) -> None:
    relay, _, tx = stack

    async def main() -> None:
        c = Caller(ToneTrack(440))
        await c.start(signal_via(tx, [f"{tx.media[0]}:{tx.media[1]}"]))
        await asyncio.wait_for(c.wait_connected(), 10)
        ufrag = next(
            line.split(":", 1)[1]
            for line in c.result.answer_sdp.splitlines()
            if line.startswith("a=ice-ufrag:")
        )
        junk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        username = (ufrag + ":evil").encode()
        attrs = struct.pack("!HH", stun.USERNAME, len(username)) + username
        attrs += b"\0" * (-len(username) % 4)
        # RFC 8445 PRIORITY is 4 bytes; a 2-byte one made aioice raise struct.error (the
        # table's LiteIce is now the one ICE agent: it reads no PRIORITY)
        attrs += struct.pack("!HHH", stun.PRIORITY, 2, 7) + b"\0\0"
        crafted = struct.pack("!HHI", 0x0001, len(attrs), stun.MAGIC_COOKIE) + b"x" * 12 + attrs
        # ... and the same, signed with the call's real credentials (a hostile caller)
        pc: Any = c.pc
        (ice,) = pc._RTCPeerConnection__iceTransports
        conn = ice._connection
        pwd = next(
            line.split(":", 1)[1]
            for line in c.result.answer_sdp.splitlines()
            if line.startswith("a=ice-pwd:")
        )
        signed = stun.build_stun(
            stun.BINDING,
            stun.REQUEST,
            b"y" * 12,
            [(stun.USERNAME, f"{ufrag}:{conn.local_username}".encode()), (stun.PRIORITY, b"\0\7")],
            integrity_key=pwd.encode(),
        )
        pair = conn._nominated[1]
        # the echo heard first: the transceiver has its SRTP keys (the caller may be
        # "connected" before the transceiver's DTLS is: forged SRTP sent then is
        # `srtp_before_keys`, as a CI run found), and the caller's address is proven
        await eventually(lambda: hears(c, 440, since=0))
        pair.protocol.transport.sendto(signed, pair.remote_addr)
        datagrams = [
            crafted,
            b"\x00\x01\x00\x00",
            b"\x16\xfe\xfd" + bytes(40),
            b"\x80" * 200,
            bytes(24),
            b"\xff" * 1600,
            b"",
        ]
        for _ in range(5):
            for d in datagrams:
                junk.sendto(d, tx.media)
        junk.close()
        # forged SRTP from the caller's own (validated) address: authentication fails
        for seq in range(5):
            forged = b"\x80\x6f" + seq.to_bytes(2, "big") + bytes(8) + b"\xaa" * 60
            pair.protocol.transport.sendto(forged, pair.remote_addr)
        after = len(c.result.received)
        await eventually(lambda: hears(c, 440, since=after))
        loudest = dominant(heard(c, since=after), [440, 880])
        await c.close()
        assert loudest == 440  # the call carried on

    asyncio.run(main())
    wait_until(lambda: event_count(tx, "stun_auth_fail") >= 5)  # unsigned: dropped, unanswered
    assert event_count(tx, "session_datagram_error") == 0  # signed: answered, nothing raised
    try:
        wait_until(lambda: event_count(tx, "srtp_auth_fail") >= 5)
    except AssertionError:
        counts = {k: event_count(tx, k) for k in ("srtp_auth_fail", "srtp_before_keys")}
        drops = [line for line in tx_metrics(tx) if "drops_total" in line or "path_" in line]
        raise AssertionError(f"forged SRTP not all refused by SRTP: {counts}, {drops}") from None
    status, _ = tx.request("GET", "/healthz")
    assert status == 200


def test_internal_range_candidates_are_never_contacted(stack: Stack) -> None:
    relay, _, tx = stack
    trap = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    trap.bind(("127.0.0.1", 0))
    trap.settimeout(0.5)
    before = event_count(tx, "candidate_denied_range")

    async def main() -> None:
        c = Caller()

        async def with_trap(offer: str) -> str:
            extra = (
                f"a=candidate:1 1 udp 2130706431 127.0.0.1 {trap.getsockname()[1]} typ host\r\n"
                "a=candidate:2 1 udp 2130706431 10.1.2.3 5000 typ host\r\n"
                "a=candidate:3 1 udp 2130706431 abcd.local 5000 typ host\r\n"
            )
            offer = offer.replace("a=mid:0\r\n", "a=mid:0\r\n" + extra, 1)
            return await signal_via(tx, ingress(relay))(offer)

        await c.start(with_trap)
        await asyncio.wait_for(c.wait_connected(), 10)
        await asyncio.sleep(1.0)  # the call runs a while: long enough to contact the trap, if
        await c.close()  # anything would (the counts below are made when the offer arrives)

    asyncio.run(main())
    with pytest.raises(TimeoutError):
        trap.recvfrom(2048)
    trap.close()
    assert event_count(tx, "candidate_denied_range") >= before + 2
    assert event_count(tx, "candidate_mdns") >= 1


def test_data_channel_events_both_ways_and_bad_ones_dropped(stack: Stack) -> None:
    relay, _, tx = stack
    before_big = event_count(tx, "event_dropped_oversize")
    before_bad = event_count(tx, "event_dropped_not_json")

    async def main() -> list[CallerEvent]:
        c = Caller(data_channel=True)
        await c.start(signal_via(tx, ingress(relay)))
        await asyncio.wait_for(c.wait_connected(), 10)
        channel = c.channel
        assert channel is not None
        await eventually(lambda: channel.readyState == "open", 5)
        channel.send(json.dumps({"type": "hello", "n": 1}))
        channel.send("not json {")
        channel.send(json.dumps({"blob": "x" * 70_000}))
        channel.send(json.dumps({"type": "hello", "n": 2}))

        def answered() -> bool:  # both good events came back, and the call's state
            events = caller_events(c)
            return any(e["type"] == "call.state" for e in events) and 2 <= len(echoes(events))

        await eventually(answered)
        await c.close()
        return caller_events(c)

    def echoes(events: list[CallerEvent]) -> list[CallerEvent]:
        return [e for e in events if e["type"] == "echo"]

    events = asyncio.run(main())
    assert [e["event"]["n"] for e in echoes(events)] == [1, 2]
    assert any(e.get("type") == "call.state" for e in events)
    wait_until(lambda: event_count(tx, "event_dropped_oversize") >= before_big + 1)
    wait_until(lambda: event_count(tx, "event_dropped_not_json") >= before_bad + 1)
    assert event_count(tx, "event_dropped_oversize") == before_big + 1  # once each, no more
    assert event_count(tx, "event_dropped_not_json") == before_bad + 1


def test_agent_down_then_back(stack: Stack) -> None:
    relay, _, tx = stack
    port = free_tcp_port()
    agent = AgentProcess("echo", port)  # started later, on a port the call already names
    failures = event_count(tx, "agent_failures")

    async def main() -> tuple[float, float]:
        c = Caller(ToneTrack(523))
        await c.start(signal_via(tx, ingress(relay), agent_url=f"ws://127.0.0.1:{port}"))
        await asyncio.wait_for(c.wait_connected(), 10)  # the call connects with no agent
        await asyncio.to_thread(wait_until, lambda: event_count(tx, "agent_failures") > failures)
        mark = len(c.result.received)  # from now on, half a second of the call with no agent
        await eventually(lambda: len(c.result.received) >= mark + 48000)
        silent = tone_power(heard(c, since=mark), 523)
        await asyncio.to_thread(agent.start)
        started = len(c.result.received)
        await eventually(lambda: hears(c, 523, since=started), 15)  # reconnects back off <= 5 s
        loud = tone_power(heard(c, since=started), 523)
        await c.close()
        return silent, loud

    try:
        silent, loud = asyncio.run(main())
    finally:
        agent.kill()
    assert silent < 0.001 < loud


def test_an_ended_session_says_why(stack: Stack) -> None:
    relay, _, tx = stack
    ids: list[str] = []

    async def main() -> None:
        c = Caller()

        async def signal(offer: str) -> str:
            status, body = await asyncio.to_thread(tx.create_session, offer, ingress(relay))
            assert status == 201
            ids.append(body["session_id"])
            return str(body["answer_sdp"])

        await c.start(signal)
        await asyncio.wait_for(c.wait_connected(), 10)
        status, _ = await asyncio.to_thread(tx.request, "DELETE", f"/internal/v1/sessions/{ids[0]}")
        assert status == 204
        await c.close()

    asyncio.run(main())
    assert tx.end_reason(ids[0], 5) == {"error": "session ended", "reason": "deleted"}


def test_a_callers_own_flood_of_long_packets_is_decoded_at_most_in_real_time(
    stack: Stack,
) -> None:
    """A hostile caller, keyed like any: its own SRTP, a second stream of 120 ms Opus
    packets at 900 a second (6 ms each under the session's 1,000 datagrams a second), 108 s
    of audio a second. Before stop 48 all of it was decoded and handed to its agent: that
    call took 27 % of a core, a normal one 4 %. Now its audio keeps to real time
    (`audio_over_budget`), its datagrams to 250 a second (`media_rate_limited`), and another
    call on the transceiver hears its echo throughout."""
    import numpy as np

    from firsthop.services.transceiver.media.opus import OpusEncoder
    from firsthop.shared.wire import rtp

    relay, _, tx = stack
    over, limited = event_count(tx, "audio_over_budget"), event_count(tx, "media_rate_limited")
    decoded = event_count(tx, "frames_decoded")

    async def main() -> None:
        other, hostile = Caller(ToneTrack(700)), Caller(ToneTrack(440))
        for c in (other, hostile):
            await c.start(signal_via(tx, ingress(relay)))
            await asyncio.wait_for(c.wait_connected(), 10)
        await eventually(lambda: hears(other, 700) and hears(hostile, 440))
        pt = int(
            next(
                line
                for line in hostile.result.answer_sdp.splitlines()
                if line.startswith("a=rtpmap:") and "opus" in line
            ).split()[0][9:]
        )
        sender: Any = hostile.pc.getSenders()[0]
        ssrc = (sender._ssrc + 1) & 0xFFFFFFFF  # (its own SRTP index: a second stream)
        pcm = (8000 * np.sin(2 * np.pi * 440 * np.arange(5760) / 48000)).astype("<i2")
        payload = OpusEncoder(32000).encode(pcm.tobytes())
        mark = len(other.result.received)
        loop = asyncio.get_running_loop()
        start, seq = loop.time(), 0
        while loop.time() - start < 3.0:  # 9 packets every 10 ms
            for _ in range(9):
                seq += 1
                data = rtp.pack_header(pt, seq, seq * 5760, ssrc) + payload
                await sender.transport._send_rtp(data)
            await asyncio.sleep(0.01)
        print(f"\nflood: {seq} packets of 120 ms in {loop.time() - start:.1f} s")
        # the other call's echo went on: its own tone, loud, in the flood's last half second
        assert hears(other, 700, since=mark + 2 * 48000), tone_power(heard(other, mark), 700)
        for c in (other, hostile):
            await c.close()

    asyncio.run(main())
    flood_decoded = event_count(tx, "frames_decoded") - decoded
    print(
        f"over budget {event_count(tx, 'audio_over_budget') - over:.0f}, "
        f"rate-limited {event_count(tx, 'media_rate_limited') - limited:.0f}, "
        f"decoded {flood_decoded:.0f} (both calls' frames, the flood's included)"
    )
    assert event_count(tx, "audio_over_budget") > over + 100
    assert event_count(tx, "media_rate_limited") > limited + 1000
