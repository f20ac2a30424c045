"""Tests for shared.wire.stun: RFC 5769 vectors, malformed input, and codec properties."""

from __future__ import annotations

import hashlib
import ipaddress
import struct
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from firsthop.shared.wire.stun import (
    BINDING,
    ERROR,
    FINGERPRINT,
    HEADER_LENGTH,
    ICE_CONTROLLED,
    ICE_CONTROLLING,
    INDICATION,
    MAGIC_COOKIE,
    MESSAGE_INTEGRITY,
    MESSAGE_INTEGRITY_SHA256,
    NONCE,
    PRIORITY,
    REALM,
    REQUEST,
    SOFTWARE,
    SUCCESS,
    USE_CANDIDATE,
    USERNAME,
    XOR_MAPPED_ADDRESS,
    BadFingerprint,
    BadIntegrity,
    MalformedStun,
    StunError,
    binding_request_server_ufrag,
    build_stun,
    decode_xor_address,
    encode_xor_address,
    message_type,
    parse_stun,
    short_term_key,
    split_message_type,
    verify_fingerprint,
    verify_message_integrity,
)

VECTORS = Path(__file__).resolve().parent.parent / "vectors" / "rfc5769"

# Credentials of RFC 5769 §2.1-2.3.
SHORT_TERM_PASSWORD = "VOkJxbRl1RmTxUk/WvJxBt"
# Credentials of RFC 5769 §2.4 (password after SASLprep, per the erratum).
LONG_TERM_USERNAME = "\u30de\u30c8\u30ea\u30c3\u30af\u30b9"
LONG_TERM_REALM = "example.org"
LONG_TERM_PASSWORD = "TheMatrIX"
LONG_TERM_NONCE = b"f//499k954d6OL34oL9FSTvy64sA"

SHORT_TERM_VECTORS = ["sample_request", "sample_ipv4_response", "sample_ipv6_response"]
ALL_VECTORS = [*SHORT_TERM_VECTORS, "sample_request_long_term"]

TID = bytes(range(12))
KEY = short_term_key(SHORT_TERM_PASSWORD)


def load_vector(name: str) -> bytes:
    """Read a hex vector file: '#' lines are provenance comments, whitespace is ignored."""
    text = (VECTORS / f"{name}.hex").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    return bytes.fromhex("".join("".join(lines).split()))


def raw_message(body: bytes, *, msg_type: int = 0x0001, length: int | None = None) -> bytes:
    """A STUN message with hand-made attribute bytes (no checks, for malformed cases)."""
    if length is None:
        length = len(body)
    return struct.pack("!HHI", msg_type, length, MAGIC_COOKIE) + TID + body


def attr(attr_type: int, value: bytes, *, length: int | None = None) -> bytes:
    """One attribute, zero-padded to 4 bytes; ``length`` overrides the length field."""
    header = struct.pack("!HH", attr_type, len(value) if length is None else length)
    return header + value + b"\x00" * (-len(value) & 3)


# --- RFC 5769 vectors ---------------------------------------------------------------------


@pytest.mark.parametrize("name", SHORT_TERM_VECTORS)
def test_short_term_vectors_verify(name: str) -> None:
    data = load_vector(name)
    msg = parse_stun(data)
    assert msg.method == BINDING
    assert msg.transaction_id == bytes.fromhex("b7e7a701bc34d686fa87dfae")
    verify_message_integrity(data, msg, KEY)
    verify_fingerprint(data, msg)
    assert msg.attributes[-2][0] == MESSAGE_INTEGRITY
    assert msg.attributes[-1][0] == FINGERPRINT
    assert msg.fingerprint_offset == len(data) - 8
    assert msg.integrity_offset == len(data) - 32


def test_sample_request_fields() -> None:
    msg = parse_stun(load_vector("sample_request"))
    assert msg.cls == REQUEST
    assert msg.username == "evtj:h6vY"
    assert msg.get(SOFTWARE) == b"STUN test client"
    assert msg.get(PRIORITY) == bytes.fromhex("6e0001ff")
    assert msg.get(ICE_CONTROLLED) == bytes.fromhex("932ff9b151263b36")
    assert msg.get(REALM) is None
    assert "USERNAME" in repr(msg) and "Binding request" in repr(msg)


@pytest.mark.parametrize(
    ("name", "ip"),
    [
        ("sample_ipv4_response", "192.0.2.1"),
        ("sample_ipv6_response", "2001:db8:1234:5678:11:2233:4455:6677"),
    ],
)
def test_response_xor_mapped_address(name: str, ip: str) -> None:
    msg = parse_stun(load_vector(name))
    assert msg.cls == SUCCESS
    assert msg.username is None
    assert msg.get(SOFTWARE) == b"test vector"
    value = msg.get(XOR_MAPPED_ADDRESS)
    assert value is not None
    assert decode_xor_address(value, msg.transaction_id) == (ip, 32853)
    assert encode_xor_address(ip, 32853, msg.transaction_id) == value


def test_long_term_vector_verifies() -> None:
    data = load_vector("sample_request_long_term")
    msg = parse_stun(data)
    assert (msg.method, msg.cls) == (BINDING, REQUEST)
    assert msg.username == LONG_TERM_USERNAME
    assert msg.get(REALM) == LONG_TERM_REALM.encode()
    assert msg.get(NONCE) == LONG_TERM_NONCE
    verify_message_integrity(data, msg, long_term_key())
    assert msg.fingerprint_offset is None
    with pytest.raises(BadFingerprint):
        verify_fingerprint(data, msg)


def test_rebuild_sample_request() -> None:
    data = load_vector("sample_request")
    attributes = [
        (SOFTWARE, b"STUN test client"),
        (PRIORITY, bytes.fromhex("6e0001ff")),
        (ICE_CONTROLLED, bytes.fromhex("932ff9b151263b36")),
        (USERNAME, b"evtj:h6vY"),
    ]
    tid = parse_stun(data).transaction_id
    # RFC 5769 pads USERNAME with spaces (RFC 8489 §14 lets the sender choose).
    built = build_stun(
        BINDING, REQUEST, tid, attributes, integrity_key=KEY, fingerprint=True, padding=b" "
    )
    assert built == data


@pytest.mark.parametrize(
    ("name", "ip"),
    [
        ("sample_ipv4_response", "192.0.2.1"),
        ("sample_ipv6_response", "2001:db8:1234:5678:11:2233:4455:6677"),
    ],
)
def test_rebuild_responses(name: str, ip: str) -> None:
    data = load_vector(name)
    tid = parse_stun(data).transaction_id
    attributes = [
        (SOFTWARE, b"test vector"),
        (XOR_MAPPED_ADDRESS, encode_xor_address(ip, 32853, tid)),
    ]
    built = build_stun(
        BINDING, SUCCESS, tid, attributes, integrity_key=KEY, fingerprint=True, padding=b" "
    )
    assert built == data


def test_rebuild_long_term_request() -> None:
    data = load_vector("sample_request_long_term")
    attributes = [
        (USERNAME, LONG_TERM_USERNAME.encode()),
        (NONCE, LONG_TERM_NONCE),
        (REALM, LONG_TERM_REALM.encode()),
    ]
    built = build_stun(
        BINDING, REQUEST, parse_stun(data).transaction_id, attributes, integrity_key=long_term_key()
    )
    assert built == data


@pytest.mark.parametrize("name", ALL_VECTORS)
def test_wrong_key_is_bad_integrity(name: str) -> None:
    data = load_vector(name)
    with pytest.raises(BadIntegrity):
        verify_message_integrity(data, parse_stun(data), short_term_key("wrong"))


@pytest.mark.parametrize("name", SHORT_TERM_VECTORS)
def test_every_flipped_bit_is_caught(name: str) -> None:
    data = load_vector(name)
    for bit in range(len(data) * 8):
        mutated = bytearray(data)
        mutated[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises((MalformedStun, BadFingerprint, BadIntegrity)):
            msg = parse_stun(bytes(mutated))
            verify_fingerprint(bytes(mutated), msg)
            verify_message_integrity(bytes(mutated), msg, KEY)


# --- Malformed messages ---------------------------------------------------------------------


def _integrity_placeholder() -> bytes:
    return attr(MESSAGE_INTEGRITY, b"\x00" * 20)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(raw_message(b"")[:19], id="short"),
        pytest.param(b"\x40" + raw_message(b"")[1:], id="top-bits-set"),
        pytest.param(raw_message(b"")[:4] + b"\x21\x12\xa4\x43" + TID, id="bad-cookie"),
        pytest.param(raw_message(b"\x00\x00", length=2), id="length-not-multiple-of-4"),
        pytest.param(raw_message(attr(SOFTWARE, b"abcd"), length=4), id="length-too-small"),
        pytest.param(raw_message(attr(SOFTWARE, b"abcd"), length=12), id="length-too-big"),
        pytest.param(
            raw_message(attr(SOFTWARE, b"abcd", length=8)), id="attribute-overruns-message"
        ),
        pytest.param(
            raw_message(attr(SOFTWARE, b"abcd", length=5)), id="attribute-padding-overruns"
        ),
        pytest.param(
            raw_message(attr(USERNAME, b"a:b") + attr(USERNAME, b"c:d")), id="two-usernames"
        ),
        pytest.param(
            raw_message(_integrity_placeholder() + attr(USERNAME, b"a:b")),
            id="username-after-integrity",
        ),
        pytest.param(
            raw_message(attr(MESSAGE_INTEGRITY_SHA256, b"\x00" * 32) + attr(USERNAME, b"a:b")),
            id="username-after-integrity-sha256",
        ),
        pytest.param(raw_message(attr(USERNAME, b"u" * 513)), id="username-513-bytes"),
        pytest.param(
            raw_message(attr(FINGERPRINT, b"\x00" * 4) + attr(SOFTWARE, b"x")),
            id="fingerprint-not-last",
        ),
        pytest.param(
            raw_message(attr(FINGERPRINT, b"\x00" * 4) + attr(FINGERPRINT, b"\x00" * 4)),
            id="two-fingerprints",
        ),
        pytest.param(raw_message(attr(MESSAGE_INTEGRITY, b"\x00" * 16)), id="integrity-16"),
        pytest.param(raw_message(attr(MESSAGE_INTEGRITY, b"\x00" * 32)), id="integrity-32"),
        pytest.param(raw_message(attr(FINGERPRINT, b"\x00" * 8)), id="fingerprint-8"),
        pytest.param(
            raw_message(attr(MESSAGE_INTEGRITY_SHA256, b"\x00" * 12)), id="integrity-sha256-12"
        ),
    ],
)
def test_malformed(data: bytes) -> None:
    with pytest.raises(MalformedStun):
        parse_stun(data)
    assert binding_request_server_ufrag(data) in (None, b"a")


def test_username_of_512_bytes_is_accepted() -> None:
    msg = parse_stun(raw_message(attr(USERNAME, b"u" * 512)))
    assert msg.username == "u" * 512


def test_username_not_utf8() -> None:
    msg = parse_stun(raw_message(attr(USERNAME, b"\xff\xfe:x")))
    with pytest.raises(MalformedStun):
        _ = msg.username


def test_attributes_after_integrity_are_ignored() -> None:
    body = (
        attr(SOFTWARE, b"before")
        + _integrity_placeholder()
        + attr(SOFTWARE, b"after")
        + attr(MESSAGE_INTEGRITY_SHA256, b"\x00" * 32)
        + attr(REALM, b"ignored too")
        + attr(FINGERPRINT, b"\x00" * 4)
    )
    msg = parse_stun(raw_message(body))
    assert [t for t, _ in msg.attributes] == [
        SOFTWARE,
        MESSAGE_INTEGRITY,
        MESSAGE_INTEGRITY_SHA256,
        FINGERPRINT,
    ]
    assert msg.get(SOFTWARE) == b"before"
    assert msg.integrity_offset == HEADER_LENGTH + 12


def test_missing_integrity_and_fingerprint() -> None:
    data = build_stun(BINDING, REQUEST, TID, [(SOFTWARE, b"x")])
    msg = parse_stun(data)
    with pytest.raises(BadIntegrity):
        verify_message_integrity(data, msg, KEY)
    with pytest.raises(BadFingerprint):
        verify_fingerprint(data, msg)


def test_integrity_excludes_fingerprint() -> None:
    # §14.5: the length field used for the HMAC stops at MESSAGE-INTEGRITY, so adding or
    # dropping FINGERPRINT must not change MESSAGE-INTEGRITY.
    with_fp = build_stun(
        BINDING, REQUEST, TID, [(SOFTWARE, b"x")], integrity_key=KEY, fingerprint=True
    )
    without = build_stun(BINDING, REQUEST, TID, [(SOFTWARE, b"x")], integrity_key=KEY)
    assert with_fp[HEADER_LENGTH : len(without)] == without[HEADER_LENGTH:]


# --- Message type, addresses, keys -------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "expected"),
    [(REQUEST, 0x0001), (INDICATION, 0x0011), (SUCCESS, 0x0101), (ERROR, 0x0111)],
)
def test_binding_message_types(cls: int, expected: int) -> None:
    assert message_type(BINDING, cls) == expected
    assert split_message_type(expected) == (BINDING, cls)


def test_message_type_round_trip_exhaustive() -> None:
    seen = set()
    for method in range(0x1000):
        for cls in (REQUEST, INDICATION, SUCCESS, ERROR):
            t = message_type(method, cls)
            assert t < 0x4000
            assert split_message_type(t) == (method, cls)
            seen.add(t)
    assert len(seen) == 0x4000


@pytest.mark.parametrize(("method", "cls"), [(-1, 0), (0x1000, 0), (1, 4), (1, -1)])
def test_message_type_rejects_out_of_range(method: int, cls: int) -> None:
    with pytest.raises(ValueError):
        message_type(method, cls)


@pytest.mark.parametrize(
    "value",
    [
        b"",
        b"\x00\x01\xa1",
        b"\x00\x03\xa1\x47\xe1\x12\xa6\x43",  # unknown family
        b"\x00\x01\xa1\x47\xe1\x12\xa6",  # IPv4, 7 bytes
        b"\x00\x02\xa1\x47" + b"\x00" * 12,  # IPv6, 16 bytes
        b"\x00\x01\xa1\x47" + b"\x00" * 16,  # IPv4 family, IPv6 length
    ],
)
def test_address_decode_rejects_bad_values(value: bytes) -> None:
    with pytest.raises(MalformedStun):
        decode_xor_address(value, TID)


def long_term_key() -> bytes:
    """RFC 8489 §9.2.2 (MD5): the vector's key; firsthop itself uses short-term credentials."""
    text = f"{LONG_TERM_USERNAME}:{LONG_TERM_REALM}:{LONG_TERM_PASSWORD}"
    return hashlib.md5(text.encode()).digest()


def test_short_term_key_is_the_password() -> None:
    assert short_term_key("abc+/") == b"abc+/"


@pytest.mark.parametrize(
    "build",
    [
        partial(build_stun, BINDING, REQUEST, b"\x00" * 11),
        partial(build_stun, BINDING, REQUEST, TID, padding=b""),
        partial(build_stun, BINDING, REQUEST, TID, padding=b"  "),
        partial(build_stun, BINDING, REQUEST, TID, [(0x10000, b"")]),
        partial(build_stun, BINDING, REQUEST, TID, [(SOFTWARE, b"x" * 0x10000)]),
    ],
    ids=["short-transaction-id", "no-padding", "two-byte-padding", "type-too-big", "too-long"],
)
def test_build_rejects_bad_arguments(build: Callable[[], bytes]) -> None:
    with pytest.raises(ValueError):
        build()


# --- Fast path ------------------------------------------------------------------------------


def chrome_like_request(username: bytes, *, tid: bytes = TID) -> bytes:
    """A Binding request shaped like Chrome's: USERNAME first, then Google and ICE attributes."""
    attributes = [
        (USERNAME, username),
        (0xC057, b"\x00\x01\x00\x0a"),  # GOOG-NETWORK-INFO: network id, cost
        (ICE_CONTROLLING, bytes.fromhex("1b2a3c4d5e6f7a8b")),
        (USE_CANDIDATE, b""),
        (PRIORITY, (0x6E7F1EFF).to_bytes(4, "big")),
    ]
    return build_stun(BINDING, REQUEST, tid, attributes, integrity_key=b"p" * 24, fingerprint=True)


def test_fast_path_on_vectors() -> None:
    assert binding_request_server_ufrag(load_vector("sample_request")) == b"evtj"
    # §2.4's USERNAME has no ':', so it is not an ICE USERNAME.
    assert binding_request_server_ufrag(load_vector("sample_request_long_term")) is None
    assert binding_request_server_ufrag(load_vector("sample_ipv4_response")) is None
    assert binding_request_server_ufrag(load_vector("sample_ipv6_response")) is None


def test_fast_path_on_chrome_like_request() -> None:
    ufrag = b"A" * 40
    data = chrome_like_request(ufrag + b":bcde")
    assert binding_request_server_ufrag(data) == ufrag
    msg = parse_stun(data)
    verify_fingerprint(data, msg)
    verify_message_integrity(data, msg, b"p" * 24)


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"\x16\xfe\xfd" + b"\x00" * 97, id="dtls"),
        pytest.param(b"\x80" + b"\x00" * 99, id="rtp"),
        pytest.param(chrome_like_request(b"nocolon"), id="no-colon"),
        pytest.param(chrome_like_request(b":client"), id="empty-server-ufrag"),
        pytest.param(chrome_like_request(b"server:client")[:-4], id="truncated"),
        pytest.param(build_stun(BINDING, INDICATION, TID, [(USERNAME, b"a:b")]), id="indication"),
        pytest.param(build_stun(BINDING, REQUEST, TID, [(SOFTWARE, b"x")]), id="no-username"),
        pytest.param(
            raw_message(_integrity_placeholder() + attr(USERNAME, b"a:b")),
            id="username-after-integrity",
        ),
        pytest.param(raw_message(attr(USERNAME, b"a:" + b"u" * 511)), id="username-513"),
        pytest.param(raw_message(attr(USERNAME, b"a:b", length=8)), id="username-overruns"),
    ],
)
def test_fast_path_rejects(data: bytes) -> None:
    assert binding_request_server_ufrag(data) is None


def test_fast_path_first_colon_and_skips_attributes() -> None:
    data = build_stun(
        BINDING, REQUEST, TID, [(SOFTWARE, b"abcde"), (PRIORITY, b"1234"), (USERNAME, b"s:c:x")]
    )
    assert binding_request_server_ufrag(data) == b"s"


# --- Properties -----------------------------------------------------------------------------

RESERVED = {USERNAME, MESSAGE_INTEGRITY, MESSAGE_INTEGRITY_SHA256, FINGERPRINT}
attribute_types = st.integers(0, 0xFFFF).filter(lambda t: t not in RESERVED)
attribute_lists = st.lists(st.tuples(attribute_types, st.binary(max_size=40)), max_size=8)
transaction_ids = st.binary(min_size=12, max_size=12)
PROPERTY_SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def stun_like(draw: st.DrawFn) -> bytes:
    """Bytes that get past the header checks often, so the attribute walk gets exercised."""
    body = draw(st.binary(max_size=120))
    if draw(st.booleans()):
        body += b"\x00" * (-len(body) & 3)
    msg_type = draw(st.sampled_from([0x0001, 0x0101, 0x0011])) if draw(st.booleans()) else 0
    length = len(body) if draw(st.booleans()) else draw(st.integers(0, 0xFFFF))
    return struct.pack("!HHI", msg_type, length, MAGIC_COOKIE) + draw(transaction_ids) + body


@st.composite
def mutated_valid(draw: st.DrawFn) -> bytes:
    """A valid request with a few bytes overwritten."""
    data = bytearray(draw(st.sampled_from(ALL_VECTORS).map(load_vector)))
    for _ in range(draw(st.integers(1, 4))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data)


garbage = st.one_of(st.binary(max_size=200), stun_like(), mutated_valid())


@PROPERTY_SETTINGS
@given(
    method=st.integers(0, 0xFFF),
    cls=st.integers(0, 3),
    tid=transaction_ids,
    attributes=attribute_lists,
    username=st.none() | st.binary(max_size=512),
    username_at=st.integers(0, 8),
    key=st.none() | st.binary(min_size=1, max_size=32),
    fingerprint=st.booleans(),
    padding=st.binary(min_size=1, max_size=1),
)
def test_build_parse_round_trip(
    method: int,
    cls: int,
    tid: bytes,
    attributes: list[tuple[int, bytes]],
    username: bytes | None,
    username_at: int,
    key: bytes | None,
    fingerprint: bool,
    padding: bytes,
) -> None:
    if username is not None:
        attributes = [*attributes]
        attributes.insert(username_at, (USERNAME, username))
    data = build_stun(
        method, cls, tid, attributes, integrity_key=key, fingerprint=fingerprint, padding=padding
    )
    msg = parse_stun(data)
    assert (msg.method, msg.cls, msg.transaction_id) == (method, cls, tid)
    trailer = [t for t, _ in msg.attributes[len(attributes) :]]
    assert list(msg.attributes[: len(attributes)]) == attributes
    assert trailer == [MESSAGE_INTEGRITY] * (key is not None) + [FINGERPRINT] * fingerprint
    assert msg.get(USERNAME) == username
    if key is not None:
        verify_message_integrity(data, msg, key)
        with pytest.raises(BadIntegrity):
            verify_message_integrity(data, msg, key + b"x")
    if fingerprint:
        verify_fingerprint(data, msg)


@PROPERTY_SETTINGS
@given(ip=st.ip_addresses(), port=st.integers(0, 0xFFFF), tid=transaction_ids)
def test_xor_address_round_trip(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int, tid: bytes
) -> None:
    value = encode_xor_address(str(ip), port, tid)
    assert len(value) == (8 if ip.version == 4 else 20)
    assert decode_xor_address(value, tid) == (str(ip), port)


@PROPERTY_SETTINGS
@given(data=garbage)
def test_parse_garbage_raises_only_stun_errors(data: bytes) -> None:
    try:
        msg = parse_stun(data)
        _ = msg.username
        repr(msg)
        verify_message_integrity(data, msg, KEY)
        verify_fingerprint(data, msg)
    except StunError:
        pass


@PROPERTY_SETTINGS
@given(value=st.binary(max_size=24), tid=transaction_ids)
def test_address_decode_garbage_raises_only_stun_errors(value: bytes, tid: bytes) -> None:
    try:
        decode_xor_address(value, tid)
    except MalformedStun:
        pass


@PROPERTY_SETTINGS
@given(data=garbage)
def test_fast_path_never_raises_and_agrees_with_parse(data: bytes) -> None:
    ufrag = binding_request_server_ufrag(data)
    if ufrag is None:
        return
    assert ufrag
    try:
        username = parse_stun(data).username
    except StunError:
        return  # the fast path does not look past USERNAME; the full parse may refuse
    assert username is not None
    assert username.encode().split(b":")[0] == ufrag


ufrag_text = st.text(
    alphabet=st.characters(blacklist_characters=":", blacklist_categories=["Cs"]), max_size=60
)


@PROPERTY_SETTINGS
@given(
    server=ufrag_text.filter(bool),
    client=st.text(max_size=60),
    tid=transaction_ids,
    before=attribute_lists,
)
def test_fast_path_agrees_on_valid_requests(
    server: str, client: str, tid: bytes, before: list[tuple[int, bytes]]
) -> None:
    username = f"{server}:{client}"
    encoded = username.encode()
    attributes = [*before, (USERNAME, encoded), (ICE_CONTROLLING, b"\x00" * 8)]
    data = build_stun(BINDING, REQUEST, tid, attributes, integrity_key=KEY, fingerprint=True)
    if len(encoded) > 512:
        assert binding_request_server_ufrag(data) is None
        return
    parsed = parse_stun(data).username
    assert parsed == username
    assert binding_request_server_ufrag(data) == parsed.split(":")[0].encode()
    assert binding_request_server_ufrag(chrome_like_request(encoded, tid=tid)) == server.encode()
