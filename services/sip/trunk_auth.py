"""A trunk's password on its INVITEs: Digest authentication (RFC 3261 §22), sans-IO.

Over UDP a trunk's source address is all that says who sent a request, and a host that can
forge it could place calls as the trunk. A trunk given a password (`--sip-trunk-auth`) must
also prove it: an INVITE that starts a call gets `401` and a challenge, and only the one sent
again with the right answer rings.

Strategy:

* **Stateless nonces.** A nonce is ``<ms since the epoch, hex>.<4 random bytes, hex>.<MAC>``:
  an HMAC over the rest and the address it was sent to (64 bits of it: a forged nonce would
  only skip the challenge, not the password), keyed by a key derived from the trunk's
  password and 16 random bytes of this process's. A challenge costs no state (a forged
  flood of INVITEs leaves nothing behind). A nonce is good for `NONCE_TTL` seconds, from the
  address it was sent to only, and only at the process that sent it: the used nonces below
  are that process's memory, so an answer captured on the path replays at no other replica
  and not after a restart (another process's nonce is a stranger's: 401, a fresh challenge;
  the SIP Service's client IP affinity keeps a trunk on one replica, as its dialogs need).
* **One INVITE a nonce.** A nonce that authenticated an INVITE is remembered until it would
  have expired (a retransmission of that INVITE is its transaction's, and never gets here);
  the same nonce on another INVITE is a replay: challenged again. At most `capacity` are
  remembered at once; past that a correctly answered INVITE gets 503 (only answers with the
  password can fill it).
* **No password kept**: H(A1) for each algorithm offered, and the nonce key.
* **What is asked**: one challenge per algorithm offered, in order of preference (RFC 8760
  §2.4), all with one nonce; ``qop=auth`` (answers without qop, RFC 2069's form, are taken
  too). The realm is the trunk's name. MD5 alone by default: a user agent that knows only
  MD5 may fail the call on a SHA-256 challenge instead of answering the MD5 one (Debian 12's
  baresip, libre 1.1.0, does: "Function not implemented"), so SHA-256 is the operator's to
  turn on (`--sip-auth-algorithms SHA-256,MD5`) where the trunks know it.

Verdicts (`Verdict`), and what the UAS answers: OK (the call goes on), CHALLENGE (no
answer, or one to another realm or nonce: 401), STALE (our nonce, expired: 401 with
``stale=true``), REPLAYED (401), FAILED (a wrong user name or response: 403), MALFORMED
(400), FULL (503). Pure: no I/O; the wall clock is passed in.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from firsthop.shared.wire import sip, sip_digest
from firsthop.shared.wire.sip_digest import DigestError

NONCE_TTL = 30.0  # s: a nonce's life (a UAC answers its challenge at once)
NONCE_SKEW = 5.0  # s: how far ahead a nonce's time may be (a clock stepped back since)
ALGORITHMS = tuple(sip_digest.ALGORITHMS)  # what may be offered: SHA-256, MD5
OFFERED = ("MD5",)  # by default: what every user agent answers (below)
_NONCE = re.compile(r"^([0-9a-f]{1,16})\.([0-9a-f]{8})\.[0-9a-f]{16}$")
_REALM = re.compile(r"^[A-Za-z0-9\-.!%*_+`'~]+$")  # a token: quoted as it is


class Verdict(enum.Enum):
    OK = "ok"
    CHALLENGE = "challenged"
    STALE = "stale"
    REPLAYED = "replayed"
    FAILED = "failed"
    MALFORMED = "malformed"
    FULL = "full"


@dataclass(frozen=True)
class TrunkSecret:
    """A trunk's user name and password (`--sip-trunk-auth NAME=USER:PASSWORD`)."""

    username: str
    password: str = field(default="", repr=False)  # (never in a log)


@dataclass(frozen=True)
class _Keys:
    username: str
    ha1: dict[str, str] = field(repr=False)  # algorithm -> H(username:realm:password)
    nonce_key: bytes = field(repr=False)


class TrunkAuth:
    def __init__(
        self,
        secrets: Mapping[str, TrunkSecret],
        capacity: int = 20_000,
        algorithms: Sequence[str] = OFFERED,
        random: Callable[[int], bytes] = os.urandom,
    ) -> None:
        self._random = random
        salt = random(16)  # this process's: its nonces pass here only
        unknown = [a for a in algorithms if a not in ALGORITHMS]
        if unknown or not algorithms or len(set(algorithms)) < len(algorithms):
            raise ValueError(f"Digest algorithms: some of {', '.join(ALGORITHMS)}, once each")
        self.algorithms = tuple(algorithms)
        self._keys: dict[str, _Keys] = {}
        for trunk, secret in secrets.items():
            if not _REALM.match(trunk):
                raise ValueError(f"trunk name {trunk!r}: a realm must be a token (RFC 3261 §25)")
            if not secret.username or not secret.password:
                raise ValueError(f"trunk {trunk!r}: a user name and a password are needed")
            self._keys[trunk] = _Keys(
                secret.username,
                {
                    a: sip_digest.hash_a1(a, secret.username, trunk, secret.password)
                    for a in self.algorithms
                },
                hmac.new(
                    secret.password.encode(),
                    b"firsthop sip nonce " + salt + trunk.encode(),
                    "sha256",
                ).digest(),
            )
        self.capacity = capacity
        self._used: OrderedDict[str, float] = OrderedDict()  # nonce -> until when (in order)

    def protects(self, trunk: str) -> bool:
        return trunk in self._keys

    def challenges(self, trunk: str, host: str, wall: float, *, stale: bool = False) -> list[str]:
        """The ``WWW-Authenticate`` values of a 401 to `host` (one per algorithm offered)."""
        keys = self._keys[trunk]
        nonce = _nonce(keys.nonce_key, int(wall * 1000), self._random(4).hex(), host)
        return [sip_digest.challenge(trunk, nonce, a, stale=stale) for a in self.algorithms]

    def check(
        self,
        trunk: str,
        method: str,
        uri: str,
        authorization: str | None,
        host: str,
        wall: float,
    ) -> Verdict:
        """Whether a request of `method` to `uri` from `host` carries the trunk's answer. The
        answer's own ``uri`` is what its response covers. It need not be the Request-URI
        (RFC 7616 §3.4.6's SHOULD: sipp answers for ``sip:host:port``, which names no user;
        the answer is bound to its nonce, single-use and good only from where it went), but
        if it names a user, that is the Request-URI's (the agent called): an answer seen on
        the path cannot ring another agent."""
        keys = self._keys[trunk]
        if authorization is None:
            return Verdict.CHALLENGE
        try:
            credentials = sip_digest.parse_credentials(authorization)
        except DigestError:
            return Verdict.MALFORMED
        if credentials.realm != trunk or credentials.algorithm not in keys.ha1:
            return Verdict.CHALLENGE  # (an answer to some other challenge)
        match = _NONCE.match(credentials.nonce)
        if match is None:
            return Verdict.CHALLENGE
        issued = int(match.group(1), 16)
        ours = _nonce(keys.nonce_key, issued, match.group(2), host)
        if not hmac.compare_digest(credentials.nonce, ours):
            return Verdict.CHALLENGE  # not ours, or not sent to this address
        if not -NONCE_SKEW <= wall - issued / 1000 <= NONCE_TTL:
            return Verdict.STALE
        ha1 = keys.ha1[credentials.algorithm]
        expected = sip_digest.expected_response(ha1, method, credentials)
        right = hmac.compare_digest(
            credentials.username.encode(), keys.username.encode()
        ) & hmac.compare_digest(credentials.response.encode(), expected.encode())
        used = self._used
        while used and next(iter(used.values())) < wall:
            used.popitem(last=False)
        if credentials.nonce in used:
            return Verdict.REPLAYED
        if len(used) >= self.capacity:
            return Verdict.FULL
        # Used up, right or wrong: one guess at the password a challenge (only our own nonces
        # get here, and each is remembered only while it could pass).
        used[credentials.nonce] = wall + NONCE_TTL + NONCE_SKEW
        if not right:
            return Verdict.FAILED
        if not _same_user(credentials.uri, uri):
            return Verdict.FAILED  # an answer for another number than this INVITE's
        return Verdict.OK


def _same_user(answered: str, requested: str) -> bool:
    user = sip.uri_user(answered)
    return user is None or user == sip.uri_user(requested)


def _nonce(key: bytes, issued_ms: int, salt: str, host: str) -> str:
    stamp = f"{issued_ms:x}.{salt}"
    mac = hmac.new(key, f"{stamp}:{host}".encode(), hashlib.sha256).hexdigest()[:16]
    return f"{stamp}.{mac}"
