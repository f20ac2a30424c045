"""The transceiver's session table: every lifecycle path, with a fake clock and no sockets."""

from __future__ import annotations

import itertools
from typing import TypedDict, Unpack

import pytest

from firsthop.services.transceiver.ice_lite import Credentials
from firsthop.services.transceiver.table import (
    LINGER,
    MAX_LINGERING,
    MAX_OLD_UFRAGS,
    SESSION_BURST,
    Command,
    Ended,
    PathChanged,
    Refusal,
    Send,
    SessionTable,
    ToMedia,
)
from firsthop.shared.wire import stun
from firsthop.shared.wire.proxy_v2 import build_proxy_v2, parse_proxy_v2, parse_tlvs, revocation_tlv
from tests.support import binding_request, rtp

T0 = 5000.0
RELAY = ("10.0.0.9", 40000)
INGRESS = ("198.51.100.1", 3478)
CALLER = ("203.0.113.5", 5555)
MOVED = ("203.0.113.5", 6666)  # the caller's NAT rebound


class Options(TypedDict, total=False):
    """What a test may set on a `SessionTable`, on top of deterministic credentials."""

    capacity: int
    accept_direct: bool
    setup_timeout: float
    consent_timeout: float
    media_timeout: float


def table(**options: Unpack[Options]) -> SessionTable[str]:
    n = itertools.count()
    return SessionTable(
        mint_ufrag=lambda: f"TOKEN{next(n):035d}",
        mint_password=lambda: f"password-{next(n):015d}",
        **options,
    )


def framed(payload: bytes, client: tuple[str, int] = CALLER) -> bytes:
    return build_proxy_v2(client, INGRESS) + payload


def check(creds: Credentials, *, nominate: bool = False) -> bytes:
    return binding_request(
        creds.local_ufrag.encode(),
        creds.remote_ufrag.encode(),
        creds.local_pwd.encode(),
        nominate=nominate,
    )


def opened(t: SessionTable[str], name: str = "s1", now: float = T0) -> Credentials:
    creds = t.credentials("cLnt", "client-password-22chrs")
    t.open(now, name, f"handle-{name}", creds)
    return creds


def test_admission_is_refused_while_draining_or_at_capacity() -> None:
    t = table(capacity=2)
    opened(t, "a")
    opened(t, "b")
    with pytest.raises(Refusal, match="capacity") as full:
        t.check_admission()
    assert full.value.status == 503
    assert t.end("a", "deleted") == Ended("handle-a", "deleted")
    t.remove("a")
    t.check_admission()  # room again
    t.drain(T0, 10)
    with pytest.raises(Refusal, match="draining"):
        opened(t, "c")


def test_a_session_that_never_connects_ends_at_its_setup_timeout() -> None:
    t = table(setup_timeout=30)
    opened(t, "slow")
    opened(t, "fast")
    t.connected(T0 + 0.2, "fast")
    assert t.next_deadline() == T0 + 30
    assert t.on_deadline(T0 + 29.99) == []
    assert t.on_deadline(T0 + 30) == [Ended("handle-slow", "setup_timeout")]
    assert t.on_deadline(T0 + 30.1) == []  # fired once
    t.remove("slow")
    assert t.ended == {"slow": "setup_timeout"} and t.counters["ended_setup_timeout"] == 1


def test_consent_is_refreshed_only_by_authenticated_checks() -> None:
    t = table(consent_timeout=30)
    creds = opened(t)
    assert t.on_datagram(T0 + 0.1, RELAY, framed(check(creds)))  # the first check
    t.connected(T0 + 0.2, "s1")
    assert t.on_datagram(T0 + 10, RELAY, framed(check(creds)))  # a consent check
    forged = binding_request(creds.local_ufrag.encode(), b"cLnt", b"wrong-password-x")
    for i in range(30):  # unauthenticated, every second, from the caller's own address
        assert t.on_datagram(T0 + 11 + i, RELAY, framed(forged)) == ()
    assert t.counters["stun_auth_fail"] == 30
    assert t.on_deadline(T0 + 30.2) == []  # armed at connect, refreshed since: re-armed
    assert t.on_deadline(T0 + 39.99) == []
    assert t.on_deadline(T0 + 40) == [Ended("handle-s1", "consent_expired")]


def test_a_drain_ends_what_is_left_when_its_grace_runs_out_and_remembers_who_was_told() -> None:
    t = table()
    opened(t, "a")
    opened(t, "b")
    t.connected(T0, "a")
    t.end("b", "deleted")  # already ending: not drained
    t.drain(T0 + 1, 3)
    assert t.on_deadline(T0 + 3.9) == []
    assert t.on_deadline(T0 + 4) == [Ended("handle-a", "drain")]
    for name in ("a", "b"):
        t.remove(name)
    assert t.ended == {"b": "deleted", "a": "drain"} and t.reasons_unread == 1
    t.reason_read("a")
    assert t.reasons_unread == 0


def test_ice_restart_routes_the_new_ufrag_and_only_the_new_credentials_authenticate() -> None:
    t = table()
    old = opened(t)
    t.on_datagram(T0, RELAY, framed(check(old)))
    new = t.restart_ice("s1", "nClt", "new-client-password-22")
    assert new.local_ufrag != old.local_ufrag and t.creds("s1") == new
    assert t.on_datagram(T0 + 1, RELAY, framed(check(old))) == ()  # routed, refused
    assert t.counters["stun_auth_fail"] == 1
    commands = t.on_datagram(T0 + 1, RELAY, framed(check(new)))
    assert [type(c) for c in commands] == [Send]  # answered (the path stays)
    answered(commands[0], new)
    # both ufrags are revoked at the relay when the session ends
    t.end("s1", "deleted")
    notices = t.remove("s1")
    tokens = {parse_tlvs(n.data, parse_proxy_v2(n.data))[0][1][1:] for n in notices}
    assert tokens == {old.local_ufrag.encode(), new.local_ufrag.encode()}
    assert all(n.dest == RELAY for n in notices)


def test_many_ice_restarts_keep_only_the_last_ufrags() -> None:
    t = table()
    first = opened(t)
    minted = [first] + [
        t.restart_ice("s1", f"c{i:03d}", f"client-password-{i:07d}") for i in range(50)
    ]
    routed = {u for u in (c.local_ufrag.encode() for c in minted) if u in t.mux.by_ufrag}
    assert len(routed) == 1 + MAX_OLD_UFRAGS  # the current one and the last two
    assert {c.local_ufrag.encode() for c in minted[-3:]} == routed
    t.end("s1", "deleted")
    assert len(t.remove("s1")) <= 1 + MAX_OLD_UFRAGS  # notices for those alone (one client)


def test_a_caller_flooding_its_own_session_is_held_to_its_budget() -> None:
    """An authenticated caller could have the shared thread decrypt and decode as much as it
    sent; now each session's media and checks are held to SESSION_RATE (burst SESSION_BURST),
    and another session's budget is its own."""
    t = table()
    creds = opened(t)
    t.on_datagram(T0, RELAY, framed(check(creds)))
    flood = [t.on_datagram(T0 + 1, RELAY, framed(rtp(i))) for i in range(5000)]
    passed = sum(1 for c in flood if c)
    assert passed == SESSION_BURST
    assert t.counters["session_rate_limited"] == 5000 - SESSION_BURST
    assert t.on_datagram(T0 + 1, RELAY, framed(check(creds))) == ()  # its checks too
    other = opened(t, "s2")
    other_check = t.on_datagram(T0 + 1, RELAY, framed(check(other), MOVED))
    assert [type(c) for c in other_check] == [Send, PathChanged]
    assert t.on_datagram(T0 + 1.5, RELAY, framed(rtp())) != ()  # refilled: audio goes on


def test_media_flows_only_from_validated_clients_and_moves_only_after_validation() -> None:
    t = table()
    creds = opened(t)
    assert t.on_datagram(T0, RELAY, framed(rtp())) == ()  # nothing before a check
    first = t.on_datagram(T0, RELAY, framed(check(creds)))
    assert [type(c) for c in first] == [Send, PathChanged]  # answered; DTLS may start
    answered(first[0], creds)
    assert first[1] == PathChanged("handle-s1", CALLER)
    assert t.on_datagram(T0, RELAY, framed(rtp())) == (ToMedia("handle-s1", rtp(), CALLER),)
    # the caller's NAT rebinds: its check from the new port is answered and validated
    moved = t.on_datagram(T0 + 5, RELAY, framed(check(creds), MOVED))
    assert [type(c) for c in moved] == [Send, Send]  # answered there, and probed
    answered(moved[0], creds, MOVED)
    probe = moved[1]
    assert isinstance(probe, Send) and probe.dest == RELAY
    assert t.on_datagram(T0 + 5, RELAY, framed(rtp(), MOVED)) == ()  # not yet
    assert t.selected("s1") == CALLER
    request = probe.data[parse_proxy_v2(probe.data).payload_offset :]
    answer = caller_answers(request, creds)
    assert t.on_datagram(T0 + 5.05, RELAY, framed(answer, MOVED)) == (
        PathChanged("handle-s1", MOVED),
    )
    assert t.selected("s1") == MOVED and t.counters["path_moved"] == 1
    assert t.on_datagram(T0 + 5.1, RELAY, framed(rtp(), MOVED)) == (
        ToMedia("handle-s1", rtp(), MOVED),
    )


def two_paths(t: SessionTable[str]) -> Credentials:
    """A session whose caller checked from CALLER (its media path) and then from MOVED,
    which answered our check while CALLER still checked: proven, kept aside."""
    creds = opened(t)
    t.on_datagram(T0, RELAY, framed(check(creds)))
    moved = t.on_datagram(T0 + 0.1, RELAY, framed(check(creds), MOVED))
    assert t.on_datagram(T0 + 0.15, RELAY, framed(our_check_answered(moved[1], creds), MOVED)) == ()
    assert t.selected("s1") == CALLER and t.counters["path_validated_kept"] == 1
    return creds


def our_check_answered(probe: object, creds: Credentials) -> bytes:
    """The caller's answer to our check `probe` (a `Send` through the relay)."""
    assert isinstance(probe, Send)
    return caller_answers(probe.data[parse_proxy_v2(probe.data).payload_offset :], creds)


def test_media_follows_the_callers_nomination_among_the_paths_it_proved() -> None:
    # The caller's second interface (MOVED) proves itself while the first still checks:
    # the media stays; the caller nominates the second (libwebrtc, with a lite peer:
    # USE-CANDIDATE on its selected connection's checks): once MOVED answers our check,
    # what we send goes there.
    t = table()
    creds = two_paths(t)
    # its media is taken from both (each is the caller's; MOVED's is not the path's)
    assert t.on_datagram(T0 + 0.2, RELAY, framed(rtp(), MOVED)) == (
        ToMedia("handle-s1", rtp(), MOVED, elsewhere=True),
    )
    nominated = t.on_datagram(T0 + 1, RELAY, framed(check(creds, nominate=True), MOVED))
    assert [type(c) for c in nominated] == [Send, Send]  # answered, and our check
    assert t.selected("s1") == CALLER
    answer = our_check_answered(nominated[1], creds)
    assert t.on_datagram(T0 + 1.01, RELAY, framed(answer, MOVED)) == (
        PathChanged("handle-s1", MOVED),
    )
    assert t.selected("s1") == MOVED
    assert t.counters["path_moved"] == 1 and t.counters["path_moved_nominated"] == 1
    # the selected path's own nominations (every check of libwebrtc's) move nothing
    again = t.on_datagram(T0 + 2, RELAY, framed(check(creds, nominate=True), MOVED))
    assert [type(c) for c in again] == [Send] and t.counters["path_moved"] == 1


def test_authenticated_media_from_a_proven_address_moves_the_path_once_it_is_silent() -> None:
    t = table()
    creds = two_paths(t)
    # media from the path is the path's; from the other proven address, `elsewhere`
    assert t.on_datagram(T0 + 1, RELAY, framed(rtp())) == (ToMedia("handle-s1", rtp(), CALLER),)
    elsewhere = t.on_datagram(T0 + 1.1, RELAY, framed(rtp(), MOVED))
    assert elsewhere == (ToMedia("handle-s1", rtp(), MOVED, elsewhere=True),)
    t.media_heard(T0 + 1, "s1")  # (the service: that datagram authenticated)
    # it authenticated, but the path carried media 0.1 s ago: nothing is asked
    assert t.media_authenticated(T0 + 1.1, "s1", MOVED) == ()
    # the path falls silent, the caller's media goes on from MOVED: our check goes there,
    # and its answer moves the path
    latched = t.media_authenticated(T0 + 1.5, "s1", MOVED)
    assert len(latched) == 1 and t.selected("s1") == CALLER
    answer = our_check_answered(latched[0], creds)
    assert t.on_datagram(T0 + 1.51, RELAY, framed(answer, MOVED)) == (
        PathChanged("handle-s1", MOVED),
    )
    assert t.selected("s1") == MOVED and t.counters["path_moved_media"] == 1
    assert t.on_datagram(T0 + 1.6, RELAY, framed(rtp(), MOVED)) == (
        ToMedia("handle-s1", rtp(), MOVED),
    )
    assert t.media_authenticated(T0 + 2, "gone", MOVED) == ()  # (a session that ended)


def test_an_unanswered_validation_lapses_on_its_deadline() -> None:
    t = table()
    creds = opened(t)
    t.on_datagram(T0, RELAY, framed(check(creds)))
    t.on_datagram(T0 + 1, RELAY, framed(check(creds), MOVED))
    assert t.mux.probing
    assert t.next_deadline() == T0 + 1 + 1.0  # before the 30 s setup timeout
    assert t.on_deadline(T0 + 2) == []
    assert t.counters["path_validation_timeout"] == 1 and not t.mux.probing
    assert t.selected("s1") == CALLER


def test_a_check_for_a_ufrag_nobody_holds_gets_its_relay_a_revocation_once_a_second() -> None:
    t = table()
    gone = b"AQEAAQQKAAABE4xrSdIAZOFZ9HR8rmRJPUejIrUM"
    request = framed(binding_request(gone))
    (notice,) = t.on_datagram(T0, RELAY, request)
    assert isinstance(notice, Send) and notice.dest == RELAY
    assert notice.data == build_proxy_v2(INGRESS, CALLER, revocation_tlv(gone))
    assert t.on_datagram(T0 + 0.5, RELAY, request) == ()
    assert len(t.on_datagram(T0 + 1.0, RELAY, request)) == 1
    direct = table(accept_direct=True)
    assert direct.on_datagram(T0, CALLER, binding_request(gone)) == ()  # no relay to tell


def test_why_sessions_ended_is_remembered_within_a_bound() -> None:
    t = table(capacity=20_000)
    for i in range(10_005):
        opened(t, f"s{i}")
        t.end(f"s{i}", "deleted")
        t.remove(f"s{i}")
    assert len(t.ended) == 10_000 and "s0" not in t.ended and "s10004" in t.ended


def answered(
    command: Command[str], creds: Credentials, client: tuple[str, int] = CALLER
) -> stun.StunMessage:
    """`command` carries our signed success response to `client`'s check, through the relay,
    naming the address it came from (RFC 8445 §7.3.1.1): the table is the one ICE agent."""
    assert isinstance(command, Send) and command.dest == RELAY
    header = parse_proxy_v2(command.data)
    assert (header.src, header.dst) == (INGRESS, client)
    response = command.data[header.payload_offset :]
    msg = stun.parse_stun(response)
    assert (msg.method, msg.cls) == (stun.BINDING, stun.SUCCESS)
    stun.verify_message_integrity(response, msg, stun.short_term_key(creds.local_pwd))
    stun.verify_fingerprint(response, msg)
    mapped = msg.get(stun.XOR_MAPPED_ADDRESS)
    assert mapped is not None
    assert stun.decode_xor_address(mapped, msg.transaction_id) == client
    return msg


def caller_answers(request: bytes, creds: Credentials) -> bytes:
    msg = stun.parse_stun(request)
    return stun.build_stun(
        stun.BINDING,
        stun.SUCCESS,
        msg.transaction_id,
        integrity_key=creds.remote_pwd.encode(),
        fingerprint=True,
    )


def test_an_ice_tcp_caller_is_counted_and_told_apart_in_every_frame_back() -> None:
    # The relay marks a caller that came over ICE-TCP (PROXY v2 STREAM): the session's first
    # path selected over it is counted, and revocation notices name the caller the same way.
    t = table()
    creds = opened(t)
    tcp = build_proxy_v2(CALLER, INGRESS, stream=True)
    commands = t.on_datagram(T0, RELAY, tcp + check(creds))
    assert [type(c) for c in commands] == [Send, PathChanged]
    assert t.counters["ice_tcp_path_selected"] == 1
    framed_back = t.frame_for(CALLER, b"answer")
    assert framed_back is not None and parse_proxy_v2(framed_back.data).stream
    gone = b"AQEAAQQKAAABE4xrSdIAZOFZ9HR8rmRJPUejIrUM"
    (notice,) = t.on_datagram(T0, RELAY, tcp + binding_request(gone))
    assert isinstance(notice, Send)
    assert notice.data == build_proxy_v2(INGRESS, CALLER, revocation_tlv(gone), stream=True)


def test_an_ended_calls_checks_are_told_so_signed_then_its_relays_are_told() -> None:
    """After a connected call ends, its caller's authenticated checks get a 403 signed with
    our password (a browser drops the pair at once), its media reaches nothing, forged
    checks get nothing; after `LINGER` the relays get TOKEN_REVOKED."""
    t = table()
    creds = opened(t)
    t.on_datagram(T0, RELAY, framed(check(creds)))
    t.connected(T0 + 0.1, "s1")
    t.end("s1", "hangup")
    assert t.remove("s1", T0 + 1) == ()  # it lingers: nothing revoked yet
    assert t.on_datagram(T0 + 1.1, RELAY, framed(rtp())) == ()  # no media to anyone
    request = check(creds)
    (answer,) = t.on_datagram(T0 + 1.2, RELAY, framed(request))
    assert isinstance(answer, Send) and answer.dest == RELAY
    header = parse_proxy_v2(answer.data)
    assert (header.src, header.dst, header.stream) == (INGRESS, CALLER, False)
    body = answer.data[header.payload_offset :]
    msg = stun.parse_stun(body)
    assert (msg.method, msg.cls) == (stun.BINDING, stun.ERROR)
    # a caller that came over ICE-TCP is answered marked so (the relay finds its connection)
    tcp = build_proxy_v2(CALLER, INGRESS, stream=True) + check(creds)
    (over_tcp,) = t.on_datagram(T0 + 1.25, RELAY, tcp)
    assert isinstance(over_tcp, Send) and parse_proxy_v2(over_tcp.data).stream
    assert msg.transaction_id == stun.parse_stun(request).transaction_id
    error = msg.get(stun.ERROR_CODE)
    assert error is not None and error[2:4] == bytes([4, 3]) and error[4:] == b"call ended"
    stun.verify_message_integrity(body, msg, creds.local_pwd.encode())
    stun.verify_fingerprint(body, msg)
    assert len(body) < len(request)  # never an answer bigger than the question
    forged = binding_request(creds.local_ufrag.encode(), b"cLnt", b"w" * 22)
    assert t.on_datagram(T0 + 1.3, RELAY, framed(forged)) == ()
    assert t.counters["ended_checks_answered"] == 2 and t.counters["stun_auth_fail"] == 1
    assert t.next_deadline() == T0 + 1 + LINGER
    notices = t.on_deadline(T0 + 1 + LINGER)
    assert [n.data for n in notices if isinstance(n, Send)] == [
        build_proxy_v2(INGRESS, CALLER, revocation_tlv(creds.local_ufrag.encode()))
    ]
    # after that, a check is a ufrag nobody holds: its relay is told again, not answered
    (again,) = t.on_datagram(T0 + 10, RELAY, framed(check(creds)))
    assert isinstance(again, Send) and parse_tlvs(again.data, parse_proxy_v2(again.data))


def test_a_call_that_never_connected_or_ends_in_a_drain_is_revoked_at_once() -> None:
    t = table()
    opened(t, "never")
    t.end("never", "setup_timeout")
    assert not t.remove("never", T0 + 30)  # no relay ever carried it: nothing to tell
    assert not t.mux.by_ufrag
    creds = opened(t, "drained")
    t.on_datagram(T0, RELAY, framed(check(creds)))
    t.connected(T0, "drained")
    t.drain(T0, grace=0)
    t.on_deadline(T0)
    assert len(t.remove("drained", T0 + 1)) == 1 and not t.mux.by_ufrag


def test_lingering_calls_are_bounded() -> None:
    t = table(capacity=20_000)
    revoked = 0
    for i in range(MAX_LINGERING + 3):
        creds = opened(t, f"s{i}")
        t.on_datagram(T0, RELAY, framed(check(creds)))
        t.connected(T0, f"s{i}")
        t.end(f"s{i}", "hangup")
        revoked += len(t.remove(f"s{i}", T0 + 1))
    assert revoked == 3  # the oldest three, told at once
    assert len(t.mux.by_ufrag) == MAX_LINGERING


def test_no_more_calls_linger_than_the_table_holds() -> None:
    t = table(capacity=5)
    revoked = 0
    for i in range(8):
        creds = opened(t, f"s{i}")
        t.on_datagram(T0, RELAY, framed(check(creds)))
        t.connected(T0, f"s{i}")
        t.end(f"s{i}", "hangup")
        revoked += len(t.remove(f"s{i}", T0 + 1))
    assert revoked == 3 and len(t.mux.by_ufrag) == 5


# -- phone calls: pinned, no ICE -------------------------------------------------------------


def test_a_phone_call_hears_only_its_pinned_address_and_answers_through_its_relay() -> None:
    t = table()
    creds = t.credentials("-", "-")
    t.open_pinned(T0, "s1", "phone", creds, CALLER)
    assert t.selected("s1") == CALLER  # its path from the start
    assert t.on_datagram(T0, RELAY, framed(rtp(), MOVED)) == ()  # another address: nothing
    assert t.mux.drops["unvalidated"] == 1
    (media,) = t.on_datagram(T0, RELAY, framed(rtp()))
    assert isinstance(media, ToMedia) and media.handle == "phone" and media.client == CALLER
    answer = t.frame_for(CALLER, b"\x80rtp")  # back the way it came: framed to its relay
    assert answer is not None and answer.dest == RELAY
    assert parse_proxy_v2(answer.data).dst == CALLER
    # its token routes (the relays are told of it at its end), but nobody can check it
    assert (
        t.on_datagram(
            T0, RELAY, framed(binding_request(creds.local_ufrag.encode(), b"x", b"guess"))
        )
        == ()
    )
    (notice,) = t.remove("s1")
    assert notice.data == build_proxy_v2(
        INGRESS, CALLER, revocation_tlv(creds.local_ufrag.encode())
    )


def test_a_phone_call_lives_while_its_media_comes() -> None:
    t = table(media_timeout=60.0)
    t.open_pinned(T0, "s1", "phone", t.credentials("-", "-"), CALLER)
    assert len(t.on_datagram(T0 + 50, RELAY, framed(rtp()))) == 1
    assert t.on_deadline(T0 + 60) == []  # media came at +50: it lives till +110
    assert t.on_deadline(T0 + 109.9) == []
    assert t.on_deadline(T0 + 110.1) == [Ended("phone", "media_timeout")]


def test_phone_calls_count_against_capacity_and_drain() -> None:
    t = table(capacity=1)
    t.open_pinned(T0, "s1", "phone", t.credentials("-", "-"), CALLER)
    with pytest.raises(Refusal):
        t.open_pinned(T0, "s2", "phone", t.credentials("-", "-"), MOVED)
