"""Who the client is (`services/signaling/client_address.py`): the peer, or the address a
trusted proxy forwarded for, read right to left; never the client's own word."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from firsthop.services.signaling.client_address import MAX_HOPS, ClientAddresses

PROXIES = ClientAddresses(["10.0.0.0/8", "fd00::/8"])


def test_without_trusted_proxies_the_header_is_ignored() -> None:
    assert ClientAddresses().of("10.1.2.3", ["203.0.113.9"]) == "10.1.2.3"


def test_a_peer_that_is_not_trusted_is_the_client_whatever_it_sends() -> None:
    assert PROXIES.of("198.51.100.7", ["203.0.113.9"]) == "198.51.100.7"


def test_a_trusted_proxy_names_the_client_and_prepended_entries_change_nothing() -> None:
    assert PROXIES.of("10.1.2.3", ["203.0.113.9"]) == "203.0.113.9"
    spoofed = ["1.2.3.4, 5.6.7.8, 203.0.113.9"]  # the client wrote the first two itself
    assert PROXIES.of("10.1.2.3", spoofed) == "203.0.113.9"
    chain = ["203.0.113.9, 10.9.9.9", "10.8.8.8"]  # proxies behind proxies, two headers
    assert PROXIES.of("10.1.2.3", chain) == "203.0.113.9"
    assert PROXIES.of("10.1.2.3", ["[2001:db8::1]:443"]) == "2001:db8::1"
    assert PROXIES.of("10.1.2.3", ["::ffff:203.0.113.9"]) == "203.0.113.9"
    assert PROXIES.of("::ffff:10.1.2.3", ["203.0.113.9:5555"]) == "203.0.113.9"


def test_a_region_is_believed_from_a_trusted_proxy_only_once_any_is_trusted() -> None:
    assert PROXIES.region_of("10.1.2.3", "eu") == "eu"
    assert PROXIES.region_of("[fd00::1]:443", "eu") == "eu"
    for peer in ("198.51.100.7", "", None, "not an address"):
        assert PROXIES.region_of(peer, "eu") is None
    assert PROXIES.region_of("10.1.2.3", None) is None
    assert ClientAddresses().region_of("198.51.100.7", "eu") == "eu"  # none trusted: anyone's


def test_garbage_ends_the_walk_at_the_hop_before_it() -> None:
    assert PROXIES.of("10.1.2.3", ["203.0.113.9, not-an-address"]) == "10.1.2.3"
    assert PROXIES.of("10.1.2.3", ["not-an-address, 10.5.5.5"]) == "10.5.5.5"
    assert PROXIES.of("10.1.2.3", []) == "10.1.2.3"  # a trusted proxy that said nothing


def test_only_the_last_hops_are_read() -> None:
    many = ", ".join(["203.0.113.9"] + ["10.0.0.1"] * (MAX_HOPS + 5))
    assert PROXIES.of("10.1.2.3", [many]) == "10.0.0.1"  # the client is past what is read


@given(st.lists(st.text(max_size=60), max_size=5), st.text(max_size=40))
def test_any_header_gives_an_address_without_raising(values: list[str], peer: str) -> None:
    got = PROXIES.of(peer, values)
    assert got == peer or got.count(".") == 3 or ":" in got
