"""Route tokens: the server ICE ufrag as a signed, self-describing route (docs/architecture.md §2).

The transceiver mints its ICE ufrag as a token naming its own media address; the relay reads
it from the USERNAME of a session's first STUN Binding request and routes with no lookup.

Binary layout (then standard base64, no padding; the lengths are chosen so none occurs):

    version(1)=0x01 | key id(1) | cluster(2, BE) | family(1)=4|6 | ip(4|16) | port(2, BE)
    | issued-at(4, BE unix s) | nonce(3) | mac(12) = HMAC-SHA256(key[key id], all before)[:12]

IPv4 tokens are 30 bytes (40 chars), IPv6 tokens 42 bytes (56 chars); nothing else decodes.

Strategy: `verify_route_token` runs on the relay's first-packet path, so it checks the cheap
things first (length, alphabet, version, key id), then the MAC (constant time), and only then
trusts the fields. Destination CIDRs are pre-compiled to integer (network, mask) pairs so the
allow-list check allocates nothing.

Errors::

    TokenError
     ├── MalformedToken          wrong length, alphabet, version or family
     ├── UnknownKey              key id not among the live keys
     ├── BadMac                  MAC does not match (forged or corrupted)
     ├── TokenExpired            issued-at older than the max age
     ├── TokenFromFuture         issued-at more than 30 s ahead of now
     └── DestinationNotAllowed   destination outside the allowed CIDRs

Each class has a ``reason`` used as the drop-counter label.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import ipaddress
import os
import socket
import struct
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

VERSION = 1
MAC_LENGTH = 12
NONCE_LENGTH = 3
V4_LENGTH = 30  # 1+1+2+1+4+2+4+3+12
V6_LENGTH = 42  # 1+1+2+1+16+2+4+3+12
V4_CHARS = 40
V6_CHARS = 56
FUTURE_SKEW = 30  # seconds a token may be issued ahead of the verifier's clock
DEFAULT_MAX_AGE = 4 * 3600  # the longest session
KEY_LENGTH = 32

_HEAD = struct.Struct("!BBHB")
_TAIL = struct.Struct("!HI")
_V4 = struct.Struct("!BBHB4sHI3s12s")
_V6 = struct.Struct("!BBHB16sHI3s12s")


class TokenError(Exception):
    reason = "token_invalid"


class MalformedToken(TokenError):
    reason = "token_malformed"


class UnknownKey(TokenError):
    reason = "token_unknown_key"


class BadMac(TokenError):
    reason = "token_bad_mac"


class TokenExpired(TokenError):
    reason = "token_expired"


class TokenFromFuture(TokenError):
    reason = "token_future"


class DestinationNotAllowed(TokenError):
    reason = "dest_not_allowed"


class RouteToken(NamedTuple):
    key_id: int
    cluster: int
    host: str  # the transceiver's media IP, textual (as sockets report it)
    port: int
    issued_at: int
    nonce: bytes
    packed_ip: bytes  # 4 or 16 bytes, as on the wire

    @property
    def family(self) -> int:
        return 4 if len(self.packed_ip) == 4 else 6

    @property
    def dest(self) -> tuple[str, int]:
        return (self.host, self.port)


class Keyring:
    """Live route keys with their HMAC pads pre-hashed (RFC 2104 §2).

    HMAC-SHA256 over a 30-byte body costs two SHA-256 compressions of the pads plus two of
    the data; hashing the pads once per key and copying those states per token halves the
    cost of ``hmac.digest`` on the relay's first-packet path.
    """

    __slots__ = ("keys", "_pads")

    def __init__(self, keys: Mapping[int, bytes]) -> None:
        self.keys = dict(keys)
        self._pads: dict[int, tuple[Any, Any]] = {}
        for key_id, key in self.keys.items():
            block = key if len(key) <= 64 else hashlib.sha256(key).digest()
            block = block.ljust(64, b"\0")
            inner = hashlib.sha256(bytes(b ^ 0x36 for b in block))
            outer = hashlib.sha256(bytes(b ^ 0x5C for b in block))
            self._pads[key_id] = (inner, outer)

    def mac(self, key_id: int, body: bytes) -> bytes | None:
        pads = self._pads.get(key_id)
        if pads is None:
            return None
        inner = pads[0].copy()
        inner.update(body)
        outer = pads[1].copy()
        outer.update(inner.digest())
        mac: bytes = outer.digest()[:MAC_LENGTH]
        return mac

    def __contains__(self, key_id: object) -> bool:
        return key_id in self._pads


# Textual forms of recently seen transceiver IPs: a fleet has few, and inet_ntop is not free.
_HOST_TEXT: dict[bytes, str] = {}
_HOST_TEXT_MAX = 4096


def _host_text(packed_ip: bytes) -> str:
    host = _HOST_TEXT.get(packed_ip)
    if host is None:
        if len(_HOST_TEXT) >= _HOST_TEXT_MAX:
            _HOST_TEXT.clear()
        family = socket.AF_INET if len(packed_ip) == 4 else socket.AF_INET6
        host = _HOST_TEXT[packed_ip] = socket.inet_ntop(family, packed_ip)
    return host


def encode_route_token(
    *,
    key_id: int,
    key: bytes,
    cluster: int,
    host: str,
    port: int,
    issued_at: int,
    nonce: bytes,
) -> str:
    """Mint a token; the result is a valid ICE ufrag (RFC 8839 §5.4 ice-char only)."""
    ip = ipaddress.ip_address(host)
    family = 4 if ip.version == 4 else 6
    if len(nonce) != NONCE_LENGTH:
        raise ValueError("nonce must be 3 bytes")
    body = (
        _HEAD.pack(VERSION, key_id, cluster, family)
        + ip.packed
        + _TAIL.pack(port, issued_at)
        + nonce
    )
    mac = hmac.digest(key, body, "sha256")[:MAC_LENGTH]
    return binascii.b2a_base64(body + mac, newline=False).decode("ascii")


def decode_route_token(ufrag: bytes | str) -> RouteToken:
    """Decode a token's fields WITHOUT checking its MAC (for logs and tests)."""
    raw = _decode_raw(ufrag)
    return _fields(raw)


def _decode_raw(ufrag: bytes | str) -> bytes:
    n = len(ufrag)
    if n != V4_CHARS and n != V6_CHARS:
        raise MalformedToken(f"token must be 40 or 56 characters, got {n}")
    try:
        raw = binascii.a2b_base64(ufrag, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise MalformedToken("token is not unpadded standard base64") from exc
    if raw[0] != VERSION:
        raise MalformedToken(f"unsupported token version {raw[0]}")
    family = raw[4]
    if family != 4 and family != 6:
        raise MalformedToken(f"unknown address family {family}")
    if len(raw) != (V4_LENGTH if family == 4 else V6_LENGTH):
        raise MalformedToken("token length does not match its address family")
    return raw


def _fields(raw: bytes) -> RouteToken:
    _, key_id, cluster, _, ip, port, issued_at, nonce, _ = (
        _V4 if len(raw) == V4_LENGTH else _V6
    ).unpack(raw)
    return RouteToken(key_id, cluster, _host_text(ip), port, issued_at, nonce, ip)


class DestinationFilter:
    """A CIDR allow-list compiled to integer masks: membership allocates nothing."""

    __slots__ = ("_v4", "_v6", "_text", "_seen")

    def __init__(self, cidrs: Iterable[str]) -> None:
        self._seen: dict[bytes, bool] = {}  # verdicts for recently seen destinations
        self._v4: list[tuple[int, int]] = []
        self._v6: list[tuple[int, int]] = []
        self._text: list[str] = []
        for cidr in cidrs:
            net = ipaddress.ip_network(cidr.strip(), strict=False)
            mask = int(net.netmask)
            (self._v4 if net.version == 4 else self._v6).append((int(net.network_address), mask))
            self._text.append(str(net))

    @classmethod
    def allow_all(cls) -> DestinationFilter:
        return cls(["0.0.0.0/0", "::/0"])

    def allows(self, packed_ip: bytes) -> bool:
        verdict = self._seen.get(packed_ip)
        if verdict is None:
            value = int.from_bytes(packed_ip, "big")
            nets = self._v4 if len(packed_ip) == 4 else self._v6
            verdict = any(value & mask == network for network, mask in nets)
            if len(self._seen) >= _HOST_TEXT_MAX:
                self._seen.clear()
            self._seen[packed_ip] = verdict
        return verdict

    def allows_host(self, host: str) -> bool:
        return self.allows(ipaddress.ip_address(host).packed)

    def __repr__(self) -> str:
        return f"DestinationFilter({self._text!r})"


def verify_route_token(
    ufrag: bytes | str,
    keys: Keyring | Mapping[int, bytes],
    now: float,
    *,
    max_age: float = DEFAULT_MAX_AGE,
    allow_dest: DestinationFilter | None = None,
) -> RouteToken:
    """Decode and authenticate a token; raise a TokenError subclass if it must not route.

    `allow_dest=None` skips the destination check (a relay forwarding to a peer cluster
    checks only MAC, key and age: docs/architecture.md §7).
    """
    raw = _decode_raw(ufrag)
    if not isinstance(keys, Keyring):
        keys = Keyring(keys)
    mac = keys.mac(raw[1], raw[:-MAC_LENGTH])
    if mac is None:
        raise UnknownKey(f"unknown key id {raw[1]}")
    if not hmac.compare_digest(mac, raw[-MAC_LENGTH:]):
        raise BadMac("route token MAC mismatch")
    token = _fields(raw)
    if token.issued_at > now + FUTURE_SKEW:
        raise TokenFromFuture("route token issued in the future")
    if now - token.issued_at > max_age:
        raise TokenExpired("route token too old")
    if allow_dest is not None and not allow_dest.allows(token.packed_ip):
        raise DestinationNotAllowed(f"destination {token.host} not allowed")
    return token


def parse_route_keys(text: str) -> dict[int, bytes]:
    """Parse ``"1=<base64 32 bytes>,2=<base64 32 bytes>"`` (FIRSTHOP_ROUTE_KEYS)."""
    keys: dict[int, bytes] = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        kid, sep, b64 = item.partition("=")
        # (a message names the key's place in the list, never its text: a key pasted
        # without its ID, whose base64 padding then splits as ID=..., is still a secret)
        place = f"route key #{len(keys) + 1}"
        if not sep:
            raise ValueError(f"{place} is not ID=BASE64")
        try:
            key_id = int(kid)
            key = binascii.a2b_base64(b64.strip(), strict_mode=True)
        except (ValueError, binascii.Error):
            raise ValueError(f"{place} is not ID=BASE64 (an integer ID, base64)") from None
        if not 0 <= key_id <= 255:
            raise ValueError(f"route key id {key_id} outside 0..255")
        if len(key) != KEY_LENGTH:
            raise ValueError(f"route key {key_id} must be {KEY_LENGTH} bytes, got {len(key)}")
        if key_id in keys:
            raise ValueError(f"route key id {key_id} given twice")
        keys[key_id] = key
    if not keys:
        raise ValueError("no route keys given")
    return keys


def format_route_keys(keys: Mapping[int, bytes]) -> str:
    return ",".join(
        f"{kid}={binascii.b2a_base64(key, newline=False).decode()}" for kid, key in keys.items()
    )


def fresh_nonce() -> bytes:
    return os.urandom(NONCE_LENGTH)
