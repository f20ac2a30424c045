"""The phone calls' shared records (`signaling/sip_calls.py`): each state's lifetime."""

from __future__ import annotations

import trio

from firsthop.services.signaling.sip_calls import ANSWERED_TTL, RING_TTL, PhoneRecord, SipCalls

CALL = "rtc_" + "a" * 32


def test_a_ringing_record_lives_minutes_and_an_answered_one_as_long_as_a_session() -> None:
    """A ringing record its replica could not delete (Redis down as the call ended) must not
    take an accept much later; an answered call's must still take a transfer hours on (it
    does not move while it is up: its TTL had been an hour from its last move)."""
    now = [1000.0]
    phones = SipCalls(None, clock=lambda: now[0])

    async def main() -> None:
        await phones.put(PhoneRecord(CALL, "v=0", "t", "192.0.2.1", "sip:echo@x"))
        now[0] += RING_TTL + 1
        assert await phones.get(CALL) is None  # (forgotten: an accept finds nothing)
        await phones.put(PhoneRecord(CALL, "v=0", "t", "192.0.2.1", "sip:echo@x"))
        assert await phones.move(CALL, "ringing", state="accepted")
        assert await phones.move(CALL, "accepted", state="answered", answer="v=0")
        now[0] += ANSWERED_TTL - 60  # up for hours
        assert await phones.move(CALL, "answered", refer="tel:+14155550123")
        now[0] += ANSWERED_TTL - 60  # a move renews it
        found = await phones.get(CALL)
        assert found is not None and found.refer == "tel:+14155550123"

    trio.run(main)
