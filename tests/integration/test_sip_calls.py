"""Phone calls through the edge: SIP on signaling, plain RTP through the relay's one port.

The whole edge runs as processes (`tests/sip_phone.py`'s `PhoneStack`: Redis, relay,
transceiver, echo agent, signaling with `--sip-listen`); the calls come from real user agents
(baresip, sipp) and, where a case has to happen on cue, from a scripted phone on real sockets.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from firsthop.shared.wire import sip

from ..sip_phone import Phone, PhoneStack, power_at, tone

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
