"""The Twilio Media Streams codec (`agents/twilio.py`, `agents/twilio_events.py`): every message
shape Twilio documents, numbering, marks echoed when their audio has been played, clear,
bad input counted; and the 48 kHz <-> 8 kHz μ-law path it rides on (level, frequency, no
aliasing)."""

from __future__ import annotations

import argparse
import array
import base64
import json
import math
import re
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firsthop.services.call.caller import tone_power
from firsthop.services.signaling.config import config_from_args, register_flags
from firsthop.services.transceiver.agents import agent_kind
from firsthop.services.transceiver.agents.events import (
    AgentEvent,
    CallInfo,
    ClearAudio,
    Malformed,
    PlayAudio,
    ToAgent,
)
from firsthop.services.transceiver.agents.twilio import TwilioProtocol
from firsthop.services.transceiver.agents.twilio_events import MAX_MARKS, MarkLedger
from firsthop.services.transceiver.resample import resample
from firsthop.shared.wire.g711 import ulaw_decode, ulaw_encode

SESSION = {"instructions": "be brief", "voice": "marin"}


def codec(session: dict[str, Any] | None = SESSION) -> TwilioProtocol:
    info = CallInfo("sess_1", "call_1", "00-" + "a" * 32 + "-" + "b" * 16 + "-01", session, "eu")
    return TwilioProtocol(info)


def tone(freq: float, rate: int, seconds: float, amplitude: float = 0.3) -> bytes:
    w = 2 * math.pi * freq / rate
    n = int(rate * seconds)
    return array.array("h", (int(32767 * amplitude * math.sin(w * i)) for i in range(n))).tobytes()


def rms(pcm: bytes) -> float:
    samples = array.array("h")
    samples.frombytes(pcm)
    return math.sqrt(sum(s * s for s in samples) / max(1, len(samples))) / 32768


def media(ulaw: bytes, sid: str | None = None) -> str:
    msg: dict[str, Any] = {"event": "media", "media": {"payload": base64.b64encode(ulaw).decode()}}
    if sid is not None:
        msg["streamSid"] = sid
    return json.dumps(msg)


def mark(name: str, sid: str) -> str:
    return json.dumps({"event": "mark", "streamSid": sid, "mark": {"name": name}})


def frames(events: Sequence[AgentEvent]) -> list[PlayAudio]:
    return [e for e in events if isinstance(e, PlayAudio)]


def echoed(events: list[AgentEvent]) -> list[str]:
    out = []
    for e in events:
        if isinstance(e, ToAgent):
            assert isinstance(e.message, str)
            msg = json.loads(e.message)
            assert msg["event"] == "mark"
            out.append(msg["mark"]["name"])
    return out


def play_all(c: TwilioProtocol, events: Sequence[AgentEvent]) -> list[AgentEvent]:
    """The output queue plays every frame in `events`; what the codec says as they go."""
    out: list[AgentEvent] = []
    for f in frames(events):
        assert f.tag is not None
        out += c.played(f.tag)
    return out


# -- the messages to the bot ------------------------------------------------------------------


def test_schemes_and_signaling_accepts_them() -> None:
    kind = agent_kind("twilio+wss://bot.example/media?x=1")
    assert (kind.name, kind.ws_url) == ("twilio", "wss://bot.example/media?x=1")
    assert agent_kind("twilio+ws://h:1/p").ws_url == "ws://h:1/p"
    parser = argparse.ArgumentParser()
    register_flags(parser)
    args = ["--agent-url", "bot=twilio+ws://127.0.0.1:9/ws", "--agent-url", "b=twilio+wss://x/"]
    config = config_from_args(parser.parse_args(args))
    assert config.agents == {"bot": "twilio+ws://127.0.0.1:9/ws", "b": "twilio+wss://x/"}


def test_opening_is_connected_then_start_as_twilio_sends_them() -> None:
    c = codec()
    connected, start = (json.loads(m) for m in c.opening())
    assert connected == {"event": "connected", "protocol": "Call", "version": "1.0.0"}
    assert start["event"] == "start" and start["sequenceNumber"] == "1"
    assert re.fullmatch(r"MZ[0-9a-f]{32}", start["streamSid"])
    body = start["start"]
    assert body["streamSid"] == start["streamSid"] == c.stream_sid
    assert re.fullmatch(r"CA[0-9a-f]{32}", body["callSid"])
    assert re.fullmatch(r"AC[0-9a-f]{32}", body["accountSid"])
    assert body["callSid"] == codec().call_sid  # the same call, the same CallSid
    assert body["tracks"] == ["inbound"]
    assert body["mediaFormat"] == {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1}
    custom = body["customParameters"]
    assert custom == {
        "call_id": "call_1",
        "session_id": "sess_1",
        "region": "eu",
        "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01",
        "session": json.dumps(SESSION),
    }
    assert all(isinstance(v, str) for v in custom.values())
    assert "session" not in codec(None).custom_parameters()


def test_caller_audio_goes_as_numbered_20ms_ulaw_chunks_keeping_its_tone() -> None:
    c = codec()
    c.opening()
    pcm = tone(1000, 48000, 1.0)
    sent = [c.caller_audio(pcm[i : i + 1920]) for i in range(0, len(pcm), 1920)]
    msgs = [json.loads(m) for m in sent if isinstance(m, str)]
    assert len(msgs) == 50  # one per 20 ms frame, at once
    assert [m["sequenceNumber"] for m in msgs] == [str(i) for i in range(2, len(msgs) + 2)]
    assert [m["media"]["chunk"] for m in msgs] == [str(i) for i in range(1, len(msgs) + 1)]
    ulaw = b""
    for m in msgs:
        assert m["event"] == "media" and m["streamSid"] == c.stream_sid
        assert m["media"]["track"] == "inbound"
        assert m["media"]["timestamp"] == str(len(ulaw) // 8)  # ms of audio sent before it
        payload = base64.b64decode(m["media"]["payload"])
        assert len(payload) == 160  # the first led by the filter's delay in silence
        ulaw += payload
    heard = ulaw_decode(ulaw)[1600:]
    assert tone_power(heard, 1000, 8000) > 0.02  # a 0.3 tone: ~0.0225
    assert tone_power(heard, 600, 8000) < 1e-4
    stop = json.loads(c.closing()[0])
    assert stop == {
        "event": "stop",
        "sequenceNumber": str(len(msgs) + 2),
        "streamSid": c.stream_sid,
        "stop": {"accountSid": "AC" + "0" * 32, "callSid": c.call_sid},
    }


def test_client_events_have_nowhere_to_go() -> None:
    assert codec().caller_message('{"type": "x"}') == [Malformed("twilio_client_event_dropped")]


# -- the bot's media, marks and clear ------------------------------------------------------------


def test_bot_media_becomes_48khz_frames_with_its_tone() -> None:
    c = codec()
    c.opening()
    ulaw = ulaw_encode(tone(600, 8000, 1.0))
    events: list[AgentEvent] = []
    for i in range(0, len(ulaw), 160):  # as Twilio bots send it: 20 ms a message
        events += c.on_message(media(ulaw[i : i + 160], c.stream_sid))
    got = frames(events)
    assert len(got) == 50  # a frame per 20 ms message, at once
    assert all(len(f.pcm) == 1920 for f in got)
    pcm = b"".join(f.pcm for f in got)[9600:]
    assert tone_power(pcm, 600, 48000) > 0.02
    assert not [e for e in events if not isinstance(e, PlayAudio)]


def test_a_mark_is_echoed_once_the_audio_before_it_has_played() -> None:
    c = codec()
    c.opening()
    pcm = ulaw_encode(tone(600, 8000, 0.21))
    queued = c.on_message(media(pcm[:1600], c.stream_sid))  # a stream starts on a whole frame
    queued += c.on_message(media(pcm[1600:], c.stream_sid))  # and 10 ms: half a frame left
    waiting = c.on_message(mark("first", c.stream_sid))
    assert echoed(waiting) == []
    queued += waiting  # the part-frame is not played yet: it waits for more audio or a drain
    later = c.on_message(mark("second", c.stream_sid))  # nothing between: right behind it
    said = play_all(c, queued)
    # The queue ran dry with a part-frame a mark waits for: it was padded and queued.
    assert echoed(said) == []
    tail = frames(said)
    assert len(tail) == 1 and len(tail[0].pcm) == 1920
    done = play_all(c, tail)
    assert echoed(later) == [] and echoed(done) == ["first", "second"]
    (first, second) = (json.loads(e.message) for e in done if isinstance(e, ToAgent))
    assert first == {
        "event": "mark",
        "sequenceNumber": first["sequenceNumber"],
        "streamSid": c.stream_sid,
        "mark": {"name": "first"},
    }
    assert int(second["sequenceNumber"]) == int(first["sequenceNumber"]) + 1


def test_a_mark_with_nothing_queued_is_echoed_at_once() -> None:
    c = codec()
    c.opening()
    assert echoed(c.on_message(mark("now", c.stream_sid))) == ["now"]
    # After audio that has all been played, too.
    ulaw = ulaw_encode(tone(600, 8000, 0.05))
    played = play_all(c, c.on_message(media(ulaw[:320], c.stream_sid)))
    played += play_all(c, c.on_message(media(ulaw[320:], c.stream_sid)))
    assert echoed(played) == []
    after = c.on_message(mark("after", c.stream_sid))
    # Nothing was playing: the part-frame left (the resampler's output is not a whole number
    # of frames) is queued at once, padded, and the mark waits for it alone.
    assert len(frames(after)) == 1 and echoed(after) == []
    assert echoed(play_all(c, after)) == ["after"]


def test_clear_drops_queued_audio_and_echoes_pending_marks_at_once() -> None:
    c = codec()
    c.opening()
    queued = c.on_message(media(ulaw_encode(tone(600, 8000, 2.0)), c.stream_sid))
    c.on_message(mark("a", c.stream_sid))
    c.on_message(mark("b", c.stream_sid))
    first = frames(queued)[0]
    assert first.tag is not None
    assert echoed(c.played(first.tag)) == []
    cleared = c.on_message(json.dumps({"event": "clear", "streamSid": c.stream_sid}))
    assert isinstance(cleared[0], ClearAudio)
    assert echoed(cleared) == ["a", "b"]
    # A frame of before the clear reported late counts for nothing; new marks work.
    assert c.played(first.tag) == []
    assert echoed(c.on_message(mark("c", c.stream_sid))) == ["c"]
    assert frames(c.on_message(media(ulaw_encode(tone(600, 8000, 0.1)), c.stream_sid)))


def test_frames_dropped_at_the_bound_count_as_gone_for_marks() -> None:
    c = codec()
    c.opening()
    queued = frames(c.on_message(media(ulaw_encode(tone(600, 8000, 0.1)), c.stream_sid)))
    c.on_message(mark("m", c.stream_sid))
    said: list[AgentEvent] = []
    for f in queued:
        assert f.tag is not None
        said += c.dropped(f.tag)
    assert Malformed("twilio_output_dropped") in said
    said += play_all(c, said)
    assert echoed(said) == ["m"]


def test_the_lost_link_silences_the_bot() -> None:
    c = codec()
    c.opening()
    c.on_message(media(ulaw_encode(tone(600, 8000, 0.5)), c.stream_sid))
    assert c.link_lost() == [ClearAudio()]


def test_the_mark_ledger_keeps_order_and_is_bounded() -> None:
    ledger = MarkLedger()
    ledger.add_frames(3)
    assert ledger.add("x", 3) == []
    ledger.add_frames(2)
    assert ledger.add("y", 5) == []
    assert ledger.frame_left() == [] and ledger.frame_left() == []
    assert ledger.frame_left() == ["x"]
    assert ledger.frame_left() == [] and ledger.frame_left() == ["y"]
    assert ledger.idle and ledger.frame_left() == []  # never past what was queued
    ledger.add_frames(1)
    for i in range(MAX_MARKS):
        assert ledger.add(str(i), 6) == []
    assert ledger.add("one too many", 6) is None
    assert ledger.clear() == [str(i) for i in range(MAX_MARKS)]


Op = tuple[str, int]


@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("media"), st.integers(1, 800)),  # bytes of μ-law: to 100 ms
            st.tuples(st.sampled_from(["mark", "play", "drop", "clear"]), st.just(0)),
        ),
        max_size=60,
    )
)
def test_marks_are_echoed_once_in_order_and_only_after_their_audio(ops: list[Op]) -> None:
    """Against a FIFO output queue: whatever the bot and the queue do, every mark is echoed
    exactly once, in the order sent, never while a frame queued before it is still queued,
    and none is left waiting once the queue has drained."""
    c = codec()
    c.opening()
    queue: list[Any] = []  # the output queue: tags of the frames in it, oldest first
    emitted = 0  # frames the codec has queued since the start
    sent: list[str] = []
    echoes: list[str] = []
    before: dict[str, int] = {}  # mark -> frames queued before it

    def apply(events: list[AgentEvent]) -> None:
        nonlocal emitted
        for e in events:
            if isinstance(e, PlayAudio):
                queue.append(e.tag)
                emitted += 1
            elif isinstance(e, ClearAudio):
                queue.clear()
        for name in echoed(events):
            gone = emitted - len(queue)
            assert before[name] <= gone, (name, before[name], gone)
            echoes.append(name)

    ulaw = ulaw_encode(tone(600, 8000, 0.1))
    for kind, n in ops:
        if kind == "media":
            apply(c.on_message(media(ulaw[:n], c.stream_sid)))
        elif kind == "mark":
            name = f"m{len(sent)}"
            sent.append(name)
            before[name] = emitted
            apply(c.on_message(mark(name, c.stream_sid)))
        elif kind == "clear":
            apply(c.on_message(json.dumps({"event": "clear"})))
        elif queue:
            tag = queue.pop(0)
            apply(c.played(tag) if kind == "play" else c.dropped(tag))
    while queue:  # the queue drains
        apply(c.played(queue.pop(0)))
    assert echoes == sent


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"\x00\x01", "twilio_binary"),
        ("not json {", "twilio_not_json"),
        ("[1, 2]", "twilio_unknown_event"),
        ('{"event": "dance"}', "twilio_unknown_event"),
        ('{"event": 7}', "twilio_unknown_event"),
        ('{"event": "media"}', "twilio_missing_fields"),
        ('{"event": "media", "media": {"payload": 5}}', "twilio_missing_fields"),
        ('{"event": "mark", "mark": {}}', "twilio_missing_fields"),
        ('{"event": "media", "media": {"payload": "***not base64***"}}', "twilio_bad_base64"),
        ('{"event": "clear", "streamSid": "MZother"}', "twilio_wrong_stream"),
        ('{"event": "media", "media": {"payload": "' + "A" * 70_000 + '"}}', "twilio_oversize"),
        ("[" * 60_000, "twilio_not_json"),  # under the size bound, past the parser's depth
        ('{"event": "mark", "mark": {"name": "' + "m" * 257 + '"}}', "twilio_mark_name_too_long"),
    ],
)
def test_bad_input_from_the_bot_is_counted_and_ignored(message: str | bytes, reason: str) -> None:
    c = codec()
    c.opening()
    assert c.on_message(message) == [Malformed(reason)]
    # ... and the stream goes on.
    assert frames(c.on_message(media(ulaw_encode(tone(600, 8000, 0.1)))))


@given(st.one_of(st.binary(max_size=300), st.text(max_size=300)))
def test_garbage_from_the_bot_never_raises(junk: str | bytes) -> None:
    c = codec()
    out = c.on_message(junk)
    if isinstance(junk, bytes):
        assert out == [Malformed("twilio_binary")]
    else:  # one verdict: counted as bad, or (rarely) a well-formed clear or mark
        assert len(out) == 1 or all(isinstance(e, PlayAudio) for e in out), out


@given(
    st.dictionaries(
        st.sampled_from(["event", "streamSid", "media", "mark"]),
        st.one_of(
            st.sampled_from(["media", "mark", "clear"]),
            st.none(),
            st.integers(),
            st.dictionaries(st.sampled_from(["payload", "name"]), st.text(max_size=20)),
        ),
    )
)
def test_near_miss_messages_never_raise(msg: dict[str, Any]) -> None:
    c = codec()
    for e in c.on_message(json.dumps(msg)):
        assert isinstance(e, (Malformed, PlayAudio, ClearAudio, ToAgent))


# -- the 48 kHz <-> 8 kHz μ-law path ------------------------------------------------------------


@pytest.mark.parametrize("freq", [300.0, 1000.0, 3000.0])
def test_8khz_ulaw_round_trip_keeps_level_and_frequency(freq: float) -> None:
    """48 kHz -> 8 kHz -> μ-law -> 8 kHz -> 48 kHz: within 1 dB of the level, the tone where
    it was (its power within 10 % of a clean tone's; nothing at another frequency)."""
    pcm = tone(freq, 48000, 1.0)
    out = resample(ulaw_decode(ulaw_encode(resample(pcm, 48000, 8000))), 8000, 48000)
    assert abs(len(out) - len(pcm)) <= 48000 * 2 // 100  # 1 s in, 1 s out
    body, ref = out[24000:72000], pcm[24000:72000]
    assert abs(20 * math.log10(rms(body) / rms(ref))) < 1.0
    assert tone_power(body, freq, 48000) > 0.9 * tone_power(ref, freq, 48000)
    assert tone_power(body, freq * 1.3, 48000) < 1e-4


def test_48_to_8khz_does_not_alias() -> None:
    """A 6 kHz tone cannot exist at 8 kHz; without a filter it folds to 2 kHz."""
    out = resample(tone(6000, 48000, 0.5), 48000, 8000)
    body = out[len(out) // 4 : 3 * len(out) // 4]
    assert tone_power(body, 2000, 8000) < 1e-5
    assert rms(body) < 0.003  # a 0.3 (-10 dBFS) tone to under -50 dBFS
