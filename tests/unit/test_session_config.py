"""The Realtime session config's one rule book (`shared/session_config.py`): the merge both
signaling and the transceiver use, its "whole" settings, and the bound kept after every update
— seen directly, and through what the transceiver's Realtime codec re-sends after a reconnect."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firsthop.services.signaling import realtime_session
from firsthop.services.transceiver.agents import realtime
from firsthop.services.transceiver.agents.events import (
    CallInfo,
    NoiseReduction,
    ToAgent,
    ToSender,
)
from firsthop.services.transceiver.agents.realtime import RealtimeProtocol
from firsthop.shared import session_config
from firsthop.shared.session_config import (
    MAX_SESSION_BYTES,
    WHOLE,
    SessionConfigError,
    merge_sessions,
    merge_update,
    size_of,
)


def nest(path: tuple[str, ...], value: Any) -> dict[str, Any]:
    for key in reversed(path):
        value = {key: value}
    return value  # type: ignore[no-any-return]


def at(session: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        session = session[key]
    return session


# One old and one new value per "whole" setting: a variant of the union that must not carry
# the old one's keys.
WHOLE_CASES: dict[tuple[str, ...], tuple[Any, Any]] = {
    ("audio", "input", "format"): (
        {"type": "audio/pcm", "rate": 24000},
        {"type": "audio/pcmu"},
    ),
    ("audio", "output", "format"): (
        {"type": "audio/pcm", "rate": 24000},
        {"type": "audio/pcma"},
    ),
    ("audio", "input", "turn_detection"): (
        {"type": "server_vad", "silence_duration_ms": 200, "threshold": 0.5},
        {"type": "semantic_vad", "eagerness": "low"},
    ),
    ("audio", "input", "transcription"): (
        {"model": "whisper-1", "language": "en", "prompt": "names"},
        {"model": "gpt-4o-transcribe"},
    ),
    ("audio", "input", "noise_reduction"): ({"type": "near_field"}, {"type": "far_field"}),
    ("tools",): ([{"type": "function", "name": "a"}], [{"type": "function", "name": "b"}]),
    ("tool_choice",): ({"type": "function", "name": "a"}, {"type": "mcp", "server_label": "x"}),
    ("tracing",): ({"workflow_name": "w", "group_id": "g"}, {"workflow_name": "v"}),
    ("truncation",): ({"type": "retention_ratio", "retention_ratio": 0.5}, {"type": "auto"}),
    ("prompt",): ({"id": "pmpt_1", "version": "2", "variables": {"a": 1}}, {"id": "pmpt_2"}),
    ("turn_detection",): ({"type": "server_vad", "silence_duration_ms": 200}, {"type": "none"}),
    ("input_audio_transcription",): ({"model": "whisper-1", "language": "en"}, {"model": "m"}),
    ("input_audio_noise_reduction",): ({"type": "near_field"}, {"type": "far_field"}),
}


def test_every_whole_setting_has_a_case() -> None:
    assert set(WHOLE_CASES) == set(WHOLE)


@pytest.mark.parametrize("path", sorted(WHOLE_CASES), ids=".".join)
def test_a_whole_setting_is_replaced_not_merged(path: tuple[str, ...]) -> None:
    old, new = WHOLE_CASES[path]
    base = merge_sessions({"instructions": "hi"}, nest(path, old))
    after = merge_update(base, nest(path, new))
    assert at(after, path) == new
    assert after["instructions"] == "hi"  # everything else stays
    assert at(base, path) == old  # the old session is not touched


def test_other_objects_merge_key_by_key_and_lists_and_null_replace() -> None:
    base = {"audio": {"output": {"voice": "marin", "speed": 1.0}}, "include": ["a", "b"]}
    after = merge_update(base, {"audio": {"output": {"speed": 1.2}}, "include": ["c"]})
    assert after == {"audio": {"output": {"voice": "marin", "speed": 1.2}}, "include": ["c"]}
    cleared = merge_update(
        merge_update(base, nest(("audio", "input", "turn_detection"), {"type": "server_vad"})),
        nest(("audio", "input", "turn_detection"), None),
    )
    assert cleared["audio"]["input"]["turn_detection"] is None


def test_signaling_and_the_transceiver_merge_with_the_same_function() -> None:
    # One owner: neither service has a copy of its own.
    assert vars(realtime_session)["merge_sessions"] is session_config.merge_sessions
    assert vars(realtime)["merge_update"] is session_config.merge_update
    assert not hasattr(realtime_session, "WHOLE") and not hasattr(realtime_session, "_merge")


def test_an_update_that_would_take_the_session_past_the_bound_is_refused() -> None:
    base = {"instructions": "x" * (MAX_SESSION_BYTES - 100)}
    with pytest.raises(SessionConfigError) as refused:
        merge_update(base, {"tools": [{"type": "function", "name": "y" * 200}]})
    assert refused.value.status == 413
    assert base == {"instructions": "x" * (MAX_SESSION_BYTES - 100)}
    # replacing the big field with a small one is fine: the bound is on the result
    assert merge_update(base, {"instructions": "short"}) == {"instructions": "short"}
    deep: Any = 1
    for _ in range(40):
        deep = {"a": deep}
    with pytest.raises(SessionConfigError) as too_deep:
        merge_update({}, {"metadata": deep})
    assert too_deep.value.status == 400


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=40),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=40,
)
updates = st.dictionaries(
    st.sampled_from(["instructions", "audio", "tools", "turn_detection", "x", "tracing"]),
    json_values,
    max_size=4,
)


@given(st.lists(updates, max_size=12))
def test_no_sequence_of_updates_leaves_the_session_over_the_bound(
    seq: list[dict[str, Any]],
) -> None:
    session: dict[str, Any] = {}
    for update in seq:
        try:
            session = merge_update(session, update)
        except SessionConfigError:
            pass
        assert size_of(session) <= MAX_SESSION_BYTES


# -- through the transceiver's codec: what a backend gets after a reconnect --------------------


def codec(session: dict[str, Any]) -> RealtimeProtocol:
    return RealtimeProtocol(CallInfo("s1", "c1", None, session), new_id=lambda: "event_x")


def update(session: dict[str, Any], event_id: str = "evt_1") -> str:
    return json.dumps({"type": "session.update", "event_id": event_id, "session": session})


def reopened(c: RealtimeProtocol) -> dict[str, Any]:
    (opening,) = c.opening()
    assert isinstance(opening, str)
    sent = json.loads(opening)
    assert sent["type"] == "session.update"
    return sent["session"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("path", sorted(WHOLE_CASES), ids=".".join)
def test_after_a_reconnect_a_whole_setting_is_re_sent_as_the_caller_last_gave_it(
    path: tuple[str, ...],
) -> None:
    old, new = WHOLE_CASES[path]
    created = merge_sessions({"type": "realtime", "instructions": "hi"}, nest(path, old))
    c = codec(created)
    events = c.caller_message(update(nest(path, new)))
    # forwarded as sent (a noise reduction setting is also run by the edge: `NoiseReduction`)
    assert [type(e) for e in events if not isinstance(e, NoiseReduction)] == [ToAgent]
    # what signaling would have made of the same layers is what the backend gets again
    assert reopened(c) == merge_sessions(created, nest(path, new))
    assert at(reopened(c), path) == new


def test_a_refused_update_is_not_forwarded_and_not_re_sent() -> None:
    c = codec({"type": "realtime", "instructions": "hi"})
    for i in range(3):  # each alone is under the bound, together they are not
        events = c.caller_message(update({f"k{i}": "x" * 6000}, event_id=f"evt_{i}"))
    (refusal,) = [e for e in events if isinstance(e, ToSender)]
    assert not [e for e in events if isinstance(e, ToAgent)]
    error = json.loads(refusal.text)
    assert error["type"] == "error"
    assert error["error"]["code"] == "session_too_large"
    assert error["error"]["type"] == "invalid_request_error"
    assert error["error"]["param"] == "session" and error["error"]["event_id"] == "evt_2"
    again = reopened(c)
    assert set(again) == {"type", "instructions", "k0", "k1"}
    assert size_of(again) <= MAX_SESSION_BYTES
