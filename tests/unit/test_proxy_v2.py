from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firsthop.shared.address import Address
from firsthop.shared.wire import proxy_v2 as pv


def test_ipv4_layout() -> None:
    hdr = pv.build_proxy_v2(("203.0.113.7", 50000), ("198.51.100.1", 3478))
    assert hdr == (
        b"\r\n\r\n\x00\r\nQUIT\n"
        + b"\x21\x12\x00\x0c"
        + bytes([203, 0, 113, 7, 198, 51, 100, 1])
        + (50000).to_bytes(2, "big")
        + (3478).to_bytes(2, "big")
    )
    parsed = pv.parse_proxy_v2(hdr + b"payload")
    assert parsed.src == ("203.0.113.7", 50000)
    assert parsed.dst == ("198.51.100.1", 3478)
    assert (hdr + b"payload")[parsed.payload_offset :] == b"payload"


def test_ipv6_layout() -> None:
    hdr = pv.build_proxy_v2(("2001:db8::1", 1), ("2001:db8::2", 2))
    assert len(hdr) == 52
    assert hdr[12:16] == b"\x21\x22\x00\x24"
    parsed = pv.parse_proxy_v2(memoryview(hdr + b"x"))
    assert parsed == pv.ProxyHeader(("2001:db8::1", 1), ("2001:db8::2", 2), 52, 52)


@pytest.mark.parametrize(
    ("src", "dst", "family", "length"),
    [
        (("203.0.113.7", 50000), ("198.51.100.1", 443), 0x11, 28),
        (("2001:db8::1", 1), ("2001:db8::2", 443), 0x21, 52),
    ],
)
def test_stream_marks_a_tcp_client(src: Address, dst: Address, family: int, length: int) -> None:
    hdr = pv.build_proxy_v2(src, dst, stream=True)
    assert hdr[13] == family  # 0x11 TCP over IPv4, 0x21 TCP over IPv6 (§2.2)
    assert hdr[:13] + bytes([family + 1]) + hdr[14:] == pv.build_proxy_v2(src, dst)
    assert pv.plain_header_length(hdr) == length
    parsed = pv.parse_proxy_v2(hdr + b"x")
    assert parsed == pv.ProxyHeader(src, dst, length, length, stream=True)
    assert not pv.parse_proxy_v2(pv.build_proxy_v2(src, dst)).stream
    tlv = pv.revocation_tlv(b"t" * 40)
    with_tlv = pv.parse_proxy_v2(pv.build_proxy_v2(src, dst, tlv, stream=True))
    assert with_tlv.stream and with_tlv.payload_offset == length + len(tlv)


def test_mixed_family_uses_mapped_v6() -> None:
    parsed = pv.parse_proxy_v2(pv.build_proxy_v2(("10.0.0.1", 1), ("2001:db8::2", 2)))
    assert parsed.src == ("::ffff:10.0.0.1", 1)


def test_tlvs_are_skipped() -> None:
    hdr = bytearray(pv.build_proxy_v2(("10.0.0.1", 1), ("10.0.0.2", 2)))
    hdr[14:16] = (12 + 7).to_bytes(2, "big")
    data = bytes(hdr) + b"\x04\x00\x04abcd" + b"PAYLOAD"
    parsed = pv.parse_proxy_v2(data)
    assert data[parsed.payload_offset :] == b"PAYLOAD"


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\r\n\r\n\x00\r\nQUIT",
        b"\r\n\r\n\x00\r\nQUIT\n\x20\x12\x00\x0c" + bytes(12),  # LOCAL command
        b"\r\n\r\n\x00\r\nQUIT\n\x11\x12\x00\x0c" + bytes(12),  # version 1
        b"\r\n\r\n\x00\r\nQUIT\n\x21\x13\x00\x0c" + bytes(12),  # AF_INET, SOCK_SEQPACKET
        b"\r\n\r\n\x00\r\nQUIT\n\x21\x12\x00\x0c" + bytes(11),  # truncated
        b"\r\n\r\n\x00\r\nQUIT\n\x21\x12\x00\x08" + bytes(8),  # block too short
        b"\r\n\r\n\x00\r\nQUIT\n\x21\x22\x00\x0c" + bytes(12),  # v6 block too short
        b"\x00\x01\x00\x00\x21\x12\xa4\x42" + bytes(12),  # a STUN packet
    ],
)
def test_malformed(data: bytes) -> None:
    with pytest.raises(pv.MalformedProxy):
        pv.parse_proxy_v2(data)


addr4 = st.tuples(st.ip_addresses(v=4).map(str), st.integers(0, 65535))
addr6 = st.tuples(st.ip_addresses(v=6).map(str), st.integers(0, 65535))


@given(st.one_of(st.tuples(addr4, addr4), st.tuples(addr6, addr6)), st.binary(max_size=64))
def test_round_trip(pair: tuple[Address, Address], payload: bytes) -> None:
    import ipaddress

    src, dst = pair
    data = pv.build_proxy_v2(src, dst) + payload
    parsed = pv.parse_proxy_v2(data)

    def norm(a: Address) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
        return ipaddress.ip_address(a[0]), a[1]

    assert (norm(parsed.src), norm(parsed.dst)) == (norm(src), norm(dst))
    assert data[parsed.payload_offset :] == payload


@given(st.binary(max_size=80))
def test_garbage_raises_only_proxy_error(data: bytes) -> None:
    try:
        pv.parse_proxy_v2(data)
    except pv.ProxyError:
        pass


@given(st.binary(max_size=60))
def test_garbage_after_signature(rest: bytes) -> None:
    try:
        pv.parse_proxy_v2(pv.SIGNATURE + rest)
    except pv.ProxyError:
        pass


def test_tlvs_round_trip_and_our_revocation_tlv() -> None:
    token = b"AQEAAQQKAAABE4xrSdIAZOFZ9HR8rmRJPUejIrUM"
    tlvs = pv.encode_tlv(0x04, b"noop") + pv.revocation_tlv(token)
    hdr = pv.build_proxy_v2(("10.0.0.1", 1), ("10.0.0.2", 2), tlvs)
    parsed = pv.parse_proxy_v2(hdr + b"payload")
    assert (parsed.tlv_offset, parsed.payload_offset) == (28, 28 + len(tlvs))
    assert pv.parse_tlvs(hdr, parsed) == [(0x04, b"noop"), (0xE0, b"\x01" + token)]
    assert pv.revoked_token(hdr, parsed) == token
    plain = pv.build_proxy_v2(("10.0.0.1", 1), ("10.0.0.2", 2))
    assert pv.revoked_token(plain, pv.parse_proxy_v2(plain)) is None
    v6 = pv.build_proxy_v2(("2001:db8::1", 1), ("2001:db8::2", 2), pv.revocation_tlv(token))
    assert pv.revoked_token(v6, pv.parse_proxy_v2(v6)) == token


@given(st.binary(max_size=80))
def test_garbage_tlvs_never_raise_from_revoked_token(tlvs: bytes) -> None:
    hdr = bytearray(pv.build_proxy_v2(("10.0.0.1", 1), ("10.0.0.2", 2)))
    hdr[14:16] = (12 + len(tlvs)).to_bytes(2, "big")
    data = bytes(hdr) + tlvs
    parsed = pv.parse_proxy_v2(data)
    token = pv.revoked_token(data, parsed)
    assert token is None or 0 < len(token) <= pv.MAX_TOKEN_TLV
