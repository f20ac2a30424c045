"""The assistant's sans-IO Realtime session core: client events in, server events out.

Audio is made here: a loud 300 Hz tone is "speech" to the loudness classifier the tests
inject, silence is not; one test runs the real webrtcvad classifier on espeak-ng speech.
Recognition and synthesis are the I/O layer's (their commands are answered by hand).
"""

from __future__ import annotations

import base64
import json
import math
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from firsthop.services.agent.assistant import brain
from firsthop.services.agent.assistant.audio import to_wire
from firsthop.services.agent.assistant.commands import Speak, StopSpeaking, Transcribe
from firsthop.services.agent.assistant.config import SessionConfig
from firsthop.services.agent.assistant.session import RealtimeSession
from firsthop.services.agent.assistant.turns import energy_classifier
from tests.support import spoken

WALL = datetime(2026, 12, 1, 10, 32, tzinfo=UTC)


def tone(ms: int, freq: float = 300.0) -> bytes:
    n = ms * 24
    return b"".join(
        int(12000 * math.sin(2 * math.pi * freq * i / 24000)).to_bytes(2, "little", signed=True)
        for i in range(n)
    )


def silence(ms: int) -> bytes:
    return bytes(ms * 48)


def new_session() -> RealtimeSession:
    return RealtimeSession(SessionConfig(session_id="sess_test"), classifier=energy_classifier())


def send(s: RealtimeSession, event: dict[str, Any]) -> tuple[list[dict[str, Any]], list[Any]]:
    s.receive(json.dumps(event), WALL)
    return s.take()


def append(s: RealtimeSession, pcm: bytes) -> tuple[list[dict[str, Any]], list[Any]]:
    events: list[dict[str, Any]] = []
    commands: list[Any] = []
    for i in range(0, len(pcm), 4800):  # 100 ms appends, as clients send them
        audio = base64.b64encode(pcm[i : i + 4800]).decode()
        e, c = send(s, {"type": "input_audio_buffer.append", "audio": audio})
        events += e
        commands += c
    return events, commands


def types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def test_session_created_has_the_ga_shape() -> None:
    s = new_session()
    events, commands = s.take()
    assert commands == []
    (created,) = events
    assert created["type"] == "session.created" and isinstance(created["event_id"], str)
    session = created["session"]
    assert session["object"] == "realtime.session" and session["type"] == "realtime"
    assert session["id"] == "sess_test" and session["output_modalities"] == ["audio"]
    audio_in = session["audio"]["input"]
    assert audio_in["format"] == {"type": "audio/pcm", "rate": 24000}
    vad = audio_in["turn_detection"]
    assert vad["type"] == "server_vad" and vad["create_response"] and vad["interrupt_response"]
    assert {"threshold", "prefix_padding_ms", "silence_duration_ms"} <= vad.keys()
    assert session["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}


def test_session_update_with_openai_names_is_accepted_and_reflects_what_is_honoured() -> None:
    s = new_session()
    s.take()
    events, _ = send(
        s,
        {
            "type": "session.update",
            "event_id": "c1",
            "session": {
                "type": "realtime",
                "model": "gpt-realtime",
                "instructions": "Your name is Ada. Be brief.",
                "tools": [{"type": "function", "name": "f"}],
                "audio": {
                    "input": {
                        "transcription": {"model": "gpt-4o-transcribe"},
                        "turn_detection": {"type": "semantic_vad", "eagerness": "high"},
                        "noise_reduction": {"type": "near_field"},
                    },
                    "output": {"voice": "alloy", "speed": 1.2},
                },
            },
        },
    )
    (updated,) = events
    assert updated["type"] == "session.updated"
    session = updated["session"]
    assert session["model"] == "gpt-realtime"
    assert session["instructions"].startswith("Your name is Ada")
    assert session["audio"]["input"]["turn_detection"]["type"] == "server_vad"
    assert session["audio"]["output"]["voice"] == "joe"  # the voice that really speaks
    assert session["audio"]["input"]["transcription"]["model"] == "pocketsphinx"
    # run by the edge before this server hears the caller: reflected as in force
    assert session["audio"]["input"]["noise_reduction"] == {"type": "near_field"}


def test_noise_reduction_is_reflected_turned_off_and_a_bad_one_changes_nothing() -> None:
    s = new_session()
    s.take()

    def update(session: dict[str, Any]) -> dict[str, Any]:
        (event,), _ = send(s, {"type": "session.update", "session": session})
        return event

    far = update({"input_audio_noise_reduction": {"type": "far_field"}})  # the beta name
    assert far["session"]["audio"]["input"]["noise_reduction"] == {"type": "far_field"}
    kept = update({"instructions": "Be brief."})  # an update that does not name it keeps it
    assert kept["session"]["audio"]["input"]["noise_reduction"] == {"type": "far_field"}
    bad = update({"instructions": "X", "audio": {"input": {"noise_reduction": {"type": "loud"}}}})
    assert bad["type"] == "error" and "noise_reduction" in bad["error"]["message"]
    off = update({"audio": {"input": {"noise_reduction": None}}})
    assert off["session"]["audio"]["input"]["noise_reduction"] is None
    assert off["session"]["instructions"] == "Be brief."  # the refused update changed nothing


def test_a_spoken_turn_is_detected_committed_transcribed_and_answered_in_order() -> None:
    s = new_session()
    s.take()
    events, commands = append(s, silence(500) + tone(800) + silence(800))
    assert types(events) == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    started, stopped, committed, added, _ = events
    item_id = started["item_id"]
    assert stopped["item_id"] == committed["item_id"] == added["item"]["id"] == item_id
    assert 440 <= started["audio_start_ms"] <= 520
    assert 1300 <= stopped["audio_end_ms"] <= 1900
    assert committed["previous_item_id"] is None
    assert added["item"]["role"] == "user"
    (transcribe,) = commands
    assert isinstance(transcribe, Transcribe) and transcribe.respond
    assert transcribe.item_id == item_id
    assert 700 <= len(transcribe.audio) // 48 <= 1700  # the turn, prefix padding included

    s.transcribed(item_id, "what time is it", WALL, respond=True)
    events, commands = s.take()
    assert types(events) == [
        "conversation.item.input_audio_transcription.delta",
        "conversation.item.input_audio_transcription.completed",
        "response.created",
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    assert events[0]["delta"] == events[1]["transcript"] == "what time is it"
    assert events[0]["content_index"] == events[1]["content_index"] == 0
    (speak,) = commands
    assert isinstance(speak, Speak) and "10 32" in speak.text
    rid = events[2]["response"]["id"]
    assert speak.response_id == rid and events[2]["response"]["status"] == "in_progress"

    first, second = brain.sentences(speak.text)
    s.spoken(rid, first, tone(500))
    s.spoken(rid, second, tone(100))
    s.speech_done(rid)
    events, commands = s.take()
    assert commands == []
    assert types(events) == [
        "response.output_audio_transcript.delta",
        *["response.output_audio.delta"] * 3,  # 500 ms in 200 ms deltas
        "response.output_audio_transcript.delta",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    audio = b"".join(
        base64.b64decode(e["delta"]) for e in events if e["type"] == "response.output_audio.delta"
    )
    assert len(audio) == len(tone(600))
    transcript = events[7]["transcript"]
    assert transcript == speak.text
    done = events[-1]["response"]
    assert done["object"] == "realtime.response" and done["id"] == rid
    assert done["status"] == "completed"
    assert done["output"][0]["content"][0]["transcript"] == transcript
    for e in events:
        if "response_id" in e:
            assert e["response_id"] == rid


def test_every_server_event_id_is_a_unique_string() -> None:
    s = new_session()
    seen: list[str] = [e["event_id"] for e in s.take()[0]]
    events, _ = append(s, tone(600) + silence(700))
    seen += [e["event_id"] for e in events]
    events, _ = send(s, {"type": "nonsense"})
    seen += [e["event_id"] for e in events]
    assert all(isinstance(i, str) for i in seen) and len(set(seen)) == len(seen)


def _respond(s: RealtimeSession) -> str:
    send(s, {"type": "conversation.item.create", "item": _user_text("hello")})
    events, commands = send(s, {"type": "response.create"})
    assert isinstance(commands[0], Speak)
    return str(events[0]["response"]["id"])


def _user_text(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_response_cancel_ends_the_response_cancelled_and_drops_late_audio() -> None:
    s = new_session()
    s.take()
    rid = _respond(s)
    s.spoken(rid, "Hello!", tone(100))
    s.take()
    events, commands = send(s, {"type": "response.cancel"})
    assert commands == [StopSpeaking(rid)]
    assert types(events)[-1] == "response.done"
    done = events[-1]["response"]
    assert done["status"] == "cancelled"
    assert done["status_details"]["reason"] == "client_cancelled"
    assert done["output"][0]["status"] == "incomplete"
    s.spoken(rid, "Late.", tone(100))
    s.speech_done(rid)
    assert s.take() == ([], [])
    events, _ = send(s, {"type": "response.cancel", "event_id": "c9"})
    assert events[0]["error"]["code"] == "response_cancel_not_active"
    assert events[0]["error"]["event_id"] == "c9"


def test_speech_during_a_response_interrupts_it() -> None:
    s = new_session()
    s.take()
    rid = _respond(s)
    events, commands = append(s, tone(300))
    assert types(events)[-2:] == ["response.done", "input_audio_buffer.speech_started"]
    assert events[-2]["response"]["status"] == "cancelled"
    assert events[-2]["response"]["status_details"]["reason"] == "turn_detected"
    assert StopSpeaking(rid) in commands


def test_one_response_at_a_time() -> None:
    s = new_session()
    s.take()
    _respond(s)
    events, commands = send(s, {"type": "response.create", "event_id": "c2"})
    assert commands == []
    assert events[0]["error"]["code"] == "conversation_already_has_active_response"


def test_response_create_answers_a_created_text_message_then_instructions() -> None:
    s = new_session()
    s.take()
    send(s, {"type": "conversation.item.create", "item": _user_text("what is your name")})
    _, commands = send(s, {"type": "response.create"})
    assert "firsthop" in commands[0].text
    s.speech_done(commands[0].response_id)
    s.take()
    instructions = {"instructions": "Greet the user"}
    _, commands = send(s, {"type": "response.create", "response": instructions})
    assert commands[0].text.startswith("Hello")


def test_truncate_answers_truncated_and_refuses_unknown_items() -> None:
    s = new_session()
    s.take()
    rid = _respond(s)
    s.spoken(rid, "Hello!", tone(400))
    events, _ = s.take()
    item_id = events[0]["item_id"]
    events, _ = send(
        s,
        {
            "type": "conversation.item.truncate",
            "item_id": item_id,
            "content_index": 0,
            "audio_end_ms": 150,
        },
    )
    assert events == [
        {
            "type": "conversation.item.truncated",
            "event_id": events[0]["event_id"],
            "item_id": item_id,
            "content_index": 0,
            "audio_end_ms": 150,
        }
    ]
    bad = {"type": "conversation.item.truncate", "event_id": "c3", "item_id": "nope"}
    events, _ = send(s, {**bad, "audio_end_ms": 1})
    assert events[0]["type"] == "error" and events[0]["error"]["event_id"] == "c3"
    past = {"type": "conversation.item.truncate", "item_id": item_id, "audio_end_ms": 601}
    events, _ = send(s, past)
    assert events[0]["error"]["param"] == "audio_end_ms"


def test_manual_commit_mode() -> None:
    s = new_session()
    s.take()
    events, _ = send(s, {"type": "session.update", "session": {"turn_detection": None}})
    assert events[0]["session"]["audio"]["input"]["turn_detection"] is None
    events, commands = append(s, silence(200) + tone(500) + silence(900))
    assert events == [] and commands == []
    events, commands = send(s, {"type": "input_audio_buffer.commit"})
    assert types(events) == [
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    (transcribe,) = commands
    assert isinstance(transcribe, Transcribe) and not transcribe.respond
    assert len(transcribe.audio) == len(silence(1600))
    events, _ = send(s, {"type": "input_audio_buffer.commit", "event_id": "c4"})
    assert events[0]["error"]["code"] == "input_audio_buffer_commit_empty"
    append(s, tone(300))
    events, _ = send(s, {"type": "input_audio_buffer.clear"})
    assert types(events) == ["input_audio_buffer.cleared"]
    assert len(s.buffer) == 0


def test_manual_buffer_is_bounded() -> None:
    s = new_session()
    send(s, {"type": "session.update", "session": {"turn_detection": None}})
    chunk = base64.b64encode(silence(10_000)).decode()
    errors = []
    for _ in range(7):
        events, _ = send(s, {"type": "input_audio_buffer.append", "audio": chunk})
        errors += [e for e in events if e["type"] == "error"]
    assert len(errors) == 1 and errors[0]["error"]["code"] == "input_audio_buffer_full"
    assert len(s.buffer) == len(silence(60_000))


def test_bad_client_events_become_error_events_with_the_client_event_id() -> None:
    s = new_session()
    s.take()
    cases: list[tuple[str | bytes, str | None]] = [
        ("not json", None),
        ("[1, 2]", None),
        ("[" * 100_000, None),  # nested too deep for the JSON parser
        (json.dumps({"type": "x" * 10_000}), None),
        (b"\x00\x01", None),
        (json.dumps({"type": "transcription_session.update", "event_id": "e1"}), "e1"),
        (json.dumps({"event_id": "e2"}), "e2"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "%%%"}), None),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "AA=="}), None),  # 1 byte
        (json.dumps({"type": "session.update", "session": [1]}), None),
        (json.dumps({"type": "session.update", "session": {"turn_detection": 5}}), None),
        (json.dumps({"type": "conversation.item.create", "item": {"role": "x"}}), None),
        (json.dumps({"type": "conversation.item.delete", "item_id": 3, "event_id": 7}), None),
        (json.dumps({"type": "response.create", "response": "now"}), None),
        (
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "item": {**_user_text("a"), "content": [{}] * 17},
                }
            ),
            None,
        ),
    ]
    for text, event_id in cases:
        s.receive(text, WALL)
        events, commands = s.take()
        assert commands == [], text
        (error,) = events
        assert error["type"] == "error", text
        assert error["error"]["type"] == "invalid_request_error"
        assert error["error"]["event_id"] == event_id
        assert isinstance(error["error"]["message"], str)


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(
        st.text(max_size=200),
        st.dictionaries(
            st.sampled_from(["type", "event_id", "session", "item", "audio", "item_id"]),
            st.one_of(
                st.none(),
                st.integers(),
                st.text(max_size=20),
                st.sampled_from(["session.update", "response.create", "response.cancel"]),
                st.dictionaries(st.text(max_size=10), st.integers(), max_size=3),
            ),
        ).map(json.dumps),
    )
)
def test_garbage_never_raises(text: str) -> None:
    s = new_session()
    s.receive(text, WALL)
    for event in s.take()[0]:
        assert isinstance(event["event_id"], str)


def test_webrtc_vad_finds_the_turn_in_real_speech() -> None:
    s = RealtimeSession(SessionConfig(session_id="sess_speech"))  # the default classifier
    s.take()
    speech = spoken("what time is it")
    events, commands = append(s, speech + silence(800))
    assert types(events)[:2] == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
    ]
    assert len(commands) == 1 and isinstance(commands[0], Transcribe)
    assert events[0]["audio_start_ms"] <= 400
    assert events[1]["audio_end_ms"] >= len(speech) // 48 - 400


def test_the_session_core_imports_no_io_framework() -> None:
    import subprocess
    import sys

    code = (
        "import json, sys\n"
        "import firsthop.services.agent.assistant.session\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    forbidden = ("trio", "asyncio", "hypercorn", "opentelemetry", "pocketsphinx", "piper")
    assert [m for m in json.loads(out) if m.split(".")[0] in forbidden] == []


def test_turn_detection_settings_are_honoured() -> None:
    s = new_session()
    vad = {"type": "server_vad", "silence_duration_ms": 200, "prefix_padding_ms": 0}
    send(s, {"type": "session.update", "session": {"audio": {"input": {"turn_detection": vad}}}})
    events, commands = append(s, silence(400) + tone(600) + silence(300))
    started, stopped = events[:2]
    assert stopped["audio_end_ms"] - started["audio_start_ms"] <= 600 + 200 + 20
    assert len(commands[0].audio) // 48 <= 600 + 200 + 20  # no prefix padding

    vad = {"create_response": False, "interrupt_response": False}
    send(s, {"type": "session.update", "session": {"turn_detection": vad}})  # beta shape
    _, commands = append(s, tone(600) + silence(300))
    assert commands[0].respond is False
    rid = _respond(s)
    events, commands = append(s, tone(600))
    assert "response.done" not in types(events) and StopSpeaking(rid) not in commands


def test_g711_sessions_both_ways() -> None:
    s = new_session()
    s.take()
    pcmu = {"type": "audio/pcmu"}
    update = {"audio": {"input": {"format": pcmu}, "output": {"format": pcmu}}}
    events, _ = send(s, {"type": "session.update", "session": update})
    audio = events[0]["session"]["audio"]
    assert audio["input"]["format"] == audio["output"]["format"] == pcmu
    ulaw = to_wire(silence(400) + tone(600) + silence(800), "pcmu")
    events = []
    for i in range(0, len(ulaw), 800):
        audio_b64 = base64.b64encode(ulaw[i : i + 800]).decode()
        events += send(s, {"type": "input_audio_buffer.append", "audio": audio_b64})[0]
    assert types(events)[:2] == [
        "input_audio_buffer.speech_started",
        "input_audio_buffer.speech_stopped",
    ]
    assert 1300 <= events[1]["audio_end_ms"] <= 1900  # positions in ms, whatever the format
    rid = _respond(s)
    s.spoken(rid, "Hello!", tone(200))
    events, _ = s.take()
    (delta,) = [e for e in events if e["type"] == "response.output_audio.delta"]
    assert len(base64.b64decode(delta["delta"])) == 1600  # 200 ms of 8 kHz µ-law

    events, _ = send(s, {"type": "session.update", "session": {"output_audio_format": "g711_alaw"}})
    assert events[0]["session"]["audio"]["output"]["format"] == {"type": "audio/pcma"}
    odd_rate = {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}
    events, _ = send(s, {"type": "session.update", "session": odd_rate})
    assert events[0]["session"]["audio"]["input"]["format"] == pcmu  # not honoured: unchanged


def test_the_vad_finds_the_end_of_speech_to_10_ms() -> None:
    from firsthop.services.agent.assistant.turns import SpeechStopped, TurnDetector

    loud = _tone_ms(310)
    detector = TurnDetector(energy_classifier(), silence_duration_ms=200)
    events = detector.feed(loud + bytes(48 * 400))
    stopped = [e for e in events if isinstance(e, SpeechStopped)]
    # 20 ms frames would put it at 320 (the 300-320 frame is half speech, loud enough)
    assert [e.speech_end_ms for e in stopped] == [310]
    assert stopped[0].audio_end_ms == 310 + 200


def _tone_ms(ms: int) -> bytes:
    n = ms * 24
    return b"".join(
        int(8000 * math.sin(2 * math.pi * 440 * i / 24000)).to_bytes(2, "little", signed=True)
        for i in range(n)
    )
