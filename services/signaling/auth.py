"""Who is calling: API keys and client secrets (§6). Pure: the clock is injected.

* An **API key** is a long-lived server-side credential (``--api-keys``,
  ``--api-keys-file``). It is never stored or logged; its *fingerprint* (first 8 bytes of
  its SHA-256, hex) names it in rate limits and call ownership. Comparison against every
  configured key is constant-time and visits all of them.
* A **client secret** is what a browser gets from its backend (``POST /v1/client_secrets``):
  self-contained, so any signaling replica can check it with no lookup::

      "fhcs_" + base64url( version=1 | id (16 random bytes) | expires_at (u32 BE)
                           | issuer fingerprint (8 bytes) | MAC (16 bytes) )

  MAC = first 16 bytes of HMAC-SHA256(secret key, all preceding bytes). Single use is not
  decided here: the ledger in `stores.py` records used ids (Redis when configured). A used
  secret stays valid, past its expiry, for ``PATCH``/``DELETE`` of the one call it created:
  that is how it is bound to its call.
* An **ephemeral key** is what OpenAI's Realtime API calls a client secret
  (``POST /v1/realtime/client_secrets``, `realtime_api`): the same layout and MAC key with
  prefix ``ek_`` and version 2 (the MAC covers the version, so neither kind passes for the
  other). It is reusable until it expires, is bound to the session config stored under its
  id (`stores.EkSessions`), and is accepted only on the realtime call routes: 403 elsewhere.

Errors are `Problem` (401: missing, unknown, malformed or forged; 403: expired, or the wrong
kind of credential for the route).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from firsthop.services.signaling.errors import Problem

SECRET_PREFIX = "fhcs_"
SECRET_VERSION = 1
EK_PREFIX = "ek_"
EK_VERSION = 2
SECRET_ID_BYTES = 16
FINGERPRINT_BYTES = 8
MAC_BYTES = 16
_BODY = struct.Struct(f"!B{SECRET_ID_BYTES}sI{FINGERPRINT_BYTES}s")
SECRET_BYTES = _BODY.size + MAC_BYTES  # 45 bytes -> 60 base64url chars, no padding
DEV_ISSUER = "dev"
MAX_TOKEN = 512


def fingerprint(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).digest()[:FINGERPRINT_BYTES].hex()


@dataclass(frozen=True)
class Principal:
    """An authenticated caller. `tenant` (the API key fingerprint, or "dev") is what rate
    limits count; `owner` is what a call records and PATCH/DELETE must match."""

    kind: str  # "key" | "secret" | "ek" | "sip" (a trunk, by its name)
    tenant: str
    secret_id: str | None = None
    expires_at: int | None = None

    @property
    def owner(self) -> str:
        if self.kind == "secret":
            return f"secret:{self.secret_id}"
        if self.kind == "ek":
            return f"ek:{self.tenant}:{self.secret_id}"
        if self.kind == "sip":
            return f"sip:{self.tenant}"
        return f"key:{self.tenant}"

    def owns(self, owner: str) -> bool:
        """Whether a call recorded with `owner` is this caller's on the realtime routes: an
        API key owns its tenant's calls, those its ephemeral keys created included; an
        ephemeral key owns the calls it created."""
        mine = hmac.compare_digest(owner.encode(), self.owner.encode())
        if self.kind == "key":
            mine |= owner.startswith(f"ek:{self.tenant}:")
        return mine


def bearer_token(header: str | None) -> str:
    if not header:
        raise Problem(401, "missing Authorization: Bearer token")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Problem(401, "Authorization must be a Bearer token")
    if len(token) > MAX_TOKEN or not token.isascii() or not token.isprintable():
        raise Problem(401, "malformed bearer token")
    return token


class ApiKeys:
    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = [(k.encode(), fingerprint(k)) for k in dict.fromkeys(keys) if k]
        self._tenants = frozenset(fp for _, fp in self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def match(self, token: str) -> str | None:
        """The fingerprint of the key equal to `token`, or None (no early exit)."""
        given = token.encode()
        found = None
        for key, fp in self._keys:
            if hmac.compare_digest(key, given):
                found = fp
        return found

    def issued(self, tenant: str) -> bool:
        """Whether `tenant` (a fingerprint) is one of these keys'."""
        return tenant in self._tenants


def derive_secret_key(api_keys: Iterable[str]) -> bytes | None:
    """A client-secret MAC key every replica with the same API keys derives alike."""
    keys = sorted(set(api_keys))
    if not keys:
        return None
    return hmac.new(b"firsthop client secret v1", "\n".join(keys).encode(), "sha256").digest()


class ClientSecrets:
    """Mints and checks one kind of self-contained token: client secrets (``fhcs_``) by
    default; `ephemeral_keys` makes the ``ek_`` kind."""

    def __init__(
        self,
        key: bytes,
        ttl: float,
        clock: Callable[[], float] = time.time,
        *,
        prefix: str = SECRET_PREFIX,
        version: int = SECRET_VERSION,
        kind: str = "secret",
        what: str = "client secret",
        expired_status: int = 403,
    ) -> None:
        if len(key) < 16:
            raise ValueError("client secret key must be at least 16 bytes")
        self._key = key
        self.ttl = ttl
        self._clock = clock
        self.prefix = prefix
        self._version = version
        self._kind = kind
        self._what = what
        self._expired_status = expired_status

    def ephemeral_keys(self) -> ClientSecrets:
        """The ``ek_`` kind, signed with the same key (expired: 401, as OpenAI answers)."""
        return ClientSecrets(
            self._key,
            self.ttl,
            self._clock,
            prefix=EK_PREFIX,
            version=EK_VERSION,
            kind="ek",
            what="ephemeral key",
            expired_status=401,
        )

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._key, body, "sha256").digest()[:MAC_BYTES]

    def mint(self, tenant: str, ttl: float | None = None) -> tuple[str, int]:
        """A new secret for `tenant` (an API key fingerprint, or "dev"): (value, expires_at)."""
        value, expires_at, _ = self.mint_with_id(tenant, ttl)
        return value, expires_at

    def mint_with_id(self, tenant: str, ttl: float | None = None) -> tuple[str, int, str]:
        """(value, expires_at, id as hex)."""
        expires_at = int(self._clock() + (self.ttl if ttl is None else ttl))
        issuer = _issuer_bytes(tenant)
        secret_id = os.urandom(SECRET_ID_BYTES)
        body = _BODY.pack(self._version, secret_id, expires_at, issuer)
        raw = body + self._mac(body)
        value = self.prefix + base64.urlsafe_b64encode(raw).decode().rstrip("=")
        return value, expires_at, secret_id.hex()

    def verify(self, token: str, *, allow_expired: bool = False) -> Principal:
        what = self._what
        if not token.startswith(self.prefix):
            raise Problem(401, f"not a {what}")
        text = token[len(self.prefix) :]
        try:
            raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        except (binascii.Error, ValueError):
            raise Problem(401, f"malformed {what}") from None
        if len(raw) != SECRET_BYTES:
            raise Problem(401, f"malformed {what}")
        body, mac = raw[: _BODY.size], raw[_BODY.size :]
        if not hmac.compare_digest(mac, self._mac(body)):
            raise Problem(401, f"invalid {what}")
        version, secret_id, expires_at, issuer = _BODY.unpack(body)
        if version != self._version:
            raise Problem(401, f"unsupported {what} version")
        if not allow_expired and self._clock() > expires_at:
            raise Problem(self._expired_status, f"{what} expired")
        return Principal(
            kind=self._kind,
            tenant=_tenant_from_issuer(issuer),
            secret_id=secret_id.hex(),
            expires_at=expires_at,
        )


def _issuer_bytes(tenant: str) -> bytes:
    if tenant == DEV_ISSUER:
        return bytes(FINGERPRINT_BYTES)
    return bytes.fromhex(tenant)


def _tenant_from_issuer(issuer: bytes) -> str:
    return DEV_ISSUER if issuer == bytes(FINGERPRINT_BYTES) else issuer.hex()


class Authenticator:
    """Bearer token → Principal, for each route's rules. A client secret or ephemeral key
    holds only while what issued it does: an API key still among `keys`, or (`dev`) the
    keyless dev route. Secrets are self-contained, so without this check those of a key
    taken out of the list would pass until they expired wherever `--secret-key` outlives
    the key (the derived key changes with the list)."""

    def __init__(self, keys: ApiKeys, secrets: ClientSecrets, *, dev: bool = False) -> None:
        self.keys = keys
        self.secrets = secrets
        self.ephemeral = secrets.ephemeral_keys()
        self.dev = dev

    def _issued(self, principal: Principal, what: str) -> Principal:
        tenant = principal.tenant
        if self.keys.issued(tenant) or (tenant == DEV_ISSUER and self.dev):
            return principal
        raise Problem(401, f"the API key that issued this {what} is no longer valid")

    def authenticate(self, header: str | None, *, allow_expired: bool = False) -> Principal:
        """The native routes: an API key or a client secret (an ephemeral key: 403)."""
        token = bearer_token(header)
        if token.startswith(EK_PREFIX):
            self.ephemeral.verify(token, allow_expired=True)  # forged/malformed: 401 first
            raise Problem(403, "an ephemeral key (ek_) is accepted only on /v1/realtime calls")
        if token.startswith(SECRET_PREFIX):
            principal = self.secrets.verify(token, allow_expired=allow_expired)
            return self._issued(principal, "client secret")
        return self._key(token)

    def any_credential(self, header: str | None) -> Principal:
        """What may hang a call up, whichever route placed it: an API key, a client secret
        or an ephemeral key, expired ones too (a call's recording, fetched after it ended)."""
        if bearer_token(header).startswith(EK_PREFIX):
            return self.realtime(header, allow_ek=True, allow_expired=True)
        return self.authenticate(header, allow_expired=True)

    def realtime(
        self, header: str | None, *, allow_ek: bool, allow_expired: bool = False
    ) -> Principal:
        """The /v1/realtime routes: an API key, or (where `allow_ek`) an ephemeral key; a
        client secret (fhcs_) is for the native routes: 403. `allow_expired`: an expired
        ephemeral key still hangs up the calls it created."""
        token = bearer_token(header)
        if token.startswith(EK_PREFIX):
            principal = self.ephemeral.verify(token, allow_expired=allow_expired)
            if not allow_ek:
                raise Problem(403, "an ephemeral key cannot be used here: use an API key")
            return self._issued(principal, "ephemeral key")
        if token.startswith(SECRET_PREFIX):
            self.secrets.verify(token, allow_expired=True)  # forged/malformed: 401 first
            raise Problem(
                403, "a client secret (fhcs_) is for /v1/calls; use an ephemeral key (ek_)"
            )
        return self._key(token)

    def _key(self, token: str) -> Principal:
        fp = self.keys.match(token)
        if fp is None:
            raise Problem(401, "unknown API key")
        return Principal(kind="key", tenant=fp)

    def api_key_only(self, header: str | None) -> Principal:
        principal = self.authenticate(header)
        if principal.kind != "key":
            raise Problem(403, "a client secret cannot mint client secrets")
        return principal
