from __future__ import annotations

import binascii

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firsthop.shared.wire import route_token as rt

KEY1 = bytes(range(32))
KEY2 = bytes(range(100, 132))
KEYS = {1: KEY1, 2: KEY2}
NOW = 1_800_000_000
ALLOW = rt.DestinationFilter(["10.0.0.0/8", "fd00::/8"])


def mint(
    host: str = "10.0.0.5",
    *,
    key_id: int = 1,
    issued_at: int = NOW,
    cluster: int = 3,
    port: int = 5004,
) -> str:
    return rt.encode_route_token(
        key_id=key_id,
        key=KEYS[key_id],
        cluster=cluster,
        host=host,
        port=port,
        issued_at=issued_at,
        nonce=b"\xaa\xbb\xcc",
    )


def test_ipv4_layout_byte_for_byte() -> None:
    token = mint("10.0.0.5", port=5004, cluster=0x0102)
    assert len(token) == 40
    raw = binascii.a2b_base64(token)
    assert len(raw) == 30
    assert raw[:5] == b"\x01\x01\x01\x02\x04"
    assert raw[5:9] == bytes([10, 0, 0, 5])
    assert raw[9:11] == (5004).to_bytes(2, "big")
    assert raw[11:15] == NOW.to_bytes(4, "big")
    assert raw[15:18] == b"\xaa\xbb\xcc"
    import hashlib
    import hmac

    assert raw[18:] == hmac.new(KEY1, raw[:18], hashlib.sha256).digest()[:12]
    assert "=" not in token


def test_ipv6_token() -> None:
    token = mint("fd00::42", port=40000)
    assert len(token) == 56
    got = rt.verify_route_token(token, KEYS, NOW, allow_dest=ALLOW)
    assert got.dest == ("fd00::42", 40000)
    assert got.family == 6


def test_verify_round_trip_fields() -> None:
    got = rt.verify_route_token(mint(cluster=9), KEYS, NOW + 10, allow_dest=ALLOW)
    assert (got.key_id, got.cluster, got.host, got.port, got.issued_at, got.nonce) == (
        1,
        9,
        "10.0.0.5",
        5004,
        NOW,
        b"\xaa\xbb\xcc",
    )


def test_token_is_ice_ufrag_charset() -> None:
    # RFC 8839 §5.4: ice-char = ALPHA / DIGIT / "+" / "/"
    allowed = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")
    for i in range(200):
        token = rt.encode_route_token(
            key_id=1, key=KEY1, cluster=i, host="10.0.0.1", port=i, issued_at=i, nonce=b"xyz"
        )
        assert set(token) <= allowed


@pytest.mark.parametrize("bit", range(30 * 8))
def test_any_flipped_bit_is_rejected(bit: int) -> None:
    raw = bytearray(binascii.a2b_base64(mint()))
    raw[bit // 8] ^= 1 << (bit % 8)
    forged = binascii.b2a_base64(bytes(raw), newline=False)
    with pytest.raises(rt.TokenError):
        rt.verify_route_token(forged, KEYS, NOW, allow_dest=ALLOW)


def test_flipped_bit_ipv6() -> None:
    good = mint("fd00::1")
    for bit in range(42 * 8):
        raw = bytearray(binascii.a2b_base64(good))
        raw[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(rt.TokenError):
            rt.verify_route_token(binascii.b2a_base64(bytes(raw), newline=False), KEYS, NOW)


def test_unknown_key_id() -> None:
    with pytest.raises(rt.UnknownKey):
        rt.verify_route_token(mint(key_id=2), {1: KEY1}, NOW)


def test_rotation_both_keys_live() -> None:
    old, new = mint(key_id=1), mint(key_id=2)
    assert rt.verify_route_token(old, KEYS, NOW).key_id == 1
    assert rt.verify_route_token(new, KEYS, NOW).key_id == 2
    # after rotation retires key 1, its tokens stop routing
    with pytest.raises(rt.UnknownKey):
        rt.verify_route_token(old, {2: KEY2}, NOW)


def test_wrong_key_same_id_is_bad_mac() -> None:
    with pytest.raises(rt.BadMac):
        rt.verify_route_token(mint(), {1: KEY2}, NOW)


def test_expiry_and_future() -> None:
    token = mint(issued_at=NOW)
    rt.verify_route_token(token, KEYS, NOW + 100, max_age=100)
    with pytest.raises(rt.TokenExpired):
        rt.verify_route_token(token, KEYS, NOW + 101, max_age=100)
    rt.verify_route_token(token, KEYS, NOW - 30)
    with pytest.raises(rt.TokenFromFuture):
        rt.verify_route_token(token, KEYS, NOW - 31)


def test_default_max_age_is_four_hours() -> None:
    token = mint(issued_at=NOW)
    rt.verify_route_token(token, KEYS, NOW + 4 * 3600)
    with pytest.raises(rt.TokenExpired):
        rt.verify_route_token(token, KEYS, NOW + 4 * 3600 + 1)


def test_disallowed_destination_even_with_valid_mac() -> None:
    token = mint("192.168.1.1")
    with pytest.raises(rt.DestinationNotAllowed):
        rt.verify_route_token(token, KEYS, NOW, allow_dest=ALLOW)
    assert rt.verify_route_token(token, KEYS, NOW).host == "192.168.1.1"
    with pytest.raises(rt.DestinationNotAllowed):
        rt.verify_route_token(mint("fe80::1"), KEYS, NOW, allow_dest=ALLOW)


def test_destination_filter() -> None:
    f = rt.DestinationFilter(["127.0.0.0/8", "10.1.0.0/16", "::1/128"])
    assert f.allows_host("127.9.9.9")
    assert f.allows_host("10.1.200.3")
    assert not f.allows_host("10.2.0.1")
    assert f.allows_host("::1")
    assert not f.allows_host("::2")
    assert rt.DestinationFilter.allow_all().allows_host("8.8.8.8")


@pytest.mark.parametrize(
    "ufrag",
    ["", "short", "A" * 39, "A" * 41, "A" * 40, "*" * 40, "A" * 38 + "==", "A" * 56, b"\xff" * 40],
)
def test_malformed(ufrag: str | bytes) -> None:
    with pytest.raises(rt.TokenError):
        rt.verify_route_token(ufrag, KEYS, NOW)


def test_family_mismatch_is_malformed() -> None:
    raw = bytearray(binascii.a2b_base64(mint()))
    raw[4] = 6
    with pytest.raises(rt.MalformedToken):
        rt.decode_route_token(binascii.b2a_base64(bytes(raw), newline=False))


def test_bytes_and_str_accepted() -> None:
    token = mint()
    assert rt.verify_route_token(token.encode(), KEYS, NOW) == rt.verify_route_token(
        token, KEYS, NOW
    )


def test_parse_route_keys() -> None:
    text = rt.format_route_keys(KEYS)
    assert rt.parse_route_keys(text) == KEYS
    for bad in [
        "",
        "1",
        "x=AAAA",
        "1=AAAA",
        f"1={text.split('=', 1)[1]},1=AAAA",
        "300=" + "A" * 44,
    ]:
        with pytest.raises(ValueError):
            rt.parse_route_keys(bad)


def test_a_bad_route_key_is_named_by_its_place_never_its_text() -> None:
    """A key pasted without its ID (`openssl rand -base64 32`) splits at its padding into
    ID=...: the message had printed the key (a helper's read, stop 42)."""
    bare = "q83vEjRWeJq83vEjRWeJq83vEjRWeJq83vEjRWeJq8w="
    for text in (bare, f"1={'A' * 43}=,{bare}"):
        with pytest.raises(ValueError) as refused:
            rt.parse_route_keys(text)
        assert bare[:20] not in str(refused.value) and "route key #" in str(refused.value)


@given(
    cluster=st.integers(0, 0xFFFF),
    port=st.integers(0, 0xFFFF),
    issued=st.integers(0, 2**32 - 1),
    nonce=st.binary(min_size=3, max_size=3),
    v6=st.booleans(),
    ip=st.integers(0, 2**128 - 1),
    key_id=st.sampled_from([1, 2]),
)
def test_round_trip_property(
    cluster: int, port: int, issued: int, nonce: bytes, v6: bool, ip: int, key_id: int
) -> None:
    import ipaddress

    host = str(ipaddress.IPv6Address(ip) if v6 else ipaddress.IPv4Address(ip % 2**32))
    token = rt.encode_route_token(
        key_id=key_id,
        key=KEYS[key_id],
        cluster=cluster,
        host=host,
        port=port,
        issued_at=issued,
        nonce=nonce,
    )
    got = rt.verify_route_token(token, KEYS, issued, max_age=0)
    # inet_ntop's text (what sockets report) may differ in form, never in value
    assert (ipaddress.ip_address(got.host), got.port) == (ipaddress.ip_address(host), port)
    assert (got.cluster, got.issued_at, got.nonce, got.key_id) == (cluster, issued, nonce, key_id)


@given(st.one_of(st.binary(max_size=80), st.text(max_size=80)))
def test_garbage_raises_only_token_error(data: bytes | str) -> None:
    try:
        rt.verify_route_token(data, KEYS, NOW, allow_dest=ALLOW)
    except rt.TokenError:
        pass


@given(st.binary(min_size=30, max_size=30))
def test_random_bodies_never_verify(raw: bytes) -> None:
    ufrag = binascii.b2a_base64(raw, newline=False)
    with pytest.raises(rt.TokenError):
        rt.verify_route_token(ufrag, KEYS, NOW)
