"""Trickle at signaling, pure: sdpfrag checks and the per-call policy with a stepped clock."""

from __future__ import annotations

import pytest

from firsthop.services.signaling.errors import Problem
from firsthop.services.signaling.ratelimit import RateLimit
from firsthop.services.signaling.trickle import (
    MAX_CANDIDATES,
    Fragment,
    TricklePolicy,
    parse_fragment,
)

CAND = "candidate:1 1 udp 2130706431 198.51.100.7 5000 typ host"


def test_fragments() -> None:
    plain = parse_fragment(f"a=mid:0\r\na={CAND}\r\na=end-of-candidates\r\n")
    assert plain == Fragment(None, None, (CAND,)) and not plain.restarts("abcd")
    creds = parse_fragment(f"a=ice-ufrag:abcd\r\na=ice-pwd:{'p' * 22}\r\na={CAND}\r\n")
    assert not creds.restarts("abcd")  # WHIP sends the current ones with every trickle
    assert creds.restarts("other") and creds.restarts("")  # new ones, or not known
    assert creds.credentials() == f"a=ice-ufrag:abcd\r\na=ice-pwd:{'p' * 22}\r\n".encode()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("a=ice-ufrag:abcd\r\n", "needs both"),
        (f"a=ice-pwd:{'p' * 22}\r\n", "needs both"),
        ("a=ice-ufrag:ab\r\na=ice-pwd:" + "p" * 22 + "\r\n", "malformed a=ice-ufrag"),
        ("a=ice-ufrag:abcd\r\na=ice-pwd:short\r\n", "malformed a=ice-ufrag or a=ice-pwd"),
        ("a=candidate:1 1 udp\r\n", "malformed candidate"),
        ("a=candidate:1 1 udp 1 not-an-address 5000 typ host\r\n", "malformed candidate"),
    ],
)
def test_bad_fragments_are_400_with_a_reason(body: str, reason: str) -> None:
    with pytest.raises(Problem) as refused:
        parse_fragment(body)
    assert refused.value.status == 400 and reason in refused.value.reason


def test_more_candidates_than_a_call_may_trickle_are_refused_before_any_is_read() -> None:
    """1,300 of them in one 64 KiB sdpfrag cost 64 ms of signaling's loop to classify."""
    parse_fragment(f"a={CAND}\r\n" * MAX_CANDIDATES)
    with pytest.raises(Problem) as refused:
        parse_fragment("a=candidate:x\r\n" * (MAX_CANDIDATES + 1))  # (none even well formed)
    assert refused.value.status == 429


def test_policy_limits_messages_restarts_and_candidates_per_call() -> None:
    now = [0.0]
    policy = TricklePolicy(
        messages=RateLimit(1.0, 3),
        restarts=RateLimit(0.5, 1),
        max_candidates=5,
        clock=lambda: now[0],
    )
    one = Fragment(None, None, (CAND,))

    def status(call: str, frag: Fragment, restart: bool = False) -> int:
        try:
            policy.admit(call, frag, restart=restart)
        except Problem as problem:
            assert problem.retry_after is None or problem.retry_after > 0
            return problem.status
        return 204

    assert [status("c1", one) for _ in range(4)] == [204, 204, 204, 429]
    assert status("c2", one) == 204  # per call
    assert status("c1", one, restart=True) == 204  # restarts have their own bucket
    assert status("c1", one, restart=True) == 429
    now[0] += 10.0
    assert status("c1", Fragment(None, None, (CAND,) * 3)) == 429  # 4 + 3 > 5
    assert status("c1", Fragment(None, None, (CAND,) * 6)) == 429  # never fits
    assert status("c1", Fragment(None, None, ())) == 204  # end-of-candidates: free
    assert policy.refused == {"trickle": 1, "restart": 1, "candidates": 2}
