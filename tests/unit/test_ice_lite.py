"""One session's ICE-lite agent, with a fake clock and no sockets."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from firsthop.services.transceiver.ice_lite import (
    LATCH_AFTER,
    MAX_PATHS,
    MAX_RECENT,
    MEDIA,
    MOVE_AFTER,
    NOMINATED,
    PROBE_INTERVAL,
    PROBE_TIMEOUT,
    SEEN_BITS,
    SILENT,
    Accepted,
    Credentials,
    LiteIce,
    PathValidated,
    Refused,
)
from firsthop.shared.wire import stun
from tests.support import binding_request

CREDS = Credentials("SERVERufrag", "server-password-24chars!", "cLnt", "client-password-22chrs")
CALLER = ("203.0.113.5", 5555)
ELSEWHERE = ("198.51.100.66", 6666)
T0 = 1000.0


def check(
    creds: Credentials = CREDS,
    *,
    nominate: bool = False,
    after_integrity: list[tuple[int, bytes]] | None = None,
    **kw: bytes,
) -> bytes:
    """The caller's check, as a browser sends it (with USE-CANDIDATE: `nominate`)."""
    return binding_request(
        kw.get("server", creds.local_ufrag.encode()),
        kw.get("client", creds.remote_ufrag.encode()),
        kw.get("pwd", creds.local_pwd.encode()),
        nominate=nominate,
        after_integrity=after_integrity,
    )


def proven(ice: LiteIce, at: float, client: tuple[str, int], *, nominate: bool = False) -> bool:
    """`client`, a new address of the caller's, checks and answers our validation: did the
    media move there?"""
    verdict = ice.on_request(at, client, check(nominate=nominate))
    assert isinstance(verdict, Accepted) and verdict.probe is not None
    outcome = ice.on_response(at, client, answer(verdict.probe))
    assert isinstance(outcome, PathValidated) and outcome.client == client
    return outcome.cause is not None


def counter_random() -> Callable[[int], bytes]:
    counter = itertools.count(1)
    return lambda n: next(counter).to_bytes(n, "big")


def agent() -> LiteIce:
    return LiteIce(CREDS, random=counter_random())


def answer(request: bytes, pwd: str = CREDS.remote_pwd, cls: int = stun.SUCCESS) -> bytes:
    """What the caller's full ICE agent answers to our check."""
    msg = stun.parse_stun(request)
    return stun.build_stun(
        stun.BINDING,
        cls,
        msg.transaction_id,
        [(stun.XOR_MAPPED_ADDRESS, stun.encode_xor_address("10.0.0.9", 3478, msg.transaction_id))],
        integrity_key=pwd.encode(),
        fingerprint=True,
    )


def test_the_first_authenticated_check_selects_the_path_and_refreshes_consent() -> None:
    ice = agent()
    assert ice.on_request(T0, CALLER, check()) == Accepted(selects=True)
    assert ice.selected == CALLER and ice.last_check == T0
    assert ice.on_request(T0 + 5, CALLER, check()) == Accepted(selects=False)
    assert ice.last_check == T0 + 5


def test_checks_that_do_not_authenticate_are_refused_and_change_nothing() -> None:
    ice = agent()
    forged = [
        check(pwd=b"not-the-password-at-all"),
        check(server=b"SOMEONEelse"),
        check(client=b"other"),
        stun.build_stun(
            stun.BINDING, stun.REQUEST, bytes(12), [(stun.USERNAME, b"SERVERufrag:cLnt")]
        ),
        stun.build_stun(stun.BINDING, stun.REQUEST, bytes(12)),
    ]
    corrupted = bytearray(check())
    corrupted[-1] ^= 1  # the FINGERPRINT no longer matches
    for data in [*forged, bytes(corrupted)]:
        assert ice.on_request(T0, CALLER, data) == Refused("stun_auth_fail"), data
    assert ice.on_request(T0, CALLER, b"\x00\x01garbage") == Refused("stun_malformed")
    indication = stun.build_stun(stun.BINDING, stun.INDICATION, bytes(12))
    assert ice.on_request(T0, CALLER, indication) == Refused("stun_unexpected")
    assert ice.selected is None and ice.last_check is None and ice.next_deadline() is None


def test_a_check_replayed_from_another_address_is_refused() -> None:
    ice = agent()
    captured = check()
    assert ice.on_request(T0, CALLER, captured) == Accepted(selects=True)
    assert ice.on_request(T0 + 1, CALLER, captured) == Accepted(selects=False)  # retransmit
    assert ice.on_request(T0 + 1, ELSEWHERE, captured) == Refused("stun_replay")
    # (a retransmission refreshes no consent: a replay of it would keep a dead path alive)
    assert ice.last_check == T0 and ice.probing() is None


def test_media_moves_only_after_the_new_address_answers_our_own_check() -> None:
    # the caller's NAT rebinds: its old address falls silent, its next check (aioice's
    # consent: no USE-CANDIDATE) comes from the new one, MOVE_AFTER or more later
    ice = agent()
    ice.on_request(T0, CALLER, check())
    T1 = T0 + MOVE_AFTER  # noqa: N806
    verdict = ice.on_request(T1, ELSEWHERE, check())
    assert isinstance(verdict, Accepted) and verdict.probe is not None
    assert ice.selected == CALLER and ice.probing() == ELSEWHERE
    probe = stun.parse_stun(verdict.probe)
    assert (probe.method, probe.cls) == (stun.BINDING, stun.REQUEST)
    assert probe.username == "cLnt:SERVERufrag"  # the caller's ufrag first: we ask it
    stun.verify_message_integrity(verdict.probe, probe, CREDS.remote_pwd.encode())
    stun.verify_fingerprint(verdict.probe, probe)
    assert probe.get(stun.ICE_CONTROLLED) is not None  # a lite agent is controlled
    # answers that do not prove anything move nothing
    assert ice.on_response(T1 + 0.1, CALLER, answer(verdict.probe)) == Refused("stun_unexpected")
    forged = answer(verdict.probe, pwd="guessed-password-xxxxxx")
    assert ice.on_response(T1 + 0.1, ELSEWHERE, forged) == Refused("stun_auth_fail")
    stale = answer(check())  # another transaction
    assert ice.on_response(T1 + 0.1, ELSEWHERE, stale) == Refused("stun_unexpected")
    assert ice.selected == CALLER
    assert ice.on_response(T1 + 0.1, ELSEWHERE, answer(verdict.probe)) == PathValidated(ELSEWHERE)
    assert ice.selected == ELSEWHERE and ice.probing() is None
    # the old path still counts as the caller's (no new validation if it checks again)
    assert ice.on_request(T1 + 1, CALLER, check()) == Accepted(selects=False)
    assert ice.selected == ELSEWHERE


def moved_by(ice: LiteIce, at: float, client: tuple[str, int], request: bytes | None) -> object:
    """`client` answers our check `request`: the outcome (PathValidated says whether, and
    why, the media moved there)."""
    assert request is not None
    return ice.on_response(at, client, answer(request))


def test_the_media_goes_where_the_caller_nominates_among_the_paths_it_proved() -> None:
    # A caller with two interfaces checks from both and sends its media from one, which it
    # nominates (libwebrtc, with a lite peer: USE-CANDIDATE on every check of its selected
    # connection). Its other interface proves itself too, and takes nothing.
    ice = agent()
    assert ice.on_request(T0, CALLER, check()) == Accepted(selects=True)
    assert not proven(ice, T0 + 0.1, ELSEWHERE)  # CALLER checked 0.1 s ago: it keeps the media
    assert ice.selected == CALLER
    assert ice.on_request(T0 + 0.6, ELSEWHERE, check()) == Accepted(selects=False)  # a spare
    # the caller nominates ELSEWHERE: our own check goes there, and its answer moves the media
    nominated = ice.on_request(T0 + 0.7, ELSEWHERE, check(nominate=True))
    assert isinstance(nominated, Accepted) and nominated.probe is not None
    assert ice.selected == CALLER  # not before it answers
    outcome = moved_by(ice, T0 + 0.71, ELSEWHERE, nominated.probe)
    assert outcome == PathValidated(ELSEWHERE, NOMINATED) and ice.selected == ELSEWHERE
    # each check of the selected connection nominates again: nothing is sent, nothing moves
    assert ice.on_request(T0 + 0.8, ELSEWHERE, check(nominate=True)) == Accepted(selects=False)
    # the caller moves its selected connection back (renomination): the media follows
    back = ice.on_request(T0 + 1.3, CALLER, check(nominate=True))
    assert isinstance(back, Accepted) and back.probe is not None
    assert moved_by(ice, T0 + 1.31, CALLER, back.probe) == PathValidated(CALLER, NOMINATED)
    assert ice.selected == CALLER
    # a new address nominated: proven and moved to by the one answer
    third = ("192.0.2.77", 7777)
    assert proven(ice, T0 + 2, third, nominate=True) and ice.selected == third


def test_no_replayed_check_moves_the_media_only_an_answer_to_our_check_does() -> None:
    ice = agent()
    ice.on_request(T0, CALLER, check())
    proven(ice, T0 + 0.1, ELSEWHERE)
    # the caller nominates ELSEWHERE (captured on the way), and later CALLER again
    captured = check(nominate=True)
    there = ice.on_request(T0 + 1, ELSEWHERE, captured)
    assert isinstance(there, Accepted) and there.probe is not None
    assert moved_by(ice, T0 + 1.01, ELSEWHERE, there.probe) == PathValidated(ELSEWHERE, NOMINATED)
    back = ice.on_request(T0 + 2, CALLER, check(nominate=True))
    assert isinstance(back, Accepted)
    assert moved_by(ice, T0 + 2.01, CALLER, back.probe) == PathValidated(CALLER, NOMINATED)
    # ELSEWHERE's interface is gone; the caller's own checks push the captured ID out of
    # the recent ones; sent again from ELSEWHERE, it is still known: refused, unanswered,
    # no check of ours goes there, no consent
    for i in range(MAX_RECENT + 1):
        ice.on_request(T0 + 3 + i * 0.001, CALLER, check())
    last = ice.last_check
    assert ice.on_request(T0 + 9, ELSEWHERE, captured) == Refused("stun_replay")
    assert ice.probing() is None and ice.last_check == last and ice.selected == CALLER
    # a retransmission (the same transaction again, from the same address, while recent) is
    # answered and does nothing else: no check of ours, no move, no consent
    again = check(nominate=True)
    first = ice.on_request(T0 + 10, ELSEWHERE, again)
    assert isinstance(first, Accepted) and first.probe is not None
    assert ice.on_request(T0 + 10.1, ELSEWHERE, again) == Accepted(selects=False)
    assert ice.last_check == T0 + 10
    # USE-CANDIDATE past MESSAGE-INTEGRITY is not the caller's word (RFC 8489 §14.5)
    ice.on_deadline(T0 + 10 + PROBE_TIMEOUT)
    ice.media_heard(T0 + 11.4)  # (the media path carries the caller's media: not silent)
    forged = check(after_integrity=[(stun.USE_CANDIDATE, b"")])
    assert ice.on_request(T0 + 11.5, ELSEWHERE, forged) == Accepted(selects=False)
    assert ice.selected == CALLER


def test_every_accepted_id_is_remembered_within_a_bound_and_rarely_mistaken() -> None:
    rng = random.Random(7)
    ice = agent()
    ids = [rng.randbytes(12) for _ in range(3000)]  # (two hours of libwebrtc's checks)
    mistaken = sum(not ice._first_sight(i) for i in ids)  # fresh ones taken for replays
    assert mistaken <= 20  # (about 6 expected: the filter fills as they come)
    assert not any(ice._first_sight(i) for i in ids)  # every one of them known again
    assert len(ice._seen) == SEEN_BITS // 8  # 4 KiB, however many
    later = sum(not ice._first_sight(rng.randbytes(12)) for _ in range(1000))
    assert later <= 40  # 1-2 % past 3,000 (measured: 11-18 in five seeds)
    ice.restart(CREDS)  # new credentials: the old checks no longer authenticate anyway
    assert ice._seen == bytearray(SEEN_BITS // 8)
    # a caller that counts its IDs (they differ in a few bits only) is told apart the same
    counted = sum(not ice._first_sight(n.to_bytes(4, "big") + bytes(8)) for n in range(3000))
    assert counted <= 20


def test_a_caller_back_on_an_address_it_proved_before_gets_the_media_back() -> None:
    # aioice (no nominations after the first): CALLER -> ELSEWHERE (a NAT rebinding) -> back
    ice = agent()
    ice.on_request(T0, CALLER, check())
    assert proven(ice, T0 + MOVE_AFTER, ELSEWHERE) and ice.selected == ELSEWHERE
    T1 = T0 + 2 * MOVE_AFTER + 1  # noqa: N806 (ELSEWHERE silent since T0 + MOVE_AFTER)
    verdict = ice.on_request(T1, CALLER, check())
    assert isinstance(verdict, Accepted) and verdict.probe is not None
    assert moved_by(ice, T1 + 0.01, CALLER, verdict.probe) == PathValidated(CALLER, SILENT)
    assert ice.selected == CALLER


def test_a_nomination_during_a_validation_lets_its_answer_move_the_media() -> None:
    ice = agent()
    ice.on_request(T0, CALLER, check())
    started = ice.on_request(T0 + 0.1, ELSEWHERE, check())  # (its first check: no nomination)
    assert isinstance(started, Accepted) and started.probe is not None
    again = ice.on_request(T0 + 0.15, ELSEWHERE, check(nominate=True))
    assert again == Accepted(selects=False, probe=None)  # one validation at a time
    outcome = ice.on_response(T0 + 0.2, ELSEWHERE, answer(started.probe))
    assert outcome == PathValidated(ELSEWHERE, NOMINATED) and ice.selected == ELSEWHERE


def test_a_later_nomination_elsewhere_cancels_the_move_an_earlier_one_asked_for() -> None:
    ice = agent()
    ice.on_request(T0, CALLER, check())
    started = ice.on_request(T0 + 0.1, ELSEWHERE, check(nominate=True))
    assert isinstance(started, Accepted) and started.probe is not None
    ice.on_request(T0 + 0.15, CALLER, check(nominate=True))  # the caller chose again
    outcome = ice.on_response(T0 + 0.2, ELSEWHERE, answer(started.probe))
    assert outcome == PathValidated(ELSEWHERE, None) and ice.selected == CALLER


def test_the_callers_authenticated_media_moves_the_path_once_the_path_falls_silent() -> None:
    # Chromium's interface in use goes down: it sends its media from its other (proven)
    # address at once, and nominates it 1-2 s later
    ice = agent()
    ice.on_request(T0, CALLER, check())
    assert not proven(ice, T0 + 0.1, ELSEWHERE)
    heard = T0 + 5.0  # the path's last authenticated media
    ice.media_heard(heard)
    # while the path still carries media, media from elsewhere asks for nothing
    assert ice.on_authentic_media(heard + LATCH_AFTER - 0.01, ELSEWHERE) is None
    request = ice.on_authentic_media(heard + LATCH_AFTER, ELSEWHERE)
    assert request is not None and ice.selected == CALLER  # our check first
    assert ice.on_authentic_media(heard + 0.3, ELSEWHERE) is None  # (one in flight)
    outcome = moved_by(ice, heard + 0.31, ELSEWHERE, request)
    assert outcome == PathValidated(ELSEWHERE, MEDIA) and ice.selected == ELSEWHERE
    assert ice.path_heard == heard + 0.31
    assert ice.on_authentic_media(heard + 1, ELSEWHERE) is None  # (it is the path now)
    # an address that has not proved it is the caller's asks for nothing, however silent
    assert ice.on_authentic_media(heard + 9, ("192.0.2.77", 7777)) is None


def test_a_path_is_silent_by_its_media_not_by_its_checks() -> None:
    # checks can be captured and sent again; the caller's SRTP cannot: a rebinding is told
    # by the old path's media stopping, whatever still comes there as checks
    ice = agent()
    ice.on_request(T0, CALLER, check())
    ice.media_heard(T0 + 10)
    verdict = ice.on_request(T0 + 12, ELSEWHERE, check())  # 2 s after the last media
    assert isinstance(verdict, Accepted)
    assert moved_by(ice, T0 + 12.01, ELSEWHERE, verdict.probe) == PathValidated(ELSEWHERE, None)
    for k in range(5):  # the old path's checks go on (from it, or replayed as if from it)
        ice.on_request(T0 + 12.5 + k, CALLER, check())
    later = ice.on_request(T0 + 13.5, ELSEWHERE, check())  # 3.5 s without media: silent
    assert isinstance(later, Accepted)
    assert moved_by(ice, T0 + 13.51, ELSEWHERE, later.probe) == PathValidated(ELSEWHERE, SILENT)


def test_an_error_answer_ends_the_validation() -> None:
    ice = agent()
    ice.on_request(T0, CALLER, check())
    verdict = ice.on_request(T0 + 1, ELSEWHERE, check())
    assert isinstance(verdict, Accepted) and verdict.probe is not None
    refused = answer(verdict.probe, cls=stun.ERROR)
    assert ice.on_response(T0 + 1.1, ELSEWHERE, refused) == Refused("path_validation_refused")
    assert ice.selected == CALLER and ice.probing() is None


def test_a_validation_is_sent_once_and_lapses_unanswered() -> None:
    ice = agent()
    ice.on_request(T0, CALLER, check())
    verdict = ice.on_request(T0, ELSEWHERE, check())
    assert isinstance(verdict, Accepted) and verdict.probe is not None
    assert ice.next_deadline() == T0 + PROBE_TIMEOUT
    assert ice.on_deadline(T0 + PROBE_TIMEOUT - 0.001) is None  # not due yet
    assert ice.on_deadline(T0 + PROBE_TIMEOUT) == Refused("path_validation_timeout")
    assert ice.next_deadline() is None and ice.probing() is None and ice.selected == CALLER
    # an answer that comes too late moves nothing; the next check starts a new validation
    assert ice.on_response(T0 + 2, ELSEWHERE, answer(verdict.probe)) == Refused("stun_unexpected")
    again = ice.on_request(T0 + 5, ELSEWHERE, check())
    assert isinstance(again, Accepted) and again.probe is not None and again.probe != verdict.probe


def test_validations_are_one_at_a_time_and_rate_limited() -> None:
    ice = agent()
    ice.on_request(T0, CALLER, check())
    first = ice.on_request(T0, ELSEWHERE, check())
    assert isinstance(first, Accepted) and first.probe is not None
    third = ("192.0.2.3", 3333)
    assert ice.on_request(T0, third, check()) == Accepted(selects=False, probe=None)
    validated = ice.on_response(T0 + 0.1, ELSEWHERE, answer(first.probe))
    assert validated == PathValidated(ELSEWHERE, None)  # CALLER checked just now
    assert ice.on_request(T0 + 0.2, third, check()) == Accepted(selects=False, probe=None)
    later = ice.on_request(T0 + PROBE_INTERVAL, third, check())
    assert isinstance(later, Accepted) and later.probe is not None


def test_paths_are_bounded_the_least_recently_checked_yields_never_the_selected() -> None:
    ice = agent()
    ice.on_request(T0, CALLER, check())
    others = [(f"198.18.0.{i}", 1000 + i) for i in range(1, MAX_PATHS + 3)]
    for i, addr in enumerate(others):
        ice.on_request(T0 + 1 + i, addr, check())
    assert len(ice._paths) == MAX_PATHS and CALLER in ice._paths
    assert ice.forgotten == others[:3]
    assert ice.selected == CALLER


def test_ice_restart_takes_new_credentials_and_refuses_the_old() -> None:
    ice = agent()
    ice.on_request(T0, CALLER, check())
    ice.on_request(T0, ELSEWHERE, check())
    new = Credentials("NEWserver", "new-server-password-24ch", "nclt", "new-client-password-22")
    ice.restart(new)
    assert ice.probing() is None and ice.selected == CALLER
    assert ice.on_request(T0 + 1, CALLER, check()) == Refused("stun_auth_fail")
    assert ice.on_request(T0 + 1, CALLER, check(new)) == Accepted(selects=False)
    verdict = ice.on_request(T0 + 2, ELSEWHERE, check(new))
    assert isinstance(verdict, Accepted) and verdict.probe is not None
    assert stun.parse_stun(verdict.probe).username == "nclt:NEWserver"


@given(st.binary(max_size=300), st.booleans())
def test_garbage_is_refused_never_raises(data: bytes, as_response: bool) -> None:
    ice = agent()
    ice.on_request(T0, CALLER, check())
    verdict = ice.on_request(T0, ELSEWHERE, check())
    assert isinstance(verdict, Accepted)
    if as_response:
        assert isinstance(ice.on_response(T0, ELSEWHERE, data), Refused)
    else:
        assert isinstance(ice.on_request(T0, ELSEWHERE, data), Refused)
    assert ice.selected == CALLER


def test_each_accepted_check_is_answered_signed_naming_its_source_and_smaller() -> None:
    """The one ICE agent answers what it accepts (RFC 8445 §7.3.1.1): XOR-MAPPED-ADDRESS
    of the check's source, MESSAGE-INTEGRITY with our password, FINGERPRINT; an answer
    never bigger than the question. A refused check gets nothing."""
    ice = agent()
    for source in (CALLER, ("2001:db8::5", 5555), ELSEWHERE):
        request = check()
        verdict = ice.on_request(T0, source, request)
        assert isinstance(verdict, Accepted)
        response = verdict.response
        msg = stun.parse_stun(response)
        assert (msg.method, msg.cls) == (stun.BINDING, stun.SUCCESS)
        assert msg.transaction_id == stun.parse_stun(request).transaction_id
        stun.verify_message_integrity(response, msg, stun.short_term_key(CREDS.local_pwd))
        stun.verify_fingerprint(response, msg)
        mapped = msg.get(stun.XOR_MAPPED_ADDRESS)
        assert mapped is not None
        assert stun.decode_xor_address(mapped, msg.transaction_id) == source
        assert len(response) < len(request)
    assert isinstance(ice.on_request(T0, CALLER, check(pwd=b"wrong-password-xxxxxxx")), Refused)
