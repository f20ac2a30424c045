"""A trunk with a password (`Trunk.secret`): the SIP UAS core challenges each INVITE that
starts a call and rings only the one that answers, statelessly, paced and never bigger than
the request (a forged source must not turn the edge into a reflector toward the trunk)."""

from __future__ import annotations

import itertools
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from firsthop.services.sip.trunk_auth import NONCE_TTL, TrunkSecret
from firsthop.services.sip.uas import AUTH_BURST, CallOffered, SipUas, Trunk
from firsthop.shared.wire import sip
from firsthop.shared.wire.sip import SipResponse

from .test_sip_digest import answer
from .test_sip_uas import SDP, TRUNK, events, request, sent

URI = "sip:echo@198.51.100.1"  # (what `request` puts on the request line)
WALL = 1_800_000_000.0


def uas() -> SipUas:
    counter = itertools.count()
    return SipUas(
        trunks=[
            Trunk.of("pbx", ["192.0.2.0/28"], TrunkSecret("pbx-user", "s3cret")),
            Trunk.of("open", ["198.51.100.0/28"]),
        ],
        contact="sip:firsthop@198.51.100.1:5060",
        token=lambda: f"t{next(counter)}",
        now=0.0,
        wall_offset=WALL,
        auth_algorithms=("SHA-256", "MD5"),
    )


# An offer of the size user agents send (baresip's: several codecs, its rtcp and ptime lines)
OFFER = SDP + b"".join(b"a=rtpmap:%d codec%d/8000\r\n" % (i, i) for i in range(96, 106))


def invite(
    branch: str, cseq: int = 1, authorization: str | None = None, body: bytes = OFFER
) -> bytes:
    extra = (("Authorization", authorization),) if authorization else ()
    return request("INVITE", branch=branch, cseq=cseq, body=body, extra=extra)


def challenged(core: SipUas, now: float = 0.0, branch: str = "z9hG4bKa") -> list[str]:
    core.receive_datagram(invite(branch), TRUNK, now)
    ((response, dest),) = sent(core)
    assert isinstance(response, SipResponse) and response.status == 401 and dest == TRUNK
    # (each value holds commas: read as fields, not split as a list)
    return [value for name, value in response.headers if name == "www-authenticate"]


def test_an_invite_is_challenged_statelessly_and_rings_once_answered() -> None:
    core = uas()
    sha256, md5 = challenged(core)
    assert "algorithm=SHA-256" in sha256 and "algorithm=MD5" in md5
    assert core.transactions == 0 and core.calls == 0 and events(core) == []
    # its ACK (same branch as the challenged INVITE) matches nothing and is a counted drop
    core.receive_datagram(request("ACK", to_tag="t0", cseq_method="ACK"), TRUNK, 0.01)
    assert sent(core) == [] and core.counters["sip_ack_unmatched"] == 1
    # sent again with the answer (a new transaction, CSeq + 1, §22.2): it rings
    core.receive_datagram(invite("z9hG4bKb", 2, answer(md5)), TRUNK, 0.05)
    (event,) = events(core)
    assert isinstance(event, CallOffered) and event.trunk == "pbx"
    assert [m.status for m, _ in sent(core)] == [100]  # type: ignore[union-attr]
    # its retransmission is the transaction's (not a replay of the nonce)
    core.receive_datagram(invite("z9hG4bKb", 2, answer(md5)), TRUNK, 0.5)
    assert [m.status for m, _ in sent(core)] == [100]  # type: ignore[union-attr]
    assert core.counters["sip_auth_challenged"] == 1 and core.counters["sip_auth_ok"] == 1
    # the nonce on a new INVITE (whichever algorithm): a replay, challenged again
    core.receive_datagram(invite("z9hG4bKc", 3, answer(sha256)), TRUNK, 0.6)
    assert [m.status for m, _ in sent(core)] == [401]  # type: ignore[union-attr]
    assert core.counters["sip_auth_replayed"] == 1 and core.calls == 1
    # a fresh challenge answered with SHA-256: a second call
    sha256, _ = challenged(core, 0.7, "z9hG4bKd")
    core.receive_datagram(invite("z9hG4bKe", 5, answer(sha256)), TRUNK, 0.8)
    assert isinstance(events(core)[0], CallOffered) and core.calls == 2


def test_wrong_password_is_403_stale_nonce_401_stale_and_other_trunks_are_not_asked() -> None:
    core = uas()
    (sha256, _) = challenged(core)
    core.receive_datagram(invite("z9hG4bKb", 2, answer(sha256, password="guess")), TRUNK, 0.1)
    assert [m.status for m, _ in sent(core)] == [403]  # type: ignore[union-attr]
    later = NONCE_TTL + 1
    core.receive_datagram(invite("z9hG4bKc", 3, answer(sha256)), TRUNK, later)
    ((response, _),) = sent(core)
    assert isinstance(response, SipResponse) and response.status == 401
    assert "stale=true" in (response.get("www-authenticate") or "")
    core.receive_datagram(invite("z9hG4bKd", 4, "Digest broken"), TRUNK, later)
    assert [m.status for m, _ in sent(core)] == [400]  # type: ignore[union-attr]
    assert events(core) == [] and core.calls == 0 and core.transactions == 0
    assert core.counters["sip_auth_failed"] == 1 and core.counters["sip_auth_stale"] == 1
    # a trunk without a password is admitted on its address alone; OPTIONS is never asked
    core.receive_datagram(invite("z9hG4bKe"), ("198.51.100.3", 5060), later)
    assert isinstance(events(core)[0], CallOffered)
    core.receive_datagram(request("OPTIONS", branch="z9hG4bKf"), TRUNK, later)
    assert [m.status for m, _ in sent(core)] == [100, 200]  # type: ignore[union-attr]


def test_a_forged_flood_gets_bounded_answers_no_bigger_than_itself_and_leaves_no_state() -> None:
    core = uas()
    sizes = []
    forged = [  # no answer, one that cannot be read, one with a nonce of its own making
        None,
        "Digest x",
        'Digest username="u", realm="pbx", nonce="1.01234567.0123456789abcdef", uri="sip:a", '
        'response="0"',
    ]
    for i in range(500):
        data = invite(f"z9hG4bK{i}", authorization=forged[i % 3])
        sizes.append(len(data))
        core.receive_datagram(data, TRUNK, i * 0.001)  # 500 in half a second
    out = core.datagrams_to_send()
    assert 0 < len(out) <= AUTH_BURST + 50 * 0.5 + 1
    assert all(len(data) <= min(sizes) for data, _, _ in out)
    assert core.counters["sip_auth_unanswered"] == 500 - len(out)
    assert (
        core.counters["sip_auth_challenged"] == 333 and core.counters["sip_auth_malformed"] == 167
    )
    assert core.transactions == 0 and core.calls == 0 and events(core) == []
    assert len(core.auth._used) == 0
    # an INVITE too small to carry a challenge gets none (it would be bigger than it)
    tiny = sip.request(
        "INVITE",
        URI,
        [
            ("Via", "SIP/2.0/UDP 192.0.2.7;branch=z9hG4bKt"),
            ("From", "<sip:a@b>;tag=x"),
            ("To", "<sip:e@c>"),
            ("Call-ID", "c"),
            ("CSeq", "1 INVITE"),
            ("Max-Forwards", "70"),
        ],
        b"",
    ).encode()
    core.receive_datagram(tiny, TRUNK, 100.0)
    assert sent(core) == [] and re.search(rb"Content-Length", tiny)
    # one whose answer has room for the preferred challenge alone gets that one
    core.receive_datagram(invite("z9hG4bKs", body=SDP), TRUNK, 200.0)
    ((response, _),) = sent(core)
    assert isinstance(response, SipResponse) and response.status == 401
    ((name, value),) = [(n, v) for n, v in response.headers if n == "www-authenticate"]
    assert "algorithm=SHA-256" in value


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_no_authorization_header_raises(value: str) -> None:
    core = uas()
    value = value.replace("\r", " ").replace("\n", " ")
    core.receive_datagram(invite("z9hG4bKh", authorization=value or None), TRUNK, 0.0)
    core.datagrams_to_send()
    assert core.calls == 0


def test_the_webhook_is_not_given_a_trunks_digest_answer() -> None:
    from firsthop.services.signaling.sip import webhook_headers

    request = sip.parse_sip(invite("z9hG4bKw", authorization='Digest username="u", response="x"'))
    assert isinstance(request, sip.SipRequest)
    names = {h["name"].lower() for h in webhook_headers(request)}
    assert "authorization" not in names and {"from", "to", "call-id"} <= names


def test_a_forger_spending_one_addresss_challenges_does_not_silence_anothers() -> None:
    """Challenges are paced per source address: another address of the same trunk's range,
    or of another trunk's, is still challenged (what forges the trunk's own address can only
    spend that address's budget)."""
    core = SipUas(
        trunks=[
            Trunk.of("pbx", ["192.0.2.0/28"], TrunkSecret("pbx-user", "s3cret")),
            Trunk.of("other", ["198.51.100.0/28"], TrunkSecret("other-user", "pa55")),
        ],
        contact="sip:firsthop@198.51.100.1:5060",
        token=lambda: "t",
        now=0.0,
        wall_offset=WALL,
    )
    for i in range(300):
        core.receive_datagram(invite(f"z9hG4bK{i}"), TRUNK, 0.0)
    assert len(core.datagrams_to_send()) == AUTH_BURST
    for other in (("192.0.2.9", 5060), ("198.51.100.3", 5060)):
        core.receive_datagram(invite("z9hG4bKo"), other, 0.0)
        ((response, _),) = sent(core)
        assert isinstance(response, SipResponse) and response.status == 401


def test_a_forger_of_the_trunks_address_leaves_no_state_and_no_bigger_answers() -> None:
    """Whatever it sends (pings, requests of dialogs that do not exist, out-of-dialog
    requests, methods nobody serves, requests that cannot be served), a host forging a
    protected trunk's address over UDP gets no transaction, no call, answers no bigger than
    what it sent and at most a trunk's budget of them; the trunk's own calls still work."""
    core = uas()
    short = [
        request("OPTIONS", branch="z9hG4bKx"),
        request("INVITE", branch="z9hG4bKx", to_tag="nodialog", body=SDP),
        request("BYE", branch="z9hG4bKx"),
        request("BYE", branch="z9hG4bKx", to_tag="nodialog"),
        request("CANCEL", branch="z9hG4bKx"),
        request("MESSAGE", branch="z9hG4bKx"),
        request("FOO", branch="z9hG4bKx"),
        request("OPTIONS", branch="z9hG4bKx").replace(b"Max-Forwards: 70", b"Max-Forwards: 0"),
        request("OPTIONS", branch="z9hG4bKx").replace(b"CSeq: 1 OPTIONS", b"CSeq: 1 INVITE"),
    ]
    answers = 0
    for i in range(2000):
        data = short[i % len(short)].replace(b"z9hG4bKx", f"z9hG4bK{i}".encode())
        core.receive_datagram(data, TRUNK, i * 0.0005)  # 2,000 in one second
        for out, _, _ in core.datagrams_to_send():
            answers += 1
            assert len(out) <= len(data), (data, out)
    assert core.transactions == 0 and core.calls == 0 and events(core) == []
    assert answers <= 100 + 50 * 1.0 + 1 and core.counters["sip_replies_paced"] >= 1800
    # the trunk itself, meanwhile: challenged (its own budget), and its call rings
    _, md5 = challenged(core, 1.0, "z9hG4bKreal")
    core.receive_datagram(invite("z9hG4bKreal2", 2, answer(md5)), TRUNK, 1.01)
    assert isinstance(events(core)[0], CallOffered)


def test_over_a_connection_stateless_answers_are_neither_paced_nor_bound_to_size() -> None:
    core = uas()
    for i in range(300):
        core.receive_datagram(request("OPTIONS", branch=f"z9hG4bK{i}"), TRUNK, 0.0, reliable=True)
    out = sent(core)
    assert len(out) == 300 and all(m.status == 200 for m, _ in out)  # type: ignore[union-attr]
    assert all(m.get("accept") == "application/sdp" for m, _ in out)
    assert core.transactions == 0


def test_a_request_answered_statelessly_gets_the_same_to_tag_each_time() -> None:
    core = uas()
    for _ in range(2):
        core.receive_datagram(invite("z9hG4bKsame"), TRUNK, 0.0)
        core.receive_datagram(request("OPTIONS", branch="z9hG4bKping"), TRUNK, 0.0)
    tags = [sip.parse_name_addr(m.get("to") or "").tag for m, _ in sent(core)]
    assert len(tags) == 4 and tags[0] == tags[2] and tags[1] == tags[3] and tags[0] != tags[1]
