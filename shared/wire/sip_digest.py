"""SIP Digest authentication (RFC 3261 §22.4; RFC 7616's algorithms, brought to SIP by RFC
8760): the challenge a UAS sends and the credentials a UAC answers it with.

Purpose: a trunk that shares a password with the edge proves it on each INVITE, so a host
that can forge the trunk's source address still cannot place its calls
(`services/sip/trunk_auth.py` decides; this module only reads and writes the fields).

Strategy:

* ``parse_credentials`` reads an ``Authorization`` value (``Digest`` and its auth-params,
  §25.1 ``digest-response``) in one pass, in time linear in its length, within fixed bounds
  (`MAX_PARAMS` parameters, `MAX_VALUE` characters each); a parameter given twice, an
  unknown scheme or algorithm, or a missing one of those every answer needs is an error.
* ``expected_response`` computes RFC 7616 §3.4.1's ``response`` from H(A1) (what a server
  keeps instead of the password: ``ha1``), the method and the fields of the credentials,
  with ``qop=auth`` (then ``nc`` and ``cnonce`` are needed) or without (RFC 2069's form,
  which RFC 3261 §22.4 keeps).
* ``challenge`` writes a ``WWW-Authenticate`` value.
* The client's side, for our own requests a trunk challenges: ``parse_challenge`` reads a
  ``WWW-Authenticate`` or ``Proxy-Authenticate`` value (the same parser, its values without
  control characters), ``answer`` writes the ``Authorization`` that answers it.

Errors::

    DigestError    the credentials cannot be read (``reason``: the drop-counter label)

Pure: no I/O, no clock; stdlib only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

# RFC 7616 §3.4.1 / RFC 8760 §2.3: the algorithms, by the name the `algorithm` field uses.
ALGORITHMS: dict[str, Callable[[bytes], str]] = {
    "SHA-256": lambda data: hashlib.sha256(data).hexdigest(),
    "MD5": lambda data: hashlib.md5(data, usedforsecurity=False).hexdigest(),
}
MAX_PARAMS = 16  # auth-params one answer may carry (an answer has about ten)
MAX_VALUE = 1024  # characters of one parameter's value
MAX_CHALLENGE_VALUE = 256  # of a challenge's (what our answer writes back stays small)
PRINTABLE = frozenset(chr(c) for c in range(0x20, 0x7F))
NEEDED = ("username", "realm", "nonce", "uri", "response")  # §22.4, RFC 7616 §3.4


class DigestError(Exception):
    reason = "sip_auth_malformed"


@dataclass(frozen=True)
class Credentials:
    """What an ``Authorization: Digest ...`` field says (values unquoted)."""

    username: str
    realm: str
    nonce: str
    uri: str
    response: str
    algorithm: str = "MD5"  # RFC 7616 §3.4: its absence means MD5
    qop: str | None = None
    nc: str | None = None
    cnonce: str | None = None
    opaque: str | None = None


def hash_a1(algorithm: str, username: str, realm: str, password: str) -> str:
    """H(A1) = H(username ":" realm ":" password) (RFC 7616 §3.4.2): kept, not the password."""
    return ALGORITHMS[algorithm](f"{username}:{realm}:{password}".encode())


def expected_response(ha1: str, method: str, credentials: Credentials) -> str:
    """The ``response`` the credentials should carry (RFC 7616 §3.4.1, §3.4.3: A2 is
    method ":" uri for qop=auth and for no qop)."""
    h = ALGORITHMS[credentials.algorithm]
    ha2 = h(f"{method}:{credentials.uri}".encode())
    if credentials.qop is None:  # RFC 2069's form (RFC 3261 §22.4 keeps it)
        return h(f"{ha1}:{credentials.nonce}:{ha2}".encode())
    return h(
        f"{ha1}:{credentials.nonce}:{credentials.nc}:{credentials.cnonce}:"
        f"{credentials.qop}:{ha2}".encode()
    )


def challenge(realm: str, nonce: str, algorithm: str, *, stale: bool = False) -> str:
    """A ``WWW-Authenticate`` value (RFC 7616 §3.3; qop=auth, so the answer carries a
    client nonce). `realm` and `nonce` must need no escaping (ours never do)."""
    value = f'Digest realm="{realm}", nonce="{nonce}", algorithm={algorithm}, qop="auth"'
    return value + ", stale=true" if stale else value


def _auth_params(value: str, what: str) -> dict[str, str]:
    """``Digest`` and comma-separated ``name=value`` (a token, or a quoted string with ``\\``
    escapes, §25.1), in one pass, within `MAX_PARAMS` and `MAX_VALUE`."""
    scheme, _, rest = value.strip().partition(" ")
    if scheme.lower() != "digest":
        raise DigestError(f"not a Digest {what}")
    params: dict[str, str] = {}
    i, n = 0, len(rest)
    while True:
        while i < n and rest[i] in " \t\r\n,":
            i += 1
        if i >= n:
            break
        eq = rest.find("=", i)
        if eq < 0:
            raise DigestError("a parameter without a value")
        name = rest[i:eq].strip().lower()
        i = eq + 1
        while i < n and rest[i] in " \t":
            i += 1
        if i < n and rest[i] == '"':
            chars: list[str] = []
            i += 1
            while i < n and rest[i] != '"':
                if rest[i] == "\\" and i + 1 < n:
                    i += 1
                chars.append(rest[i])
                i += 1
                if len(chars) > MAX_VALUE:
                    raise DigestError("a parameter's value is too long")
            if i >= n:
                raise DigestError("an unterminated quoted string")
            i += 1
            text = "".join(chars)
        else:
            end = rest.find(",", i)
            end = n if end < 0 else end
            text = rest[i:end].strip()
            i = end
        if not name or len(text) > MAX_VALUE:
            raise DigestError("a parameter without a name, or too long")
        if name in params:
            raise DigestError(f"{name} given twice")
        if len(params) >= MAX_PARAMS:
            raise DigestError("too many parameters")
        params[name] = text
    return params


def parse_credentials(value: str) -> Credentials:
    """An ``Authorization`` field's value (§22.4's ``digest-response``)."""
    params = _auth_params(value, "answer")
    missing = [name for name in NEEDED if name not in params]
    if missing:
        raise DigestError(f"no {', '.join(missing)}")
    algorithm = params.get("algorithm", "MD5").upper()
    if algorithm not in ALGORITHMS:
        raise DigestError("an algorithm we do not offer")
    qop = params.get("qop")
    if qop is not None:
        if qop.lower() != "auth":
            raise DigestError("a qop we do not offer")
        if "nc" not in params or "cnonce" not in params:
            raise DigestError("qop=auth without nc and cnonce")
    return Credentials(
        username=params["username"],
        realm=params["realm"],
        nonce=params["nonce"],
        uri=params["uri"],
        response=params["response"].lower(),
        algorithm=algorithm,
        qop=qop,
        nc=params.get("nc"),
        cnonce=params.get("cnonce"),
        opaque=params.get("opaque"),
    )


@dataclass(frozen=True)
class Challenge:
    """What a ``WWW-Authenticate`` or ``Proxy-Authenticate`` field asks (values unquoted)."""

    realm: str
    nonce: str
    algorithm: str = "MD5"
    qop: bool = False  # it offers qop=auth (then the answer carries nc and cnonce)
    opaque: str | None = None
    stale: bool = False  # our last answer's nonce had expired, not its password (§3.3)


def parse_challenge(value: str) -> Challenge:
    """A challenge's value; `DigestError` for one we cannot answer (another scheme or
    algorithm, or a qop that offers no ``auth``)."""
    params = _auth_params(value, "challenge")
    if "realm" not in params or "nonce" not in params:
        raise DigestError("no realm or nonce")
    if any(
        len(text) > MAX_CHALLENGE_VALUE or not PRINTABLE.issuperset(text)
        for text in params.values()
    ):
        raise DigestError("a value too long or not printable ASCII")  # (written into our answer)
    algorithm = params.get("algorithm", "MD5").upper()
    if algorithm not in ALGORITHMS:
        raise DigestError("an algorithm we do not know")
    offered = params.get("qop")
    qops = {q.strip().lower() for q in offered.split(",")} if offered is not None else set()
    if offered is not None and "auth" not in qops:
        raise DigestError("a qop we do not know")
    stale = params.get("stale", "").lower() == "true"
    return Challenge(
        params["realm"], params["nonce"], algorithm, "auth" in qops, params.get("opaque"), stale
    )


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def answer(
    challenge: Challenge, method: str, uri: str, username: str, password: str, cnonce: str
) -> str:
    """The ``Authorization`` (or ``Proxy-Authorization``) value answering `challenge` for a
    request `method` to `uri` (its first answer: nc=00000001)."""
    ha1 = hash_a1(challenge.algorithm, username, challenge.realm, password)
    credentials = Credentials(
        username=username,
        realm=challenge.realm,
        nonce=challenge.nonce,
        uri=uri,
        response="",
        algorithm=challenge.algorithm,
        qop="auth" if challenge.qop else None,
        nc="00000001" if challenge.qop else None,
        cnonce=cnonce if challenge.qop else None,
    )
    fields = [
        f"username={_quoted(username)}",
        f"realm={_quoted(challenge.realm)}",
        f"nonce={_quoted(challenge.nonce)}",
        f"uri={_quoted(uri)}",
        f'response="{expected_response(ha1, method, credentials)}"',
        f"algorithm={challenge.algorithm}",
    ]
    if challenge.qop:
        fields += ["qop=auth", "nc=00000001", f"cnonce={_quoted(cnonce)}"]
    if challenge.opaque is not None:
        fields.append(f"opaque={_quoted(challenge.opaque)}")
    return "Digest " + ", ".join(fields)
