"""A phone's keys (RFC 4733, told by the media core) in each agent protocol's own words."""

from __future__ import annotations

import json

from firsthop.services.transceiver.agents import PROTOCOLS
from firsthop.services.transceiver.agents.events import CallInfo, ToAgent, ToCaller
from firsthop.services.transceiver.agents.twilio_events import BotMedia, parse

CALL = CallInfo("s1", "c1", None)


def test_native_agents_get_a_dtmf_message() -> None:
    (event,) = PROTOCOLS["native"](CALL).dtmf("5", 0.1)
    assert isinstance(event, ToAgent)
    assert json.loads(event.message) == {"type": "dtmf", "digit": "5", "duration_ms": 100}


def test_realtime_apps_hear_openais_dtmf_event_on_the_sideband() -> None:
    """OpenAI's SIP calls tell the app of a key with this server event; a Realtime backend
    (a model) has no client event for it, so it goes to the caller's side only."""
    (event,) = PROTOCOLS["realtime"](CALL).dtmf("#", 0.2)
    assert isinstance(event, ToCaller)
    data = json.loads(event.text)
    assert data["type"] == "input_audio_buffer.dtmf_event_received" and data["event"] == "#"
    assert isinstance(data["received_at"], int) and data["event_id"]


def test_media_streams_bots_get_twilios_dtmf_event() -> None:
    protocol = PROTOCOLS["twilio"](CALL)
    protocol.opening()
    (event,) = protocol.dtmf("7", 0.1)
    assert isinstance(event, ToAgent) and isinstance(event.message, str)
    data = json.loads(event.message)
    assert data["event"] == "dtmf" and data["dtmf"] == {"track": "inbound_track", "digit": "7"}
    assert data["streamSid"] and int(data["sequenceNumber"]) > 0
    assert not isinstance(parse(event.message, data["streamSid"]), BotMedia)


def test_g711_straight_through_where_the_agent_takes_the_calls_codec() -> None:
    import base64

    payload = bytes(range(160))
    native = PROTOCOLS["native"](CALL)
    assert not native.takes_coded("pcmu")
    realtime = PROTOCOLS["realtime"](
        CallInfo(
            "s1",
            "c1",
            None,
            {"type": "realtime", "audio": {"input": {"format": {"type": "audio/pcmu"}}}},
        )
    )
    assert realtime.takes_coded("pcmu") and not realtime.takes_coded("pcma")
    assert not PROTOCOLS["realtime"](CALL).takes_coded("pcmu")  # its default: 24 kHz PCM
    message = realtime.caller_coded(payload)
    assert isinstance(message, str)
    sent = json.loads(message)
    assert (
        sent["type"] == "input_audio_buffer.append" and base64.b64decode(sent["audio"]) == payload
    )
    twilio = PROTOCOLS["twilio"](CALL)
    twilio.opening()
    assert twilio.takes_coded("pcmu") and not twilio.takes_coded("opus")
    media = twilio.caller_coded(payload)
    assert isinstance(media, str)
    data = json.loads(media)
    assert data["event"] == "media" and base64.b64decode(data["media"]["payload"]) == payload


def test_a_pcmu_backend_is_played_to_a_pcmu_phone_as_it_came() -> None:
    import base64

    from firsthop.services.transceiver.agents.events import PlayAudio

    session = {"type": "realtime", "audio": {"output": {"format": {"type": "audio/pcmu"}}}}
    realtime = PROTOCOLS["realtime"](CallInfo("s1", "c1", None, session, codec="pcmu"))
    realtime.opening()
    wire = bytes(range(200)) + bytes(200)
    delta = {"type": "response.output_audio.delta", "response_id": "r", "item_id": "i"}
    played = realtime.on_message(json.dumps({**delta, "delta": base64.b64encode(wire).decode()}))
    frames = [e for e in played if isinstance(e, PlayAudio)]
    assert [(f.pcm, f.coded) for f in frames] == [(wire[:160], True), (wire[160:320], True)]
    done = realtime.on_message(
        json.dumps({"type": "response.output_audio.done", "response_id": "r", "item_id": "i"})
    )
    rest = [e for e in done if isinstance(e, PlayAudio)]
    assert [(f.pcm, f.coded) for f in rest] == [(wire[320:] + b"\xff" * 80, True)]
    opus_call = PROTOCOLS["realtime"](CallInfo("s1", "c1", None, session))  # a WebRTC call
    opus_call.opening()
    decoded = opus_call.on_message(json.dumps({**delta, "delta": base64.b64encode(wire).decode()}))
    assert all(not e.coded for e in decoded if isinstance(e, PlayAudio))
