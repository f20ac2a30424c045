"""Credentials: API keys, client secrets (expiry, forgery, single use), rate limits."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import ParamSpec

import pytest

from firsthop.services.signaling.auth import (
    SECRET_PREFIX,
    ApiKeys,
    Authenticator,
    ClientSecrets,
    bearer_token,
    derive_secret_key,
    fingerprint,
)
from firsthop.services.signaling.errors import Problem
from firsthop.services.signaling.ratelimit import RateLimit, RateLimiter
from firsthop.services.signaling.stores import SecretLedger

KEY = bytes(range(32))
P = ParamSpec("P")


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def status_of(fn: Callable[P, object], *args: P.args, **kwargs: P.kwargs) -> tuple[int, str]:
    with pytest.raises(Problem) as info:
        fn(*args, **kwargs)
    return info.value.status, info.value.reason


def test_bearer_header_parsing() -> None:
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer   abc ") == "abc"
    for bad in (
        None,
        "",
        "Basic abc",
        "Bearer",
        "Bearer  ",
        "Bearer \udc80",
        "Bearer " + "x" * 600,
    ):
        assert status_of(bearer_token, bad)[0] == 401


def test_api_keys_match_by_fingerprint() -> None:
    keys = ApiKeys(["k1", "k2", "k2", ""])
    assert len(keys) == 2
    assert keys.match("k2") == fingerprint("k2")
    assert keys.match("k3") is None
    assert keys.match("k") is None


def test_secret_round_trip_and_expiry() -> None:
    clock = Clock()
    secrets = ClientSecrets(KEY, ttl=60, clock=clock)
    value, expires_at = secrets.mint(fingerprint("k1"))
    assert value.startswith(SECRET_PREFIX) and expires_at == int(clock.now + 60)
    principal = secrets.verify(value)
    assert principal.kind == "secret" and principal.tenant == fingerprint("k1")
    assert principal.owner == f"secret:{principal.secret_id}"
    clock.now += 60
    assert secrets.verify(value).secret_id == principal.secret_id  # still valid at expiry
    clock.now += 1
    assert status_of(secrets.verify, value) == (403, "client secret expired")
    # bound to its call: an expired secret still names the call it created
    assert secrets.verify(value, allow_expired=True).secret_id == principal.secret_id


def test_secret_ids_are_unique() -> None:
    secrets = ClientSecrets(KEY, ttl=60)
    ids = {secrets.verify(secrets.mint("dev")[0]).secret_id for _ in range(100)}
    assert len(ids) == 100


def _flip(value: str, index: int) -> str:
    text = value[len(SECRET_PREFIX) :]
    raw = bytearray(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    raw[index] ^= 0x01
    return SECRET_PREFIX + base64.urlsafe_b64encode(bytes(raw)).decode().rstrip("=")


@pytest.mark.parametrize("index", [0, 1, 17, 18, 21, 28, 29, 44])
def test_any_flipped_bit_is_a_forgery(index: int) -> None:
    secrets = ClientSecrets(KEY, ttl=60)
    value, _ = secrets.mint(fingerprint("k1"))
    assert status_of(secrets.verify, _flip(value, index))[0] == 401


def test_secret_from_another_key_or_malformed_is_refused() -> None:
    theirs = ClientSecrets(bytes(32), ttl=60).mint("dev")[0]
    ours = ClientSecrets(KEY, ttl=60)
    assert status_of(ours.verify, theirs) == (401, "invalid client secret")
    for bad in (SECRET_PREFIX, SECRET_PREFIX + "!!!!", SECRET_PREFIX + "AAAA", theirs + "AA"):
        assert status_of(ours.verify, bad)[0] == 401
    assert status_of(ours.verify, "k1")[0] == 401


def test_derived_key_is_the_same_for_the_same_keys() -> None:
    assert derive_secret_key(["b", "a"]) == derive_secret_key(["a", "b", "a"])
    assert derive_secret_key(["a"]) != derive_secret_key(["b"])
    assert derive_secret_key([]) is None


def test_authenticator_rules() -> None:
    secrets = ClientSecrets(KEY, ttl=60)
    auth = Authenticator(ApiKeys(["k1"]), secrets)
    assert auth.authenticate("Bearer k1").owner == f"key:{fingerprint('k1')}"
    assert status_of(auth.authenticate, "Bearer nope") == (401, "unknown API key")
    secret = secrets.mint(fingerprint("k1"))[0]
    assert auth.authenticate(f"Bearer {secret}").kind == "secret"
    assert auth.api_key_only("Bearer k1").kind == "key"
    assert status_of(auth.api_key_only, f"Bearer {secret}")[0] == 403


async def test_a_secret_is_spent_once_and_can_be_given_back() -> None:
    clock = Clock()
    ledger = SecretLedger(None, clock=clock)
    assert await ledger.claim("s1", "call-1", clock.now + 60)
    assert not await ledger.claim("s1", "call-2", clock.now + 60)
    assert await ledger.claim("s2", "call-3", clock.now + 60)
    await ledger.release("s1")
    assert await ledger.claim("s1", "call-4", clock.now + 60)


def test_token_bucket_with_an_injected_clock() -> None:
    clock = Clock(0.0)
    limiter = RateLimiter(RateLimit(rate=2.0, burst=3), clock=clock)
    assert [limiter.check("ip") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.check("ip") == pytest.approx(0.5)  # Retry-After: one token in 0.5 s
    assert limiter.check("other") == 0.0  # buckets are per key
    clock.now += 0.5
    assert limiter.check("ip") == 0.0
    assert limiter.check("ip") == pytest.approx(0.5)
    clock.now += 10
    assert [limiter.check("ip") for _ in range(4)][-1] > 0  # refills to the burst, no more


def test_rate_limit_off_and_bounded_memory() -> None:
    off = RateLimiter(RateLimit(rate=0, burst=0))
    assert all(off.check("x") == 0.0 for _ in range(1000))
    clock = Clock(0.0)
    limiter = RateLimiter(RateLimit(rate=1.0, burst=2), clock=clock, max_keys=100)
    for i in range(100):
        limiter.check(f"ip{i}")
    clock.now += 5  # every bucket has refilled: the same as no bucket
    limiter.check("new")
    assert len(limiter) == 1
    for i in range(500):
        limiter.check(f"flood{i}")
    assert len(limiter) <= 101


def test_a_secret_dies_with_the_key_that_issued_it() -> None:
    """Secrets are self-contained: with a `--secret-key` that outlives a revoked API key,
    only this check stops that key's secrets and ephemeral keys before they expire."""
    secrets = ClientSecrets(KEY, ttl=60)
    before = Authenticator(ApiKeys(["k1", "k2"]), secrets)
    secret = secrets.mint(fingerprint("k2"))[0]
    ek = before.ephemeral.mint(fingerprint("k2"))[0]
    assert before.authenticate(f"Bearer {secret}").tenant == fingerprint("k2")
    assert before.realtime(f"Bearer {ek}", allow_ek=True).tenant == fingerprint("k2")
    after = Authenticator(ApiKeys(["k1"]), secrets)  # k2 revoked, the same --secret-key
    gone = "the API key that issued this"
    revoked = (401, f"{gone} client secret is no longer valid")
    assert status_of(after.authenticate, f"Bearer {secret}") == revoked
    assert status_of(after.any_credential, f"Bearer {secret}") == revoked  # hang-ups too
    revoked = (401, f"{gone} ephemeral key is no longer valid")
    assert status_of(after.realtime, f"Bearer {ek}", allow_ek=True) == revoked
    assert status_of(after.any_credential, f"Bearer {ek}") == revoked
    assert after.authenticate(f"Bearer {secrets.mint(fingerprint('k1'))[0]}").kind == "secret"


def test_a_dev_secret_holds_only_where_dev_is_on() -> None:
    secrets = ClientSecrets(KEY, ttl=60)
    secret = secrets.mint("dev")[0]
    ek = secrets.ephemeral_keys().mint("dev")[0]
    on = Authenticator(ApiKeys([]), secrets, dev=True)
    assert on.authenticate(f"Bearer {secret}").tenant == "dev"
    assert on.realtime(f"Bearer {ek}", allow_ek=True).tenant == "dev"
    off = Authenticator(ApiKeys(["k1"]), secrets)
    assert status_of(off.authenticate, f"Bearer {secret}")[0] == 401
    assert status_of(off.realtime, f"Bearer {ek}", allow_ek=True)[0] == 401
