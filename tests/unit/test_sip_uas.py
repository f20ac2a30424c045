"""The SIP UAS core (`services/sip/uas.py`) with a fake clock: transactions, dialogs, bounds."""

from __future__ import annotations

import functools
import itertools
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from firsthop.services.sip.trunk_auth import TrunkSecret
from firsthop.services.sip.uas import (
    HEAP_SLACK,
    MAX_SE,
    T1,
    T2,
    TIMEOUT,
    TRANSFER_TIMEOUT,
    CallConfirmed,
    CallEnded,
    CallOffered,
    CallReoffered,
    CallTransferred,
    Limits,
    SipUas,
    Trunk,
)
from firsthop.shared.wire import sip, sip_digest
from firsthop.shared.wire.sip import SipRequest, SipResponse

TRUNK = ("192.0.2.7", 5062)
STRANGER = ("203.0.113.9", 5060)
SDP = (
    b"v=0\r\no=- 1 1 IN IP4 192.0.2.7\r\ns=-\r\nc=IN IP4 192.0.2.7\r\nt=0 0\r\n"
    b"m=audio 4000 RTP/AVP 0\r\n"
)


def uas(limits: Limits | None = None) -> SipUas:
    counter = itertools.count()
    return SipUas(
        trunks=[Trunk.of("pbx", ["192.0.2.0/28"])],
        contact="sip:firsthop@198.51.100.1:5060",
        token=lambda: f"t{next(counter)}",
        now=0.0,
        limits=limits or Limits(),
    )


def request(
    method: str,
    *,
    branch: str = "z9hG4bKb1",
    cseq: int = 1,
    cseq_method: str | None = None,
    to_tag: str | None = None,
    call_id: str = "call-1",
    body: bytes = b"",
    extra: tuple[tuple[str, str], ...] = (),
    via_host: str = "192.0.2.7:5062",
) -> bytes:
    to = "<sip:echo@198.51.100.1>" + (f";tag={to_tag}" if to_tag else "")
    fields = [
        ("Via", f"SIP/2.0/UDP {via_host};branch={branch};rport"),
        ("Max-Forwards", "70"),
        ("From", "<sip:+15550001@192.0.2.7>;tag=them"),
        ("To", to),
        ("Call-ID", call_id),
        ("CSeq", f"{cseq} {cseq_method or method}"),
        ("Contact", "<sip:+15550001@192.0.2.7:5062>"),
        ("Record-Route", "<sip:proxy.example;lr>"),
        *extra,
    ]
    if body:
        fields.append(("Content-Type", "application/sdp"))
    return sip.request(method, "sip:echo@198.51.100.1", fields, body).encode()


def sent(core: SipUas) -> list[tuple[SipRequest | SipResponse, tuple[str, int]]]:
    return [(sip.parse_sip(data), dest) for data, dest, _ in core.datagrams_to_send()]


def one_request(core: SipUas) -> SipRequest:
    """The one message the core sent: a request of ours."""
    ((message, _),) = sent(core)
    assert isinstance(message, SipRequest)
    return message


def statuses(core: SipUas) -> list[int]:
    out = []
    for message, dest in sent(core):
        assert isinstance(message, SipResponse) and dest == TRUNK
        out.append(message.status)
    return out


def events(core: SipUas) -> list[object]:
    out: list[object] = []
    while (event := core.next_event()) is not None:
        out.append(event)
    return out


def offered(core: SipUas, now: float = 0.0) -> str:
    core.receive_datagram(request("INVITE", body=SDP), TRUNK, now)
    (event,) = events(core)
    assert isinstance(event, CallOffered)
    assert event.trunk == "pbx" and event.request.body == SDP and event.source == TRUNK
    return event.call


def run_until(core: SipUas, until: float) -> list[tuple[float, SipRequest | SipResponse]]:
    """Fire every timer due up to `until`; what went out, with when."""
    out = []
    while (at := core.get_timer()) is not None and at <= until:
        core.handle_timer(at)
        out += [(at, m) for m, _ in sent(core)]
    return out


def ack(to_tag: str, branch: str = "z9hG4bKack1") -> bytes:
    return request("ACK", branch=branch, to_tag=to_tag, cseq_method="ACK")


def answered(core: SipUas) -> str:
    call = offered(core)
    core.answer(call, b"v=0\r\n", 0.1)
    sent(core)
    core.receive_datagram(ack(call), TRUNK, 0.2)
    assert events(core) == [CallConfirmed(call)]
    return call


def test_an_invite_rings_is_answered_and_acknowledged() -> None:
    core = uas()
    call = offered(core)
    ((trying, dest),) = sent(core)
    assert isinstance(trying, SipResponse) and trying.status == 100 and dest == TRUNK
    assert sip.parse_via(trying.vias()[0]).params["received"] == "192.0.2.7"
    core.ring(call)
    core.ring(call)  # once
    ((ringing, _),) = sent(core)
    assert isinstance(ringing, SipResponse) and ringing.status == 180
    assert sip.parse_name_addr(ringing.get("to") or "").tag == call
    assert core.answer(call, b"v=0\r\n", 0.1)
    ((ok, _),) = sent(core)
    assert isinstance(ok, SipResponse) and ok.status == 200 and ok.body == b"v=0\r\n"
    assert ok.get("content-type") == "application/sdp"
    assert ok.get("contact") == "<sip:firsthop@198.51.100.1:5060>"
    # §13.3.1.4: the 2xx again at T1, 2T1, ... until the ACK
    again = run_until(core, 0.1 + 3 * T1 + 0.01)
    assert [round(at - 0.1, 3) for at, _ in again] == [T1, 3 * T1]
    core.receive_datagram(ack(call), TRUNK, 2.0)
    assert events(core) == [CallConfirmed(call)]
    assert [m for _, m in run_until(core, 60.0)] == []  # nothing more, and it forgets
    assert core.transactions == 0 and core.calls == 1


def test_without_an_ack_the_2xx_stops_and_the_call_ends_with_a_bye() -> None:
    core = uas()
    call = offered(core)
    sent(core)
    core.answer(call, b"v=0\r\n", 0.0)
    sent(core)
    out = run_until(core, TIMEOUT + 1)
    oks = [at for at, m in out if isinstance(m, SipResponse)]
    gaps = [round(b - a, 3) for a, b in zip([0.0, *oks], oks, strict=False)]
    assert gaps[:4] == [T1, 2 * T1, 4 * T1, T2] and max(gaps) <= T2
    byes = [m for _, m in out if isinstance(m, SipRequest)]
    assert byes and byes[0].method == "BYE"
    assert events(core) == [CallEnded(call, "no_ack")]


def test_retransmitted_invites_get_the_last_answer_and_reach_the_application_once() -> None:
    core = uas()
    call = offered(core)
    assert statuses(core) == [100]
    core.receive_datagram(request("INVITE", body=SDP), TRUNK, 0.3)
    assert statuses(core) == [100] and events(core) == []
    core.answer(call, b"v=0\r\n", 0.4)
    sent(core)
    core.receive_datagram(request("INVITE", body=SDP), TRUNK, 0.45)
    assert statuses(core) == [200] and events(core) == []
    assert core.counters["sip_retransmissions_absorbed"] == 2


OTHER = ("198.18.0.5", 5060)  # a second trunk's address (`two_trunks`)


def two_trunks() -> SipUas:
    counter = itertools.count()
    return SipUas(
        trunks=[Trunk.of("pbx", ["192.0.2.0/28"]), Trunk.of("other", ["198.18.0.0/24"])],
        contact="sip:firsthop@198.51.100.1:5060",
        token=lambda: f"t{next(counter)}",
        now=0.0,
    )


def answers(core: SipUas) -> list[tuple[int, tuple[str, int]]]:
    return [(m.status, dest) for m, dest in sent(core) if isinstance(m, SipResponse)]


def test_a_dialog_answers_only_its_own_trunk_and_peer_tag() -> None:
    """A helper's read (stop 42): requests were matched on Call-ID and our tag, or on Via,
    alone; another trunk (or anyone in a trunk's CIDR) knowing them could end a call, cancel
    it while it rang, confirm it, or be sent its 200 OK (our answer, an SDES key in it) as a
    retransmission. Now §12's dialog id (the peer's From tag too) and the call's trunk must
    match; else 481, or nothing for what only the INVITE's peer may send."""
    core = two_trunks()
    call = answered(core)
    forged = request("BYE", branch="z9hG4bKf1", cseq=2, to_tag=call).replace(
        b"tag=them", b"tag=forged"
    )
    core.receive_datagram(forged, TRUNK, 1.0)  # the right trunk, another From tag
    core.receive_datagram(request("BYE", branch="z9hG4bKf2", cseq=3, to_tag=call), OTHER, 1.0)
    core.receive_datagram(request("INVITE", body=SDP), OTHER, 1.0)  # the INVITE's Via again
    assert answers(core) == [(481, TRUNK), (481, OTHER)]
    assert events(core) == [] and core.calls == 1
    assert core.counters["sip_not_dialog_peer"] == 1
    core.receive_datagram(request("BYE", branch="z9hG4bKb2", cseq=2, to_tag=call), TRUNK, 1.1)
    assert statuses(core) == [200] and events(core) == [CallEnded(call, "bye")]
    # A ringing call: a CANCEL (its INVITE's Via) and an ACK from the other trunk change nothing.
    second = functools.partial(request, branch="z9hG4bKr2", call_id="call-2")  # another call
    core.receive_datagram(second("INVITE", body=SDP), TRUNK, 2.0)
    (offer,) = events(core)
    assert isinstance(offer, CallOffered)
    sent(core)
    core.receive_datagram(second("CANCEL", cseq=1), OTHER, 2.0)
    assert answers(core) == [(481, OTHER)] and events(core) == []
    core.answer(offer.call, b"v=0\r\n", 2.1)
    sent(core)
    its_ack = second("ACK", to_tag=offer.call, cseq_method="ACK")
    core.receive_datagram(its_ack, OTHER, 2.2)
    assert events(core) == [] and core.counters["sip_not_dialog_peer"] == 2
    core.receive_datagram(its_ack, TRUNK, 2.3)
    assert events(core) == [CallConfirmed(offer.call)]


def test_a_transaction_answers_only_the_address_it_came_from() -> None:
    """An attacker read (stop 44): another host of the same trunk's range that sent a ringing
    call's INVITE Via again was sent our 100 (later our 200: an SDES key in it), and its
    CANCEL ended the call. Retransmissions and CANCELs come from where their INVITE did."""
    core = uas()
    offered(core)
    sent(core)
    neighbour = ("192.0.2.8", 5062)  # (in the trunk's 192.0.2.0/28)
    core.receive_datagram(request("INVITE", body=SDP), neighbour, 0.1)
    assert sent(core) == [] and core.counters["sip_not_dialog_peer"] == 1
    core.receive_datagram(request("CANCEL", cseq=1), neighbour, 0.2)
    assert [(m.status, dest) for m, dest in sent(core)] == [(481, neighbour)]  # type: ignore[union-attr]
    assert events(core) == [] and core.calls == 1
    core.receive_datagram(request("INVITE", body=SDP), TRUNK, 0.3)  # its own retransmission
    assert statuses(core) == [100]


def test_cancel_while_ringing() -> None:
    core = uas()
    call = offered(core)
    sent(core)
    core.receive_datagram(request("CANCEL"), TRUNK, 1.0)
    assert sorted(statuses(core)) == [200, 487]
    assert events(core) == [CallEnded(call, "cancel")]
    # the 487 is retransmitted (Timer G) until its ACK, which has the INVITE's branch
    again = run_until(core, 1.0 + T1 + 0.01)
    assert [m.status for _, m in again if isinstance(m, SipResponse)] == [487]
    core.receive_datagram(ack(call, branch="z9hG4bKb1"), TRUNK, 1.6)
    assert run_until(core, 100.0) == []
    assert core.transactions == 0 and core.calls == 0


def test_a_cancel_for_nothing_gets_481() -> None:
    core = uas()
    core.receive_datagram(request("CANCEL", branch="z9hG4bKnothing"), TRUNK, 0.0)
    assert statuses(core) == [481]


def test_bye_from_the_trunk_and_its_retransmission() -> None:
    core = uas()
    call = answered(core)
    bye = request("BYE", branch="z9hG4bKbye", cseq=2, to_tag=call)
    core.receive_datagram(bye, TRUNK, 5.0)
    assert statuses(core) == [200]
    assert events(core) == [CallEnded(call, "bye")]
    core.receive_datagram(bye, TRUNK, 5.5)
    assert statuses(core) == [200] and events(core) == []
    core.receive_datagram(request("BYE", branch="z9hG4bKbye2", cseq=3, to_tag=call), TRUNK, 6)
    assert statuses(core) == [481]


def test_hangup_sends_a_bye_in_the_dialog_retransmitted_until_answered() -> None:
    core = uas()
    call = answered(core)
    assert core.hangup(call, 3.0)
    assert events(core) == [CallEnded(call, "hangup")]
    ((bye, dest),) = sent(core)
    assert isinstance(bye, SipRequest) and bye.method == "BYE" and dest == TRUNK
    assert bye.uri == "sip:+15550001@192.0.2.7:5062"  # the INVITE's Contact
    assert bye.get("route") == "<sip:proxy.example;lr>"
    assert sip.parse_name_addr(bye.get("from") or "").tag == call
    assert sip.parse_name_addr(bye.get("to") or "").tag == "them"
    assert bye.get("cseq") == "1 BYE" and bye.call_id == "call-1"
    assert [getattr(m, "method", None) for _, m in run_until(core, 3.0 + T1)] == ["BYE"]
    ok = sip.response_to(bye, 200, "OK").encode()
    core.receive_datagram(ok, TRUNK, 3.6)
    assert run_until(core, 100.0) == []
    assert core.transactions == 0


def hung_up_before_the_ack(core: SipUas) -> str:
    call = offered(core)
    core.answer(call, b"v=0\r\n", 0.0)
    sent(core)
    core.hangup(call, 0.1)
    assert events(core) == [CallEnded(call, "hangup")]
    return call


def test_hangup_before_the_ack_waits_for_it() -> None:
    core = uas()
    call = hung_up_before_the_ack(core)
    assert sent(core) == []  # §15: no BYE before the ACK
    core.receive_datagram(ack(call), TRUNK, 0.2)
    bye = one_request(core)
    assert bye.method == "BYE"
    assert events(core) == []


def test_hangup_while_ringing_is_a_480() -> None:
    core = uas()
    call = offered(core)
    sent(core)
    core.hangup(call, 1.0)
    assert statuses(core) == [480]
    assert events(core) == [CallEnded(call, "hangup")]


def test_reject() -> None:
    core = uas()
    call = offered(core)
    sent(core)
    assert not core.reject(call, 200, "OK", 1.0)
    assert core.reject(call, 486, "Busy Here", 1.0)
    assert statuses(core) == [486]
    assert events(core) == [CallEnded(call, "rejected")]


def test_a_ringing_call_is_given_up_after_the_ring_timeout() -> None:
    core = uas(Limits(ring_timeout=10.0))
    call = offered(core)
    sent(core)
    out = run_until(core, 10.0)
    assert [m.status for _, m in out if isinstance(m, SipResponse)] == [480]
    assert events(core) == [CallEnded(call, "ring_timeout")]


def test_reinvite_is_a_new_offer_and_a_second_one_waits() -> None:
    core = uas()
    call = answered(core)
    reinvite = request("INVITE", branch="z9hG4bKre", cseq=2, to_tag=call, body=SDP)
    core.receive_datagram(reinvite, TRUNK, 5.0)
    assert statuses(core) == [100]
    (event,) = events(core)
    assert isinstance(event, CallReoffered) and event.request.body == SDP
    core.receive_datagram(request("UPDATE", branch="z9hG4bKup", cseq=3, to_tag=call), TRUNK, 5.1)
    assert statuses(core) == [491]
    assert core.answer(call, b"v=0\r\na=sendonly\r\n", 5.2)
    assert statuses(core) == [200]
    core.receive_datagram(ack(call, "z9hG4bKack2").replace(b"1 ACK", b"2 ACK"), TRUNK, 5.3)
    assert events(core) == []


def test_in_dialog_requests_must_match_and_raise_the_cseq() -> None:
    core = uas()
    call = answered(core)
    core.receive_datagram(request("BYE", branch="z9hG4bKx", cseq=2, to_tag="nope"), TRUNK, 1)
    assert statuses(core) == [481]
    core.receive_datagram(request("INFO", branch="z9hG4bKy", cseq=1, to_tag=call), TRUNK, 1)
    assert statuses(core) == [500]
    core.receive_datagram(request("INFO", branch="z9hG4bKz", cseq=5, to_tag=call), TRUNK, 1)
    assert statuses(core) == [200]


def test_out_of_dialog_requests() -> None:
    core = uas()
    core.receive_datagram(request("OPTIONS", branch="z9hG4bKo"), TRUNK, 0)
    ((ok, _),) = sent(core)
    assert isinstance(ok, SipResponse) and ok.status == 200 and "INVITE" in (ok.get("allow") or "")
    core.receive_datagram(request("REGISTER", branch="z9hG4bKr"), TRUNK, 0)
    core.receive_datagram(request("FROBNICATE", branch="z9hG4bKf"), TRUNK, 0)
    core.receive_datagram(request("BYE", branch="z9hG4bKb"), TRUNK, 0)
    assert statuses(core) == [405, 501, 481]
    core.receive_datagram(
        request("INVITE", branch="z9hG4bK2", extra=(("Require", "100rel"),)), TRUNK, 0
    )
    assert statuses(core) == [420]
    core.receive_datagram(
        request("OPTIONS", branch="z9hG4bKm").replace(b"Max-Forwards: 70", b"Max-Forwards: 0"),
        TRUNK,
        0,
    )
    assert statuses(core) == [483]


def test_responses_go_to_the_source_never_to_a_host_the_via_names() -> None:
    core = uas()
    core.receive_datagram(request("OPTIONS", via_host="victim.example:9"), TRUNK, 0)
    ((_, dest),) = sent(core)
    assert dest == TRUNK


def test_sources_outside_every_trunk_get_403_at_a_bounded_rate() -> None:
    core = uas()
    for i in range(200):
        core.receive_datagram(request("INVITE", branch=f"z9hG4bK{i}", body=SDP), STRANGER, 0.0)
    out = sent(core)
    assert 0 < len(out) <= 40
    assert all(isinstance(m, SipResponse) and m.status == 403 for m, _ in out)
    assert events(core) == [] and core.calls == 0 and core.transactions == 0
    assert core.counters["sip_forbidden"] == 200
    response = sip.response_to(sip.parse_sip(request("BYE")), 200, "OK").encode()  # type: ignore[arg-type]
    core.receive_datagram(response, STRANGER, 0.0)
    assert sent(core) == [] and core.counters["sip_dropped_not_trunk"] == 1


def test_malformed_requests_from_a_trunk() -> None:
    core = uas()
    broken = re.sub(rb"Content-Length: \d+", b"Content-Length: 999", request("INVITE", body=SDP))
    core.receive_datagram(broken, TRUNK, 0)
    assert statuses(core) == [400]
    core.receive_datagram(b"\x16\x03\x01garbage", TRUNK, 0)
    core.receive_datagram(request("OPTIONS", branch="oldstyle"), TRUNK, 0)
    assert statuses(core) == [400]  # the garbage: a counted drop; the old branch: 400
    assert core.counters["sip_malformed"] == 3
    assert events(core) == [] and core.transactions == 0


def test_bounds_on_calls_and_on_one_source() -> None:
    core = uas(Limits(calls=2, per_source=5, transactions=100))
    for i in range(3):
        core.receive_datagram(
            request("INVITE", branch=f"z9hG4bK{i}", call_id=f"c{i}", body=SDP), TRUNK, 0
        )
    assert core.calls == 2 and statuses(core) == [100, 100, 503]
    for i in range(10):  # (answered statelessly: no transaction)
        core.receive_datagram(request("OPTIONS", branch=f"z9hG4bKo{i}"), TRUNK, 0)
    assert statuses(core) == [200] * 10 and core.transactions == 3
    for i in range(3, 13):  # 5 live transactions from one source, then a stateless 503
        core.receive_datagram(
            request("INVITE", branch=f"z9hG4bK{i}", call_id=f"c{i}", body=SDP), TRUNK, 0
        )
    assert statuses(core) == [503] * 10 and core.transactions == 5
    assert core.counters["sip_dropped_over_limit"] == 8
    run_until(core, 100.0)  # the transactions end; the two calls ring out
    assert core.transactions == 0 and core.calls == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=5))
def test_no_datagram_raises(datagrams: list[bytes]) -> None:
    core = uas()
    for i, data in enumerate(datagrams):
        core.receive_datagram(data, TRUNK, float(i))
        core.receive_datagram(data, STRANGER, float(i))
    run_until(core, 100.0)


METHODS = st.sampled_from(["INVITE", "ACK", "BYE", "CANCEL", "OPTIONS", "UPDATE", "INFO", "X"])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            METHODS, st.integers(1, 4), st.sampled_from([None, "t0", "t1"]), st.integers(0, 3)
        ),
        max_size=12,
    )
)
def test_any_sequence_of_requests_keeps_the_core_consistent(
    steps: list[tuple[str, int, str | None, int]],
) -> None:
    core = uas(Limits(calls=2, per_source=8))
    for i, (method, cseq, tag, branch) in enumerate(steps):
        body = SDP if method == "INVITE" else b""
        data = request(method, branch=f"z9hG4bK{branch}", cseq=cseq, to_tag=tag, body=body)
        core.receive_datagram(data, TRUNK, i * 0.1)
        for event in events(core):
            if isinstance(event, CallOffered | CallReoffered) and i % 2:
                core.answer(event.call, b"v=0\r\n", i * 0.1)
        core.datagrams_to_send()
    assert core.calls <= 2
    run_until(core, 1000.0)
    core.datagrams_to_send()
    assert core.transactions == 0
    assert core.get_timer() is None or core.calls > 0


def test_a_bye_while_ringing_ends_the_call_and_its_invite_gets_487() -> None:
    core = uas()
    call = offered(core)
    sent(core)
    core.receive_datagram(request("BYE", branch="z9hG4bKbye", cseq=2, to_tag=call), TRUNK, 1.0)
    assert sorted(statuses(core)) == [200, 487]  # §15.1.2
    assert events(core) == [CallEnded(call, "bye")]


def test_refer_in_the_dialog_and_what_a_target_may_be() -> None:
    core = uas()
    call = answered(core)
    assert not core.refer(call, "sip:x@y>\r\nX-Evil: 1", 1.0)  # no header injection
    assert not core.refer(call, "http://example.com", 1.0)
    assert core.refer(call, "tel:+14155550123", 1.0)
    ((refer, dest),) = sent(core)
    assert isinstance(refer, SipRequest) and refer.method == "REFER" and dest == TRUNK
    assert refer.get("refer-to") == "<tel:+14155550123>" and refer.get("cseq") == "1 REFER"
    # the trunk reports the transfer's progress (RFC 3515 §2.4.4): NOTIFY in the dialog, 200
    notify = request("NOTIFY", branch="z9hG4bKn", cseq=2, to_tag=call)
    core.receive_datagram(notify, TRUNK, 1.5)
    assert statuses(core) == [200]


def notify(call: str, cseq: int, frag: bytes, event: str = "refer") -> bytes:
    """The trunk's NOTIFY of a transfer's progress (RFC 3515 §2.4.4) in `call`'s dialog."""
    fields = [
        ("Via", f"SIP/2.0/UDP 192.0.2.7:5062;branch=z9hG4bKn{cseq};rport"),
        ("From", "<sip:+15550001@192.0.2.7>;tag=them"),
        ("To", f"<sip:echo@198.51.100.1>;tag={call}"),
        ("Call-ID", "call-1"),
        ("CSeq", f"{cseq} NOTIFY"),
        ("Event", event),
        ("Subscription-State", "active;expires=60"),
        ("Content-Type", "message/sipfrag;version=2.0"),
    ]
    return sip.request("NOTIFY", "sip:firsthop@198.51.100.1", fields, frag).encode()


def referred(core: SipUas) -> tuple[str, SipRequest]:
    """An answered call we asked to transfer: its tag and our REFER."""
    call = answered(core)
    assert core.refer(call, "sip:desk@pbx.example", 1.0)
    refer = one_request(core)
    assert refer.method == "REFER"
    return call, refer


def test_a_transfer_is_told_done_by_the_trunks_final_notify_once() -> None:
    core = uas()
    call, refer = referred(core)
    core.receive_datagram(sip.response_to(refer, 202, "Accepted").encode(), TRUNK, 1.1)
    assert events(core) == [] and core.counters["sip_refers_accepted"] == 1
    core.receive_datagram(notify(call, 2, b"SIP/2.0 100 Trying\r\n"), TRUNK, 1.2)
    core.receive_datagram(notify(call, 3, b"SIP/2.0 180 Ringing\r\n"), TRUNK, 1.3)
    assert statuses(core) == [200, 200] and events(core) == []  # (still under way)
    core.receive_datagram(notify(call, 4, b"SIP/2.0 200 OK\r\n"), TRUNK, 2.0)
    assert statuses(core) == [200] and events(core) == [CallTransferred(call, 200)]
    core.receive_datagram(notify(call, 5, b"SIP/2.0 603 Declined\r\n"), TRUNK, 2.1)
    assert statuses(core) == [200] and events(core) == []  # told once
    assert core.counters["sip_transfers_completed"] == 1
    assert core.counters["sip_transfers_failed"] == 0


def test_a_transfer_the_target_declines_fails_and_the_call_goes_on() -> None:
    core = uas()
    call, refer = referred(core)
    core.receive_datagram(sip.response_to(refer, 202, "Accepted").encode(), TRUNK, 1.1)
    core.receive_datagram(notify(call, 2, b"SIP/2.0 486 Busy Here\r\n"), TRUNK, 2.0)
    assert statuses(core) == [200] and events(core) == [CallTransferred(call, 486)]
    assert core.counters["sip_transfers_failed"] == 1 and core.calls == 1
    assert core.refer(call, "sip:other@pbx.example", 3.0)  # another try, told on its own


def test_a_refused_or_unanswered_refer_fails_the_transfer() -> None:
    core = uas()
    call, refer = referred(core)
    core.receive_datagram(sip.response_to(refer, 403, "Forbidden").encode(), TRUNK, 1.1)
    assert events(core) == [CallTransferred(call, 403)]
    assert core.counters["sip_refers_refused"] == 1
    # a NOTIFY no transfer waits for is answered and tells nothing
    core.receive_datagram(notify(call, 2, b"SIP/2.0 200 OK\r\n"), TRUNK, 1.2)
    assert statuses(core) == [200] and events(core) == []
    unanswered = uas()
    call, _ = referred(unanswered)
    run_until(unanswered, 1.0 + TIMEOUT)
    assert events(unanswered) == [CallTransferred(call, 408)]


def test_only_a_refer_notify_with_a_sipfrag_tells_a_transfers_status() -> None:
    core = uas()
    call, _ = referred(core)
    for cseq, (event, frag) in enumerate(
        [("presence", b"SIP/2.0 200 OK"), ("refer", b"200 OK"), ("refer", b"")], start=2
    ):
        core.receive_datagram(notify(call, cseq, frag, event), TRUNK, 1.0 + cseq)
        assert statuses(core) == [200] and events(core) == []
    core.receive_datagram(notify(call, 8, b"SIP/2.0 200 OK", "refer;id=7"), TRUNK, 8.0)
    assert statuses(core) == [200] and events(core) == []  # another REFER's (§2.4.6)
    core.receive_datagram(notify(call, 9, b"SIP/2.0 200 \r\n", "refer;id=1"), TRUNK, 9.0)
    assert events(core) == [CallTransferred(call, 200)]


def test_a_second_refer_replaces_the_first_and_only_its_outcome_is_told() -> None:
    core = uas()
    call, first = referred(core)
    assert core.refer(call, "sip:other@pbx.example", 2.0)
    second = one_request(core)
    assert second.get("cseq") == "2 REFER"
    core.receive_datagram(sip.response_to(first, 603, "Declined").encode(), TRUNK, 2.1)
    core.receive_datagram(notify(call, 2, b"SIP/2.0 486 Busy\r\n", "refer;id=1"), TRUNK, 2.2)
    assert events(core) == []  # the first's: not what the app now waits for
    core.receive_datagram(sip.response_to(second, 202, "Accepted").encode(), TRUNK, 2.3)
    core.receive_datagram(notify(call, 3, b"SIP/2.0 200 OK\r\n", "refer;id=2"), TRUNK, 3.0)
    assert events(core) == [CallTransferred(call, 200)]


def test_a_transfer_whose_outcome_never_comes_fails() -> None:
    core = uas()
    call, refer = referred(core)
    core.receive_datagram(sip.response_to(refer, 202, "Accepted").encode(), TRUNK, 1.1)
    ended = notify(call, 2, b"SIP/2.0 100 Trying\r\n").replace(
        b"active;expires=60", b"terminated;reason=noresource"
    )
    core.receive_datagram(ended, TRUNK, 1.2)  # its subscription ended without a final status
    assert events(core) == [CallTransferred(call, 487)]
    silent = uas()  # the trunk took the REFER and never said more
    call, refer = referred(silent)
    silent.receive_datagram(sip.response_to(refer, 202, "Accepted").encode(), TRUNK, 1.1)
    run_until(silent, 1.0 + TRANSFER_TIMEOUT - 1)
    assert events(silent) == []
    run_until(silent, 1.0 + TRANSFER_TIMEOUT)
    assert events(silent) == [CallTransferred(call, 408)]
    full = uas(Limits(transactions=1))  # a REFER that could not be followed is not sent
    call, _ = referred(full)
    assert not full.refer(call, "sip:desk@pbx.example", 2.0) and sent(full) == []
    assert full.counters["sip_refers_not_sent"] == 1


def test_only_the_calls_trunk_answering_the_refer_itself_settles_it() -> None:
    """A response is matched on its branch and CSeq (§17.1.3) and must come from the
    call's trunk; anything else is unmatched and tells nothing."""
    core = SipUas(
        trunks=[Trunk.of("pbx", ["192.0.2.0/28"]), Trunk.of("other", ["198.18.0.0/24"])],
        contact="sip:firsthop@198.51.100.1:5060",
        token=iter(f"t{i}" for i in itertools.count()).__next__,
        now=0.0,
    )
    call, refer = referred(core)
    refused = sip.response_to(refer, 403, "Forbidden").encode()
    core.receive_datagram(refused, ("198.18.0.5", 5060), 1.1)  # another trunk's address
    core.receive_datagram(refused.replace(b"1 REFER", b"1 BYE"), TRUNK, 1.2)
    core.receive_datagram(refused.replace(b"1 REFER", b"7 REFER"), TRUNK, 1.3)
    assert events(core) == [] and core.counters["sip_response_unmatched"] == 3
    core.receive_datagram(refused, TRUNK, 1.4)
    assert events(core) == [CallTransferred(call, 403)]


def test_over_tcp_the_transport_retransmits_and_our_requests_say_tcp() -> None:
    """§17: on a reliable transport no Timer G (non-2xx) nor Timer E (our BYE): the
    transport does not lose them; the 2xx is still sent again until its ACK (§13.3.1.4)."""
    core = uas()
    tcp = request("INVITE", body=SDP).replace(b"SIP/2.0/UDP", b"SIP/2.0/TCP")
    core.receive_datagram(tcp, TRUNK, 0.0, reliable=True)
    (offer,) = events(core)
    assert isinstance(offer, CallOffered)
    sent(core)
    core.reject(offer.call, 486, "Busy Here", 0.0)
    assert statuses(core) == [486]
    assert run_until(core, TIMEOUT - 1) == []  # no Timer G
    # Timer G follows what a request came on, not what its Via claims: UDP claiming TCP
    udp = uas()
    udp.receive_datagram(tcp, TRUNK, 0.0)
    (claimed,) = events(udp)
    assert isinstance(claimed, CallOffered)
    udp.reject(claimed.call, 486, "Busy Here", 0.0)
    assert statuses(udp) == [100, 486]
    assert [m.status for _, m in run_until(udp, 2.0)][:2] == [486, 486]  # type: ignore[union-attr]
    second = uas()
    second.receive_datagram(tcp, TRUNK, 0.0, reliable=True)
    (offer,) = events(second)
    assert isinstance(offer, CallOffered)
    second.answer(offer.call, b"v=0\r\n", 0.0)
    second.receive_datagram(ack(offer.call).replace(b"SIP/2.0/UDP", b"SIP/2.0/TCP"), TRUNK, 0.1)
    sent(second)
    second.hangup(offer.call, 1.0)
    ((bye, _),) = sent(second)
    assert isinstance(bye, SipRequest) and (bye.get("via") or "").startswith("SIP/2.0/TCP ")
    assert [m for _, m in run_until(second, TIMEOUT - 1)] == []  # no Timer E


def test_each_message_goes_on_the_transport_its_transaction_came_on() -> None:
    """§18.2.2: a connection's request is answered on it, a datagram's by UDP, though both
    come from one address; what a Via claims decides nothing. Our requests in a call go as
    its INVITE came."""
    core = uas()
    tcp = request("INVITE", body=SDP).replace(b"SIP/2.0/UDP", b"SIP/2.0/TCP")
    core.receive_datagram(tcp, TRUNK, 0.0, reliable=True)
    core.receive_datagram(request("OPTIONS", branch="z9hG4bKo"), TRUNK, 0.0)
    core.receive_datagram(request("OPTIONS", branch="z9hG4bKt"), TRUNK, 0.0, reliable=True)
    assert [reliable for _, _, reliable in core.datagrams_to_send()] == [True, False, True]
    # the connection's INVITE again, by UDP from its address: no answer (UDP forges it; it
    # had reflected a connection's answers, unpaced and unbounded in size)
    core.receive_datagram(tcp, TRUNK, 0.0)
    assert core.datagrams_to_send() == [] and core.counters["sip_not_dialog_peer"] == 1
    (offer,) = events(core)
    assert isinstance(offer, CallOffered)
    core.answer(offer.call, b"v=0\r\n", 0.1)
    core.receive_datagram(ack(offer.call), TRUNK, 0.2, reliable=True)
    core.hangup(offer.call, 1.0)
    assert [reliable for _, _, reliable in core.datagrams_to_send()] == [True, True]  # 200, BYE
    claimed = uas()  # a datagram whose Via says TCP: its call's requests still go by UDP
    claimed.receive_datagram(tcp, TRUNK, 0.0)
    (offer,) = events(claimed)
    assert isinstance(offer, CallOffered)
    claimed.answer(offer.call, b"v=0\r\n", 0.1)
    claimed.receive_datagram(ack(offer.call), TRUNK, 0.2)
    claimed.hangup(offer.call, 1.0)
    *_, (bye, _) = sent(claimed)  # (its Via says the transport it goes on)
    assert isinstance(bye, SipRequest) and (bye.get("via") or "").startswith("SIP/2.0/UDP ")
    again = [m for _, m in run_until(claimed, 1.0 + 1.5 * T1)]  # Timer E, as UDP needs
    assert [m.method for m in again if isinstance(m, SipRequest)] == ["BYE"], again


def timed_invite(expires: str, supported: bool = True) -> bytes:
    extra = [("Session-Expires", expires)]
    if supported:
        extra += [("Supported", "timer"), ("Require", "timer")]
    return request("INVITE", body=SDP, extra=tuple(extra))


def timed_call(core: SipUas, expires: str) -> tuple[CallOffered, SipResponse]:
    """A call offered with `Session-Expires: expires`, answered and acknowledged: the offer
    and our 2xx."""
    core.receive_datagram(timed_invite(expires), TRUNK, 0.0)
    (offer,) = events(core)
    assert isinstance(offer, CallOffered)
    sent(core)
    core.answer(offer.call, b"v=0\r\n", 0.0)
    ((ok, _),) = sent(core)
    assert isinstance(ok, SipResponse)
    core.receive_datagram(ack(offer.call), TRUNK, 0.1)
    events(core)
    return offer, ok


def test_session_timers_too_short_are_422() -> None:
    core = uas()
    core.receive_datagram(timed_invite("30"), TRUNK, 0.0)
    ((answer, _),) = sent(core)
    assert isinstance(answer, SipResponse) and answer.status == 422
    assert answer.get("min-se") == "90" and core.calls == 0


def test_a_session_the_trunk_does_not_refresh_ends_with_a_bye() -> None:
    """RFC 4028: we answer with the interval and who refreshes (the trunk, as it offered),
    require the extension it supports; no refresh before interval - min(32, interval/3):
    the call is over."""
    core = uas()
    offer, ok = timed_call(core, "120;refresher=uac")
    assert ok.get("session-expires") == "120;refresher=uac"
    assert ok.get("require") == "timer"
    # a refresh at 60 s (an UPDATE with no offer) moves the expiry to 60 + 88
    refresh = request("UPDATE", branch="z9hG4bKr1", cseq=2, to_tag=offer.call,
                      extra=(("Session-Expires", "120;refresher=uac"),))  # fmt: skip
    core.receive_datagram(refresh, TRUNK, 60.0)
    (reoffer,) = events(core)
    assert isinstance(reoffer, CallReoffered)
    core.answer(offer.call, b"", 60.0)
    ((refreshed, _),) = sent(core)
    assert isinstance(refreshed, SipResponse) and refreshed.status == 200 and refreshed.body == b""
    assert [m for _, m in run_until(core, 147.0) if isinstance(m, SipRequest)] == []
    byes = [(at, m) for at, m in run_until(core, 149.0) if isinstance(m, SipRequest)]
    assert {m.method for _, m in byes} == {"BYE"} and 147.0 < byes[0][0] <= 148.0
    assert events(core) == [CallEnded(offer.call, "session_expired")]


def test_when_the_trunk_asks_us_to_refresh_we_send_updates() -> None:
    core = uas()
    core.receive_datagram(timed_invite("100;refresher=uas"), TRUNK, 0.0)
    (offer,) = events(core)
    assert isinstance(offer, CallOffered)
    sent(core)
    core.answer(offer.call, b"v=0\r\n", 0.0)
    sent(core)
    core.receive_datagram(ack(offer.call), TRUNK, 0.1)
    updates = [(at, m) for at, m in run_until(core, 51.0) if isinstance(m, SipRequest)]
    assert {m.method for _, m in updates} == {"UPDATE"} and 50.0 <= updates[0][0] < 50.2
    assert updates[0][1].get("session-expires") == "100;refresher=uas"
    assert events(core) == [CallConfirmed(offer.call)]  # and the call goes on


def test_a_request_with_more_vias_than_a_path_has_is_not_answered() -> None:
    """Each comma-separated Via becomes a line of its own in an answer (§8.2.6.2): 7,700
    of them in 16 KB made a 62 KB 403 (and 742 KB with a trunk's retransmissions)."""
    core = uas()
    vias = ",".join(f"SIP/2.0/UDP 192.0.2.7:5062;branch=z9hG4bK{i}" for i in range(40))
    core.receive_datagram(request("OPTIONS", extra=(("Via", vias),)), TRUNK, 0.0)
    assert sent(core) == [] and core.counters["sip_too_many_hops"] == 1
    assert core.transactions == 0
    core.receive_datagram(request("OPTIONS", extra=(("Via", vias),)), STRANGER, 0.0)
    assert sent(core) == []  # (refused before it is checked: no 403 copying them either)
    assert core.counters["sip_too_many_hops"] == 2  # (the trunk's 400 was the one not sent)
    assert core.counters["sip_reply_not_sent"] == 1


def test_a_403_is_never_bigger_than_the_request_it_answers() -> None:
    core = uas()
    data = request("INVITE", body=SDP)
    core.receive_datagram(data, STRANGER, 0.0)
    ((answer, _),) = [(m, d) for m, d in sent(core)]
    assert isinstance(answer, SipResponse) and answer.status == 403
    assert len(answer.encode()) <= len(data)
    tiny = (
        b"OPTIONS sip:a@b SIP/2.0\r\nv: SIP/2.0/UDP h;branch=z9hG4bK1\r\nf: <sip:a@b>;tag=1\r\n"
        b"t: <sip:b@b>\r\ni: 1\r\nCSeq: 1 OPTIONS\r\n\r\n"
    )
    core.receive_datagram(tiny, STRANGER, 0.0)  # (compact forms: its 403 would be bigger)
    assert sent(core) == [] and core.counters["sip_forbidden_unanswered"] == 1


def test_a_trunks_request_whose_to_cannot_be_read_gets_its_400() -> None:
    """It raised out of the core before (a traceback a datagram, and no answer)."""
    core = uas()
    data = re.sub(rb"To: [^\r]*", b"To: garbage <<", request("OPTIONS"))
    core.receive_datagram(data, TRUNK, 0.0)
    assert statuses(core) == [400]


def test_a_session_interval_is_at_most_two_hours_and_refreshes_keep_few_timers() -> None:
    """A trunk asking for 999,999,999 s gets MAX_SE; a refresh every 0.2 s for 20 minutes
    (6,000 UPDATEs) leaves the timer heap a few entries a live item, not one a refresh."""
    core = uas()
    offer, ok = timed_call(core, "999999999;refresher=uac")
    assert ok.get("session-expires") == f"{MAX_SE};refresher=uac"
    most = 0
    for i in range(6000):
        now = 1.0 + i * 0.2
        refresh = request("UPDATE", branch=f"z9hG4bKr{i}", cseq=2 + i, to_tag=offer.call,
                          extra=(("Session-Expires", "999999999;refresher=uac"),))  # fmt: skip
        core.receive_datagram(refresh, TRUNK, now)
        events(core)
        core.answer(offer.call, b"", now)
        sent(core)
        if (at := core.get_timer()) is not None and at <= now:
            core.handle_timer(now)
        most = max(most, core.transactions + core.calls)
        assert len(core._heap) <= HEAP_SLACK * most + 64 + 1  # (7,602 before)
    assert core.calls == 1


NEIGHBOUR = ("192.0.2.9", 40000)  # another address of the trunk's 192.0.2.0/28

# A keepalive with no User-Agent nor Contact (221 bytes): its 200 fits only in compact form
SMALL_PING = (
    b"OPTIONS sip:198.51.100.1 SIP/2.0\r\n"
    b"Via: SIP/2.0/UDP 192.0.2.7:5062;branch=z9hG4bKa1;rport\r\n"
    b"From: <sip:ping@192.0.2.7>;tag=1\r\nTo: <sip:198.51.100.1>\r\n"
    b"Call-ID: abc123\r\nCSeq: 1 OPTIONS\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
)


def test_stateless_answers_shrink_to_fit_and_a_405_keeps_its_allow() -> None:
    """A helper's review (stop 44): the size bound had left a short keepalive unanswered
    and a 405 without the Allow §21.4.6 requires. An answer that must shrink takes the
    short reason phrase, then leaves optional fields out, then uses compact names."""
    core = uas()
    core.receive_datagram(SMALL_PING, TRUNK, 0.0)
    ((data, _, _),) = core.datagrams_to_send()
    assert data.startswith(b"SIP/2.0 200 OK\r\nv: ") and len(data) <= len(SMALL_PING)
    assert isinstance(ok := sip.parse_sip(data), SipResponse) and ok.get("call-id") == "abc123"
    register = request("REGISTER", branch="z9hG4bKreg")
    core.receive_datagram(register, TRUNK, 0.0)
    ((data, _, _),) = core.datagrams_to_send()
    answer = sip.parse_sip(data)
    assert isinstance(answer, SipResponse) and answer.status == 405 and answer.get("allow")
    assert len(data) <= len(register)


def test_a_forger_elsewhere_in_the_range_does_not_silence_the_trunks_answers() -> None:
    """Stateless answers are paced per source address: 6,000 forged OPTIONS in 12 s from
    another address of the trunk's range leave its real host's keepalives answered."""
    core = uas()
    answered = []
    for i in range(500 * 12):
        now = i / 500
        core.receive_datagram(request("OPTIONS", branch=f"z9hG4bKf{i}"), NEIGHBOUR, now)
        core.datagrams_to_send()
        if i % 1000 == 500:
            core.receive_datagram(request("OPTIONS", branch=f"z9hG4bKl{i}"), TRUNK, now)
            answered.append(any(dest == TRUNK for _, dest, _ in core.datagrams_to_send()))
    assert answered == [True] * 6 and core.counters["sip_replies_paced"] > 5000


def test_only_the_invites_address_acknowledges_its_non_2xx() -> None:
    core = uas()
    call = offered(core)
    sent(core)
    core.reject(call, 486, "Busy Here", 0.1)
    sent(core)
    core.receive_datagram(ack(call, branch="z9hG4bKb1"), ("192.0.2.8", 5060), 0.2)
    assert [m.status for _, m in run_until(core, 1.0)] == [486]  # type: ignore[union-attr]
    assert core.counters["sip_not_dialog_peer"] == 1


def test_a_reoffer_the_application_never_answers_is_refused_and_the_call_goes_on() -> None:
    """Found by the consistency property (stop 44): an unanswered re-INVITE's transaction
    had stayed for the whole call. By the trunk's Timer B it gets 500 and is forgotten."""
    core = uas()
    call = answered(core)
    core.receive_datagram(
        request("INVITE", branch="z9hG4bKre", cseq=2, to_tag=call, body=SDP), TRUNK, 1.0
    )
    assert isinstance(events(core)[0], CallReoffered) and statuses(core) == [100]
    out = run_until(core, 1.0 + TIMEOUT + 0.01)
    assert [m.status for _, m in out][:1] == [500]  # type: ignore[union-attr]
    assert core.counters["sip_reoffers_unanswered"] == 1
    run_until(core, 200.0)
    assert core.transactions == 0 and core.calls == 1 and not core.answer(call, b"v=0\r\n", 200.0)


def test_a_bye_after_we_hung_up_before_the_ack_ends_it_once() -> None:
    """A review (stop 44): the trunk's BYE on a call we had hung up before its ACK told the
    application a second CallEnded and counted a second end."""
    core = uas()
    call = hung_up_before_the_ack(core)
    core.receive_datagram(request("BYE", branch="z9hG4bKbye", cseq=2, to_tag=call), TRUNK, 0.2)
    assert statuses(core) == [200] and events(core) == []
    assert core.counters["sip_calls_ended_bye"] == 0 and core.calls == 0
    run_until(core, 100.0)
    assert sent(core) == [] and core.transactions == 0


def test_a_cancelled_reinvite_gets_its_487_and_the_call_goes_on() -> None:
    core = uas()
    call = answered(core)
    reinvite = request("INVITE", branch="z9hG4bKre", cseq=2, to_tag=call, body=SDP)
    core.receive_datagram(reinvite, TRUNK, 1.0)
    assert isinstance(events(core)[0], CallReoffered) and statuses(core) == [100]
    cancel = request("CANCEL", branch="z9hG4bKre", cseq=2, to_tag=call)
    core.receive_datagram(cancel, TRUNK, 1.1)
    assert sorted(statuses(core)) == [200, 487] and core.calls == 1 and events(core) == []
    assert not core.answer(call, b"v=0\r\n", 1.2)  # (too late: it was cancelled)


def test_a_cancel_of_a_ringing_call_is_taken_past_the_transaction_bounds() -> None:
    """A review (stop 44): at its source's transaction bound a CANCEL of a ringing call was
    dropped, and the call rang on. A CANCEL is bound by its INVITE's transaction."""
    core = uas(Limits(per_source=1))
    call = offered(core)
    sent(core)
    core.receive_datagram(request("CANCEL", cseq=1), TRUNK, 0.1)
    assert sorted(statuses(core)) == [200, 487] and events(core) == [CallEnded(call, "cancel")]


def test_a_connection_carrying_a_live_call_is_one_to_keep() -> None:
    """(The front keeps an idle connection open while it carries a call: our BYE goes on it.)"""
    core = uas()
    assert not core.carries_calls(TRUNK)
    call = answered(core)
    assert core.carries_calls(TRUNK) and not core.carries_calls(("192.0.2.7", 5999))
    core.receive_datagram(request("BYE", branch="z9hG4bKbye", cseq=2, to_tag=call), TRUNK, 1.0)
    assert not core.carries_calls(TRUNK)


def login_uas() -> SipUas:
    counter = itertools.count()
    return SipUas(
        trunks=[Trunk.of("pbx", ["192.0.2.0/28"], login=TrunkSecret("edge", "pw"))],
        contact="sip:firsthop@198.51.100.1:5060",
        token=lambda: f"t{next(counter)}",
        now=0.0,
    )


CHALLENGE = 'Digest realm="pbx.example", nonce="n1", algorithm=MD5, qop="auth"'


def challenged(request: SipRequest, status: int = 401, nonce: str = "n1") -> bytes:
    name = "WWW-Authenticate" if status == 401 else "Proxy-Authenticate"
    value = CHALLENGE.replace("n1", nonce)
    return sip.response_to(request, status, "Unauthorized", headers=[(name, value)]).encode()


def test_a_challenged_bye_is_sent_again_answering_with_the_trunks_login() -> None:
    """RFC 3261 §22.2: the same request, a new CSeq and branch, the Digest answer; a second
    challenge (a wrong login) is not answered again."""
    core = login_uas()
    call = answered(core)
    core.hangup(call, 1.0)
    bye = one_request(core)
    core.receive_datagram(challenged(bye), TRUNK, 1.1)
    again = one_request(core)
    assert again.method == "BYE"
    assert again.get("cseq") == "2 BYE" and again.vias()[0] != bye.vias()[0]
    credentials = sip_digest.parse_credentials(again.get("authorization") or "")
    assert (credentials.username, credentials.realm, credentials.uri) == (
        "edge",
        "pbx.example",
        bye.uri,
    )
    ha1 = sip_digest.hash_a1("MD5", "edge", "pbx.example", "pw")
    assert sip_digest.expected_response(ha1, "BYE", credentials) == credentials.response
    core.receive_datagram(challenged(again, nonce="n2"), TRUNK, 1.2)
    assert sent(core) == [] and core.counters["sip_challenges_unanswered"] == 1
    assert core.counters["sip_challenges_answered"] == 1


def test_a_proxy_challenged_refer_is_sent_again_and_its_notify_names_the_new_one() -> None:
    core = login_uas()
    call = answered(core)
    assert core.refer(call, "sip:desk@pbx.example", 1.0)
    refer = one_request(core)
    core.receive_datagram(challenged(refer, 407), TRUNK, 1.1)
    again = one_request(core)
    assert again.method == "REFER"
    assert again.get("refer-to") == "<sip:desk@pbx.example>" and again.get("cseq") == "2 REFER"
    assert (again.get("proxy-authorization") or "").startswith('Digest username="edge"')
    assert events(core) == []  # (the challenge is not the transfer's outcome)
    core.receive_datagram(sip.response_to(again, 202, "Accepted").encode(), TRUNK, 1.2)
    core.receive_datagram(notify(call, 2, b"SIP/2.0 200 OK\r\n", "refer;id=2"), TRUNK, 2.0)
    assert events(core) == [CallTransferred(call, 200)]


def test_without_a_login_a_challenge_is_the_requests_refusal() -> None:
    core = uas()
    call = answered(core)
    assert core.refer(call, "sip:desk@pbx.example", 1.0)
    refer = one_request(core)
    core.receive_datagram(challenged(refer), TRUNK, 1.1)
    assert sent(core) == [] and events(core) == [CallTransferred(call, 401)]
    assert core.counters["sip_challenges_unanswered"] == 1


def test_a_proxys_challenge_then_the_trunks_are_both_answered_once() -> None:
    """RFC 3261 §22.3: a proxy on the way asks (407), then the trunk (401): the request goes
    again with both answers; a second challenge of either kind is not answered."""
    core = login_uas()
    call = answered(core)
    core.hangup(call, 1.0)
    bye = one_request(core)
    core.receive_datagram(challenged(bye, 407), TRUNK, 1.1)
    second = one_request(core)
    assert second.get("authorization") is None
    core.receive_datagram(challenged(second, 401, nonce="n2"), TRUNK, 1.2)
    third = one_request(core)
    assert third.get("cseq") == "3 BYE"
    proxy = sip_digest.parse_credentials(third.get("proxy-authorization") or "")
    trunk = sip_digest.parse_credentials(third.get("authorization") or "")
    assert (proxy.nonce, trunk.nonce) == ("n1", "n2")
    assert len([k for k, _ in third.headers if k.endswith("authorization")]) == 2
    for status in (401, 407):  # (a wrong login: neither is answered again)
        core.receive_datagram(challenged(third, status, nonce="n3"), TRUNK, 1.3)
        assert sent(core) == []
    assert core.counters["sip_challenges_answered"] == 2
    assert core.counters["sip_challenges_unanswered"] == 1  # (the BYE's transaction ended)


def test_the_first_challenge_we_can_answer_is_answered_and_a_stale_one_once_more() -> None:
    core = login_uas()
    call = answered(core)
    core.hangup(call, 1.0)
    bye = one_request(core)
    offered = [
        ("WWW-Authenticate", 'Digest realm="pbx.example", nonce="n0", algorithm=SHA-512-256'),
        ("WWW-Authenticate", CHALLENGE),  # (RFC 8760 §2.4: the first we can answer)
    ]
    core.receive_datagram(
        sip.response_to(bye, 401, "Unauthorized", headers=offered).encode(), TRUNK, 1.1
    )
    again = one_request(core)
    assert 'nonce="n1"' in (again.get("authorization") or "")
    stale = sip.response_to(
        again, 401, "Unauthorized", headers=[("WWW-Authenticate", CHALLENGE + ", stale=true")]
    )
    core.receive_datagram(stale.encode(), TRUNK, 1.2)  # our nonce expired: once more
    third = one_request(core)
    assert third.get("cseq") == "3 BYE"
    assert len([v for k, v in third.headers if k == "authorization"]) == 1
    stale_again = sip.response_to(
        third, 401, "Unauthorized", headers=[("WWW-Authenticate", CHALLENGE + ", stale=true")]
    )
    core.receive_datagram(stale_again.encode(), TRUNK, 1.3)  # (not a third time)
    assert sent(core) == [] and core.counters["sip_challenges_answered"] == 2
    assert core.counters["sip_challenges_unanswered"] == 1


def test_a_challenged_request_no_longer_current_is_not_sent_again() -> None:
    core = login_uas()
    call = answered(core)
    assert core.refer(call, "sip:old@pbx.example", 1.0)
    assert core.refer(call, "sip:new@pbx.example", 1.1)
    (first, _), (second, _) = sent(core)
    assert isinstance(first, SipRequest) and isinstance(second, SipRequest)
    core.receive_datagram(challenged(first), TRUNK, 1.2)  # the app asked for another since
    assert sent(core) == [] and events(core) == []
    core.receive_datagram(request("BYE", branch="z9hG4bKbye", cseq=2, to_tag=call), TRUNK, 1.3)
    sent(core)
    core.receive_datagram(challenged(second), TRUNK, 1.4)  # the call has ended since
    assert sent(core) == [] and core.counters["sip_challenges_unanswered"] == 2
