"""The Realtime backend codec (agents/realtime.py), sans-IO: feed it messages, read its events."""

from __future__ import annotations

import array
import base64
import itertools
import json
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from firsthop.services.call.caller import tone_power
from firsthop.services.transceiver.agents import agent_kind
from firsthop.services.transceiver.agents.events import (
    AgentEvent,
    CallInfo,
    ClearAudio,
    Malformed,
    PlayAudio,
    ToAgent,
    ToCaller,
    ToSender,
)
from firsthop.services.transceiver.agents.realtime import MAX_DELTA, RealtimeProtocol
from firsthop.shared.wire.g711 import ulaw_decode

SESSION = {"type": "realtime", "model": "gpt-realtime", "instructions": "be brief"}


def codec(session: dict[str, Any] | None = SESSION) -> RealtimeProtocol:
    ids = itertools.count(1)
    return RealtimeProtocol(
        CallInfo("s1", "c1", None, session), new_id=lambda: f"event_{next(ids)}"
    )


def tone(freq: float, rate: int, seconds: float) -> bytes:
    w = 2 * math.pi * freq / rate
    n = int(rate * seconds)
    return array.array("h", (int(9000 * math.sin(w * i)) for i in range(n))).tobytes()


def delta(pcm: bytes, rid: str = "resp_1", item: str = "item_1", beta: bool = False) -> str:
    kind = "response.audio.delta" if beta else "response.output_audio.delta"
    audio = base64.b64encode(pcm).decode()
    msg = {"type": kind, "event_id": "e", "response_id": rid, "item_id": item, "delta": audio}
    return json.dumps({**msg, "output_index": 0, "content_index": 0})


def to_caller(events: list[AgentEvent]) -> list[dict[str, Any]]:
    """What goes to the caller: to all (`ToCaller`) and to the sender alone (`ToSender`)."""
    return [json.loads(e.text) for e in events if isinstance(e, (ToCaller, ToSender))]


def to_agent(events: list[AgentEvent]) -> list[dict[str, Any]]:
    return [json.loads(e.message) for e in events if isinstance(e, ToAgent)]


def frames(events: list[AgentEvent]) -> list[PlayAudio]:
    return [e for e in events if isinstance(e, PlayAudio)]


def test_schemes() -> None:
    kind = agent_kind("realtime+wss://api.example.com/v1/realtime?model=x")
    assert (kind.name, kind.ws_url) == ("realtime", "wss://api.example.com/v1/realtime?model=x")
    assert agent_kind("realtime+ws://h:1/p").ws_url == "ws://h:1/p"
    assert agent_kind("ws://h:1").name == "native"


def test_opening_sends_the_callers_session_and_again_with_its_updates() -> None:
    c = codec()
    assert [json.loads(m) for m in c.opening()] == [{"type": "session.update", "session": SESSION}]
    update = json.dumps({"type": "session.update", "session": {"instructions": "be long"}})
    assert c.caller_message(update) == [ToAgent(update)]  # forwarded as it is
    (again,) = c.opening()  # after a reconnect
    assert json.loads(again)["session"] == {**SESSION, "instructions": "be long"}
    assert codec(None).opening() == []


def test_caller_audio_goes_as_24khz_base64_appends_and_keeps_its_tone() -> None:
    c = codec()
    pcm = tone(1000, 48000, 0.5)
    wire = b""
    for off in range(0, len(pcm), 1920):
        msg = json.loads(c.caller_audio(pcm[off : off + 1920]) or "{}")
        assert msg["type"] == "input_audio_buffer.append"
        wire += base64.b64decode(msg["audio"])
    assert abs(len(wire) // 2 - 12000) < 100  # half a second at 24 kHz
    assert tone_power(wire[4000:], 1000, 24000) > 0.01


def test_g711_when_the_session_asks_for_it() -> None:
    c = codec({"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcmu"}}}})
    wire = b""
    for _ in range(25):
        msg = json.loads(c.caller_audio(tone(1000, 48000, 0.02)) or "{}")
        wire += base64.b64decode(msg["audio"])
    assert abs(len(wire) - 4000) < 50  # 8 kHz, a byte a sample
    assert tone_power(ulaw_decode(wire)[800:], 1000, 8000) > 0.005
    beta = codec({"output_audio_format": "g711_alaw"})
    assert beta.out_format == "pcma" and beta.in_format == "pcm"


def test_audio_deltas_become_tagged_frames_not_events() -> None:
    c = codec()
    played: list[PlayAudio] = []
    for beta in (False, True):
        out = c.on_message(delta(tone(440, 24000, 0.1), beta=beta))
        assert to_caller(out) == []  # audio deltas are not forwarded (OpenAI's WebRTC)
        played += frames(out)
    done = c.on_message(
        json.dumps({"type": "response.output_audio.done", "response_id": "resp_1", "item_id": "x"})
    )
    assert frames(done)  # the filter's tail, padded to a whole frame
    played += frames(done)
    assert all(len(f.pcm) == 1920 and f.tag == ("resp_1", "item_1") for f in played)
    assert len(played) == 10  # 0.2 s of audio in, 0.2 s at 48 kHz out
    heard = b"".join(f.pcm for f in played)
    assert tone_power(heard[1920:-1920], 440) > 0.01
    assert to_caller(done)[-1]["type"] == "response.output_audio.done"  # forwarded


def test_played_frames_start_and_stop_the_output_buffer() -> None:
    c = codec()
    tags = [f.tag for f in frames(c.on_message(delta(tone(440, 24000, 0.06))))]
    done = json.dumps({"type": "response.done", "response": {"id": "resp_1", "status": "x"}})
    tail = c.on_message(done)
    tags += [f.tag for f in frames(tail)]
    assert to_caller(tail)[-1]["type"] == "response.done"
    seen = []
    for tag in tags:
        assert tag is not None
        seen += to_caller(c.played(tag))
    assert [e["type"] for e in seen] == [
        "output_audio_buffer.started",
        "output_audio_buffer.stopped",
    ]
    assert all(e["response_id"] == "resp_1" and e["event_id"].startswith("event_") for e in seen)


def test_speech_started_is_a_barge_in_with_a_truncate_at_what_was_played() -> None:
    c = codec()
    tags = [f.tag for f in frames(c.on_message(delta(tone(440, 24000, 0.5))))]
    for tag in tags[:7]:
        assert tag is not None
        c.played(tag)
    speech = json.dumps({"type": "input_audio_buffer.speech_started", "item_id": "item_u"})
    out = c.on_message(speech)
    assert out[0] == ToCaller(speech)
    assert ClearAudio() in out
    assert to_caller(out)[1] == {
        "type": "output_audio_buffer.cleared",
        "event_id": to_caller(out)[1]["event_id"],
        "response_id": "resp_1",
    }
    (truncate,) = to_agent(out)
    assert truncate["type"] == "conversation.item.truncate"
    assert (truncate["item_id"], truncate["content_index"], truncate["audio_end_ms"]) == (
        "item_1",
        0,
        140,
    )
    late = c.on_message(delta(tone(440, 24000, 0.1)))
    assert late == [Malformed("realtime_audio_after_clear")]  # the barge-in stays silent
    assert frames(c.on_message(delta(tone(440, 24000, 0.1), rid="resp_2")))  # the next answer
    assert ClearAudio() in c.on_message(speech)


def test_speech_started_with_nothing_playing_clears_quietly() -> None:
    c = codec()
    out = c.on_message(json.dumps({"type": "input_audio_buffer.speech_started"}))
    assert [type(e) for e in out] == [ToCaller, ClearAudio]


def test_the_clients_clear_is_handled_here() -> None:
    c = codec()
    tags = [f.tag for f in frames(c.on_message(delta(tone(440, 24000, 0.2))))]
    assert tags[0] is not None
    c.played(tags[0])
    out = c.caller_message('{"type": "output_audio_buffer.clear"}')
    assert ClearAudio() in out
    assert [e["type"] for e in to_caller(out)] == ["output_audio_buffer.cleared"]
    assert to_agent(out)[0]["audio_end_ms"] == 20


def error_of(events: list[AgentEvent]) -> dict[str, Any]:
    (err,) = to_caller(events)
    assert err["type"] == "error" and err["event_id"].startswith("event_")
    assert not to_agent(events)  # never forwarded
    assert any(isinstance(e, Malformed) for e in events)  # and counted
    detail: dict[str, Any] = err["error"]
    assert set(detail) == {"type", "code", "message", "param", "event_id"}
    return detail


def test_invalid_client_events_are_answered_with_errors() -> None:
    c = codec()
    assert error_of(c.caller_message("{not json"))["code"] == "invalid_json"
    assert error_of(c.caller_message(b"\x00"))["code"] == "invalid_event"
    assert error_of(c.caller_message("[1, 2]"))["code"] == "invalid_event"
    missing = error_of(c.caller_message('{"event_id": "evt_1"}'))
    assert (missing["param"], missing["event_id"]) == ("type", "evt_1")
    unknown = error_of(c.caller_message('{"type": "nope.never", "event_id": "evt_2"}'))
    assert (unknown["type"], unknown["code"], unknown["event_id"]) == (
        "invalid_request_error",
        "invalid_value",
        "evt_2",
    )
    big = json.dumps({"type": "conversation.item.create", "pad": "x" * 70000})
    assert error_of(c.caller_message(big))["code"] == "event_too_large"


def test_known_client_events_are_forwarded_untouched() -> None:
    c = codec()
    for kind in ("response.create", "conversation.item.create", "input_audio_buffer.commit"):
        text = json.dumps({"type": kind, "event_id": "mine", "extra": [1, {"a": None}]})
        assert c.caller_message(text) == [ToAgent(text)]


def test_backend_events_go_to_the_caller_untouched_and_a_second_session_created_does_not() -> None:
    c = codec()
    created = '{"type": "session.created", "event_id": "e1", "session": {"id": "sess_1"}}'
    assert c.on_message(created) == [ToCaller(created)]
    other = '{"type":"response.output_audio_transcript.delta","delta":"hi","event_id":"e2"}'
    assert c.on_message(other) == [ToCaller(other)]
    assert c.on_message(created) == [Malformed("realtime_session_created_kept_back")]


def test_lost_backend_tells_the_caller_and_goes_silent() -> None:
    c = codec()
    tags = [f.tag for f in frames(c.on_message(delta(tone(440, 24000, 0.2))))]
    assert tags[0] is not None
    c.played(tags[0])
    out = c.link_lost()
    assert out[0] == ClearAudio()
    kinds = [e["type"] for e in to_caller(out)]
    assert kinds == ["output_audio_buffer.cleared", "error"]
    assert to_caller(out)[-1]["error"]["type"] == "server_error"


@given(st.one_of(st.binary(max_size=64), st.text(max_size=64)))
def test_garbage_from_the_backend_never_raises(junk: str | bytes) -> None:
    c = codec()
    for e in c.on_message(junk):
        assert isinstance(e, (Malformed, ToCaller))


@given(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["response.output_audio.delta", "response.audio.delta"])},
        optional={
            "response_id": st.one_of(st.none(), st.text(max_size=4), st.integers()),
            "item_id": st.one_of(st.none(), st.text(max_size=4)),
            "delta": st.one_of(st.text(max_size=12), st.integers()),
        },
    )
)
def test_bad_audio_deltas_are_counted_not_raised(msg: dict[str, Any]) -> None:
    for e in codec().on_message(json.dumps(msg)):
        assert isinstance(e, (Malformed, PlayAudio))


def test_a_truncate_is_never_past_the_audio_the_backend_sent() -> None:
    c = codec()
    out = c.on_message(delta(tone(440, 24000, 0.05)))  # 50 ms of audio ...
    out += c.on_message(json.dumps({"type": "response.output_audio.done", "response_id": "x"}))
    assert len(frames(out)) == 3  # ... played as three frames, the last one padded
    for f in frames(out):
        assert f.tag is not None
        c.played(f.tag)  # all played, and the response is not done: still "playing"
    speech = json.dumps({"type": "input_audio_buffer.speech_started"})
    (truncate,) = to_agent(c.on_message(speech))
    assert truncate["audio_end_ms"] == 50  # not 60


def test_a_session_update_nested_as_deep_as_json_goes_is_an_error_not_a_crash() -> None:
    c = codec()
    depth = 1
    while True:  # the deepest session JSON still parses here
        text = '{"type": "session.update", "session": ' + '{"a": ' * depth + "1" + "}" * depth
        try:
            json.loads(text + "}")
        except RecursionError:
            break
        depth *= 2
    for d in range(depth // 2, depth):
        text = '{"type": "session.update", "session": ' + '{"a": ' * d + "1" + "}" * d + "}"
        try:
            json.loads(text)
        except RecursionError:
            continue
        for e in c.caller_message(text):
            assert isinstance(e, (ToAgent, ToCaller, ToSender, Malformed))


def test_a_backends_huge_ids_oversize_deltas_and_half_samples_are_refused() -> None:
    """Ids ride with every queued frame (1,500 of a megabyte each held 1.5 GiB), one delta is
    decoded and queued in one callback (a megabyte of G.711 took 172 ms, every call waiting),
    and an odd byte of PCM16 shifted every sample after it."""
    c = codec()
    pcm = tone(440, 24000, 0.02)
    assert c.on_message(delta(pcm, rid="r" * 129)) == [Malformed("realtime_bad_audio")]
    assert c.on_message(delta(pcm, item="i" * 129)) == [Malformed("realtime_bad_audio")]
    assert frames(c.on_message(delta(tone(440, 24000, 0.1), rid="r" * 128)))  # (the longest)
    big = bytes(MAX_DELTA // 4 * 3 + 3)  # (its base64 one quartet past MAX_DELTA)
    assert c.on_message(delta(big, rid="r" * 128)) == [Malformed("realtime_audio_oversize")]
    assert Malformed("realtime_bad_audio") in c.on_message(delta(pcm[:-1], rid="r" * 128))


def test_a_lost_link_drops_the_old_responses_g711_still_to_be_framed() -> None:
    """A phone call's G.711 straight through: what was not yet a whole frame when the
    backend went away is not the start of the next response's first frame."""
    ids = itertools.count(1)
    c = RealtimeProtocol(
        CallInfo("s1", "c1", None, SESSION, codec="pcmu"), new_id=lambda: f"e{next(ids)}"
    )
    c.out_format = "pcmu"
    assert frames(c.on_message(delta(b"\x01" * 100))) == []  # (not a whole frame: held)
    c.link_lost()
    (frame,) = frames(c.on_message(delta(b"\x02" * 160, rid="resp_2")))
    assert frame.coded and frame.pcm == b"\x02" * 160  # none of the old 100 bytes lead it
