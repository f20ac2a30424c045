"""A trunk with a password (`--sip-trunk-auth`): real user agents (baresip, sipp) answer the
edge's Digest challenge and their calls go through; a wrong password, and an INVITE from the
trunk's address with no answer (what a host forging that address can send), ring nothing.
The other way (`--sip-trunk-login`): sipp challenges the edge's BYE and checks its answer."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..sip_phone import (
    SIPP_BYE,
    Phone,
    PhoneStack,
    baresip_call,
    power_at,
    run_sipp,
    sipp_invite_answering_a_challenge,
    tone,
)
from ..support import wait_until

pytestmark = pytest.mark.slow

USER, PASSWORD = "pbx-user", "s3cret-Pa55"
LOGIN, LOGIN_PASSWORD = "edge-user", "an0ther-Secret"  # what the edge answers the trunk with


@pytest.fixture(scope="module")
def stack() -> Iterator[PhoneStack]:
    with PhoneStack.running(
        "--sip-trunk-auth",
        f"local={USER}:{PASSWORD}",
        "--sip-trunk-login",
        f"local={LOGIN}:{LOGIN_PASSWORD}",
    ) as running:
        yield running


def test_baresip_answers_the_challenge_and_hears_its_own_voice(
    stack: PhoneStack, tmp_path: Path
) -> None:
    challenged = stack.signaling_event("sip_auth_challenged")
    heard, log = baresip_call(
        stack.sip, "echo", tone(600.0, 6.0, level=12000), 5, str(tmp_path), auth=(USER, PASSWORD)
    )
    assert "Call established" in log, log[-2000:]
    assert len(heard) >= 2 * 8000 * 2, log[-2000:]
    assert power_at(heard[-2 * 8000 :], 600.0) > 0.5  # its own tone, not silence
    assert stack.signaling_event("sip_auth_challenged") > challenged
    assert stack.signaling_event("sip_auth_ok") >= 1
    wait_until(lambda: not stack.live_sessions(), 10)


def test_baresip_with_a_wrong_password_is_refused(stack: PhoneStack, tmp_path: Path) -> None:
    failed = stack.signaling_event("sip_auth_failed")
    heard, log = baresip_call(
        stack.sip, "echo", tone(600.0, 2.0), 2, str(tmp_path), auth=(USER, "guess")
    )
    assert "403 Forbidden" in log and "Call established" not in log, log[-2000:]
    assert heard == b"" and not stack.live_sessions()
    assert stack.signaling_event("sip_auth_failed") == failed + 1


def test_sipp_answers_the_challenge(stack: PhoneStack, tmp_path: Path) -> None:
    scenario = sipp_invite_answering_a_challenge("echo", USER, PASSWORD)
    scenario += '  <pause milliseconds="1000"/>\n' + SIPP_BYE.replace("CSeq: 2 BYE", "CSeq: 3 BYE")
    status, said = run_sipp(stack.sip, scenario, str(tmp_path))
    assert status == 0, said
    wait_until(lambda: not stack.live_sessions(), 10)


def test_an_invite_without_the_answer_rings_nothing(stack: PhoneStack) -> None:
    """What a host that forges the trunk's address can send: no answer to a challenge it never
    saw (the 401 goes to the trunk), or someone else's answer: each gets a 401 and no call."""
    phone = Phone(stack.sip)
    try:
        invite, responses = phone.invite("echo")
        assert [r.status for r in responses] == [401]
        (challenge,) = [v for n, v in responses[0].headers if n == "www-authenticate"]
        assert re.match(
            r'Digest realm="local", nonce="[0-9a-f]+\.[0-9a-f]{8}\.[0-9a-f]{16}", algorithm=MD5',
            challenge,
        )
        assert len(responses[0].encode()) <= len(invite.encode())
        assert not stack.live_sessions()
        # a guess at the answer, with the nonce the trunk's address was sent
        phone.remote_tag = None
        forged = phone.request("INVITE", body=phone.offer())
        nonce = re.search(r'nonce="([^"]+)"', challenge).group(1)  # type: ignore[union-attr]
        forged = type(forged)(
            (*forged.headers, ("authorization", f'Digest username="{USER}", realm="local", '
             f'nonce="{nonce}", uri="{forged.uri}", response="{"0" * 32}"')),
            forged.body, forged.method, forged.uri,
        )  # fmt: skip
        phone.send(forged)
        assert [r.status for r in phone.responses_until_final()] == [403]
        assert not stack.live_sessions()
    finally:
        phone.close()


def sipp_reply(status: str, *fields: str) -> str:
    """A sipp UAS's response to the request it last received, as scenario XML."""
    lines = "".join(f"      {f}\n" for f in fields)
    return f"""  <send><![CDATA[
      SIP/2.0 {status}
      [last_Via:]
      [last_From:]
      [last_To:]
      [last_Call-ID:]
      [last_CSeq:]
{lines}      Content-Length: 0
  ]]></send>
"""


# sipp, called by the edge's BYE: challenges it (401, qop=auth), then checks the Digest answer
# of the BYE sent again (`verifyauth`: sipp's own computation) and says 200, or 403 and fails.
CHALLENGE_THE_BYE = (
    '  <recv request="BYE" timeout="20000"/>\n'
    + sipp_reply(
        "401 Unauthorized",
        'WWW-Authenticate: Digest realm="pbx.example", nonce="b7f3c2d1e0", algorithm=MD5, '
        'qop="auth"',
    )
    + """  <recv request="BYE" timeout="5000">
    <action>
      <verifyauth assign_to="good" username="{login}" password="{password}"/>
    </action>
  </recv>
  <nop test="good" next="answered"/>
"""
    + sipp_reply("403 Forbidden")
    + '  <recv request="NEVER" timeout="100"/>\n  <label id="answered"/>\n'
    + sipp_reply("200 OK")
)


@pytest.mark.parametrize("password", [LOGIN_PASSWORD, "not-it"])
def test_the_edges_bye_answers_the_trunks_challenge(
    stack: PhoneStack, tmp_path: Path, password: str
) -> None:
    """sipp checks the answer with `password`: the edge's login passes, a wrong one fails."""
    sessions = set(stack.live_sessions())
    scenario = sipp_invite_answering_a_challenge("echo", USER, PASSWORD)
    scenario += CHALLENGE_THE_BYE.format(login=LOGIN, password=password)
    result: list[tuple[int, str]] = []
    sipp = threading.Thread(
        target=lambda: result.append(run_sipp(stack.sip, scenario, str(tmp_path), timeout=30))
    )
    sipp.start()
    try:
        wait_until(lambda: set(stack.live_sessions()) - sessions, 10)
        (session,) = set(stack.live_sessions()) - sessions
        assert stack.tx.request("DELETE", f"/internal/v1/sessions/{session}")[0] == 204
    finally:
        sipp.join(60)
    ((status, said),) = result
    assert (status == 0) == (password == LOGIN_PASSWORD), said
    assert stack.signaling_event("sip_challenges_answered") >= 1
