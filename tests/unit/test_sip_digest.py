"""SIP Digest: the codec (`shared/wire/sip_digest.py`, RFC vectors) and the trunk's check of
an answer (`services/sip/trunk_auth.py`: nonces, replay, expiry, bounds), with a fake clock."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firsthop.services.sip.trunk_auth import NONCE_TTL, TrunkAuth, TrunkSecret, Verdict
from firsthop.shared.wire import sip_digest
from firsthop.shared.wire.sip_digest import DigestError

# RFC 7616 §3.9.1 (both algorithms) and RFC 2617 §3.5: the RFCs' own examples.
RFC7616 = (
    'Digest username="Mufasa", realm="http-auth@example.org", uri="/dir/index.html", '
    'algorithm={alg}, nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", nc=00000001, '
    'cnonce="f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ", qop=auth, response="{response}", '
    'opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"'
)


@pytest.mark.parametrize(
    ("algorithm", "response"),
    [
        ("MD5", "8ca523f5e9506fed4657c9700eebdbec"),
        ("SHA-256", "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"),
    ],
)
def test_rfc_7616_examples(algorithm: str, response: str) -> None:
    credentials = sip_digest.parse_credentials(RFC7616.format(alg=algorithm, response=response))
    assert (credentials.username, credentials.algorithm, credentials.qop) == (
        "Mufasa",
        algorithm,
        "auth",
    )
    ha1 = sip_digest.hash_a1(algorithm, "Mufasa", "http-auth@example.org", "Circle of Life")
    assert sip_digest.expected_response(ha1, "GET", credentials) == response


def test_rfc_2617_example_and_the_form_without_qop() -> None:
    credentials = sip_digest.parse_credentials(
        'Digest username="Mufasa",realm="testrealm@host.com",'
        'nonce="dcd98b7102dd2f0e8b11d0f600bfb0c093",uri="/dir/index.html",qop=auth,'
        'nc=00000001,cnonce="0a4f113b",response="6629fae49393a05397450978507c4ef1",'
        'opaque="5ccc069c403ebaf9f0171e9517f40e41"'
    )
    ha1 = sip_digest.hash_a1("MD5", "Mufasa", "testrealm@host.com", "Circle Of Life")
    assert sip_digest.expected_response(ha1, "GET", credentials) == credentials.response
    # RFC 2069's form (no qop): H(HA1:nonce:HA2)
    bare = sip_digest.parse_credentials(
        'Digest username="u", realm="r", nonce="n", uri="sip:a@b", response="X"'
    )
    assert bare.qop is None and bare.algorithm == "MD5" and bare.response == "x"
    ha2 = sip_digest.ALGORITHMS["MD5"](b"INVITE:sip:a@b")
    assert sip_digest.expected_response("h", "INVITE", bare) == sip_digest.ALGORITHMS["MD5"](
        f"h:n:{ha2}".encode()
    )


def test_a_challenge_reads_back() -> None:
    value = sip_digest.challenge("pbx", "17f.ab", "SHA-256", stale=True)
    assert value == 'Digest realm="pbx", nonce="17f.ab", algorithm=SHA-256, qop="auth", stale=true'


def test_quoted_strings_and_escapes() -> None:
    credentials = sip_digest.parse_credentials(
        'Digest  username = "a\\"b,c" , realm="r", nonce="n", uri="sip:x@y;transport=tcp", '
        'response="00"'
    )
    assert credentials.username == 'a"b,c' and credentials.uri == "sip:x@y;transport=tcp"


@pytest.mark.parametrize(
    "value",
    [
        "Basic dXNlcjpwYXNz",
        'Digest realm="r", nonce="n", uri="u", response="x"',  # no username
        'Digest username="u", username="v", realm="r", nonce="n", uri="u", response="x"',
        'Digest username="u", realm="r", nonce="n", uri="u", response="x", algorithm=MD5-sess',
        'Digest username="u", realm="r", nonce="n", uri="u", response="x", qop=auth',  # no nc
        'Digest username="u", realm="r", nonce="n", uri="u", response="x", qop=auth-int, '
        'nc=1, cnonce="c"',
        'Digest username="u, realm="r", nonce="n", uri="u", response="x"',  # unterminated
        "Digest username",
        "Digest " + ", ".join(f'p{i}="v"' for i in range(40)),
        'Digest username="' + "a" * 5000 + '", realm="r", nonce="n", uri="u", response="x"',
    ],
)
def test_what_cannot_be_read_is_a_digest_error(value: str) -> None:
    with pytest.raises(DigestError):
        sip_digest.parse_credentials(value)


@given(st.text(max_size=300))
def test_no_header_raises_anything_else(value: str) -> None:
    try:
        sip_digest.parse_credentials(value)
    except DigestError:
        pass


# -- our answer to a trunk's challenge --------------------------------------------------------


def test_our_answer_matches_rfc_7616s_example() -> None:
    """The client's side against the RFC's own figures (its cnonce, nc=1)."""
    challenge = sip_digest.parse_challenge(
        'Digest realm="http-auth@example.org", qop="auth, auth-int", algorithm=SHA-256, '
        'nonce="7ypf/xlj9XXwfDPEoM4URrv/xwf94BcCAzFZH4GiTo0v", '
        'opaque="FQhe/qaU925kfnzjCev0ciny7QMkPqMAFRtzCUYo5tdS"'
    )
    assert challenge.qop and challenge.algorithm == "SHA-256"
    value = sip_digest.answer(
        challenge,
        "GET",
        "/dir/index.html",
        "Mufasa",
        "Circle of Life",
        "f2/wE4q74E6zIJEtWaHKaf5wv/H5QzzpXusqGemxURZJ",
    )
    credentials = sip_digest.parse_credentials(value)
    assert credentials.response == (
        "753927fa0e85d155564e2e272a28d1802ca10daf4496794697cf8db5856cb6c1"
    )
    assert credentials.opaque == challenge.opaque and credentials.nc == "00000001"


def test_a_challenge_without_qop_and_what_cannot_be_answered() -> None:
    bare = sip_digest.parse_challenge('Digest realm="pbx", nonce="n1"')
    assert (bare.algorithm, bare.qop, bare.opaque, bare.stale) == ("MD5", False, None, False)
    assert sip_digest.parse_challenge('Digest realm="pbx", nonce="n2", stale=TRUE').stale
    value = sip_digest.answer(bare, "BYE", "sip:a@b", 'us"er', "pw", "c")
    credentials = sip_digest.parse_credentials(value)
    assert credentials.username == 'us"er' and credentials.qop is None  # (quoted, escaped)
    ha1 = sip_digest.hash_a1("MD5", 'us"er', "pbx", "pw")
    assert sip_digest.expected_response(ha1, "BYE", credentials) == credentials.response
    for value in [
        'Basic realm="pbx"',
        'Digest realm="pbx"',  # no nonce
        'Digest realm="pbx", nonce="n", algorithm=SHA-512-256',
        'Digest realm="pbx", nonce="n", qop="auth-int"',
        'Digest realm="p\r\nX-Evil: 1", nonce="n"',  # written back into our answer
        'Digest realm="p\u2028q", nonce="n"',  # (printable ASCII only)
        f'Digest realm="pbx", nonce="{"n" * 257}"',  # (our answer stays small)
    ]:
        with pytest.raises(DigestError):
            sip_digest.parse_challenge(value)


@given(st.text(max_size=300))
def test_no_challenge_raises_anything_else(value: str) -> None:
    try:
        sip_digest.parse_challenge(value)
    except DigestError:
        pass


# -- the trunk's check ------------------------------------------------------------------------

TRUNK, HOST, URI = "pbx", "192.0.2.7", "sip:echo@198.51.100.1"
WALL = 1_800_000_000.0


def auth(capacity: int = 4) -> TrunkAuth:
    secrets = {TRUNK: TrunkSecret("pbx-user", "s3cret")}
    return TrunkAuth(secrets, capacity=capacity, algorithms=("SHA-256", "MD5"))


def answer(
    challenge: str,
    *,
    password: str = "s3cret",
    username: str = "pbx-user",
    uri: str = URI,
    method: str = "INVITE",
    cnonce: str = "c1",
) -> str:
    """What a UAC answers `challenge` with (as baresip would: qop=auth)."""
    fields = dict(re.findall(r'(\w+)="?([^",]*)"?', challenge.removeprefix("Digest ")))
    algorithm = fields["algorithm"]
    h = sip_digest.ALGORITHMS[algorithm]
    ha1 = h(f"{username}:{fields['realm']}:{password}".encode())
    ha2 = h(f"{method}:{uri}".encode())
    response = h(f"{ha1}:{fields['nonce']}:00000001:{cnonce}:auth:{ha2}".encode())
    return (
        f'Digest username="{username}", realm="{fields["realm"]}", nonce="{fields["nonce"]}", '
        f'uri="{uri}", response="{response}", algorithm={algorithm}, qop=auth, nc=00000001, '
        f'cnonce="{cnonce}"'
    )


def test_challenges_offer_sha256_then_md5_with_one_nonce() -> None:
    values = auth().challenges(TRUNK, HOST, WALL)
    assert [re.search(r"algorithm=([\w-]+)", v).group(1) for v in values] == ["SHA-256", "MD5"]  # type: ignore[union-attr]
    assert len({re.search(r'nonce="([^"]+)"', v).group(1) for v in values}) == 1  # type: ignore[union-attr]
    assert all('realm="pbx"' in v and "stale" not in v for v in values)


@pytest.mark.parametrize("which", [0, 1])
def test_the_right_answer_passes_once(which: int) -> None:
    core = auth()
    value = answer(core.challenges(TRUNK, HOST, WALL)[which])
    assert core.check(TRUNK, "INVITE", URI, value, HOST, WALL + 1) is Verdict.OK
    assert core.check(TRUNK, "INVITE", URI, value, HOST, WALL + 2) is Verdict.REPLAYED


def test_wrong_answers() -> None:
    core = auth(capacity=100)

    def check(value: str | None, host: str = HOST, wall: float = WALL + 1) -> Verdict:
        return core.check(TRUNK, "INVITE", URI, value, host, wall)

    def fresh() -> str:
        return core.challenges(TRUNK, HOST, WALL)[0]

    assert check(None) is Verdict.CHALLENGE
    assert check("Digest nonsense") is Verdict.MALFORMED
    # a nonce sent to another address, made up, or from another trunk's key: not ours
    assert check(answer(fresh()), host="192.0.2.8") is Verdict.CHALLENGE
    forged = re.sub(r'nonce="[0-9a-f]+\.', 'nonce="1.', answer(fresh()))
    assert check(forged) is Verdict.CHALLENGE
    other = TrunkAuth({TRUNK: TrunkSecret("pbx-user", "other")}, algorithms=("SHA-256",))
    assert check(answer(other.challenges(TRUNK, HOST, WALL)[0])) is Verdict.CHALLENGE
    assert check(answer(fresh().replace('realm="pbx"', 'realm="x"'))) is Verdict.CHALLENGE
    # expired, and from too far ahead
    assert check(answer(fresh()), wall=WALL + NONCE_TTL + 0.01) is Verdict.STALE
    assert check(answer(fresh()), wall=WALL - 6) is Verdict.STALE
    # none of the above used the nonce up; each wrong answer does (one guess a challenge)
    challenge = fresh()
    assert check(answer(challenge, password="guess")) is Verdict.FAILED
    assert check(answer(challenge)) is Verdict.REPLAYED
    for wrong in (
        answer(fresh(), username="someone"),
        answer(fresh(), method="BYE"),
        answer(fresh()).replace(f'uri="{URI}"', 'uri="sip:other@198.51.100.1"'),  # (covered)
        answer(fresh(), uri="sip:assistant@198.51.100.1"),  # another agent than the INVITE's
    ):
        assert check(wrong) is Verdict.FAILED
    # an answer for a uri without a user (sipp answers for sip:host:port)
    assert check(answer(fresh(), uri="sip:198.51.100.1:5060")) is Verdict.OK


def test_a_nonce_passes_only_at_the_process_that_sent_it() -> None:
    """Another replica with the same password, or this one after a restart, holds none of
    the used nonces: an answer captured on the path must not pass there. A fresh challenge
    of its own does."""
    here, there = auth(), auth()
    value = answer(here.challenges(TRUNK, HOST, WALL)[0])
    assert here.check(TRUNK, "INVITE", URI, value, HOST, WALL + 1) is Verdict.OK
    assert there.check(TRUNK, "INVITE", URI, value, HOST, WALL + 1) is Verdict.CHALLENGE
    own = answer(there.challenges(TRUNK, HOST, WALL)[0])
    assert there.check(TRUNK, "INVITE", URI, own, HOST, WALL + 1) is Verdict.OK


def test_remembered_nonces_are_bounded_and_forgotten_once_expired() -> None:
    core = auth()  # capacity 4
    for i in range(4):
        value = answer(core.challenges(TRUNK, HOST, WALL + i)[1])
        assert core.check(TRUNK, "INVITE", URI, value, HOST, WALL + i) is Verdict.OK
    late = answer(core.challenges(TRUNK, HOST, WALL + 4)[1])
    assert core.check(TRUNK, "INVITE", URI, late, HOST, WALL + 4) is Verdict.FULL
    # the first ones can no longer pass, so they are gone and there is room again
    later = WALL + 4 + NONCE_TTL + 5.1
    fresh = answer(core.challenges(TRUNK, HOST, later)[1])
    assert core.check(TRUNK, "INVITE", URI, fresh, HOST, later) is Verdict.OK
    assert len(core._used) <= 4


def test_configuration_is_checked_and_the_password_not_kept() -> None:
    with pytest.raises(ValueError):
        TrunkAuth({'a"b': TrunkSecret("u", "p")})
    with pytest.raises(ValueError):
        TrunkAuth({"pbx": TrunkSecret("u", "")})
    for algorithms in [(), ("MD5", "MD5"), ("SHA-512",)]:
        with pytest.raises(ValueError):
            TrunkAuth({}, algorithms=algorithms)
    (default,) = TrunkAuth({"pbx": TrunkSecret("u", "p")}).challenges("pbx", HOST, WALL)
    assert "algorithm=MD5," in default  # (MD5 alone unless asked: user agents that know only it)
    core = auth()
    ha1 = sip_digest.hash_a1("MD5", "pbx-user", TRUNK, "s3cret")
    for text in (repr(vars(core)), repr(TrunkSecret("u", "s3cret"))):
        assert "s3cret" not in text and ha1 not in text
