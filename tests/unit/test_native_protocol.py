"""The native agent protocol's refusals (`services/transceiver/agents/native.py`): what a
caller or an agent sends that it must count, never raise on or pass on."""

from __future__ import annotations

import json

from firsthop.services.transceiver.agents.events import CallInfo, Malformed, PlayAudio, ToAgent
from firsthop.services.transceiver.agents.native import MAX_EVENT_BYTES, NativeProtocol


def native() -> NativeProtocol:
    return NativeProtocol(CallInfo("s1", "c1", None))


def test_an_agents_odd_length_audio_is_refused_not_played_a_byte_off() -> None:
    p = native()
    assert p.on_message(bytes(1920)) == [PlayAudio(bytes(1920))]
    assert p.on_message(bytes(1919)) == [Malformed("agent_bad_audio")]


def test_an_agents_text_too_long_to_be_any_message_is_dropped_unparsed() -> None:
    """A megabyte of JSON cost 95 ms to parse and dump before the size check refused it."""
    p = native()
    huge = json.dumps({"type": "agent.event", "data": "x" * (MAX_EVENT_BYTES + 2048)})
    assert p.on_message(huge) == [Malformed("event_dropped_oversize")]


def test_a_callers_event_nested_as_deep_as_json_parses_is_refused_not_raised() -> None:
    """Forwarded one level deeper than it came, the deepest nesting that parses does not
    encode: a RecursionError ended the call (`session_error`)."""
    p = native()
    for depth in range(900, 1100, 7):
        out = p.caller_message("[" * depth + "]" * depth)
        assert out == [Malformed("event_dropped_not_json")] or isinstance(out[0], ToAgent)
