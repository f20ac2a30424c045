"""The relay's flow table with IPv6 clients, ingresses and destinations (issue #12 item 4),
driven with a fake clock and no sockets; and the address helpers it counts by."""

from __future__ import annotations

import pytest

from firsthop.services.relay.config import RelayConfig, config_from_args, per_family
from firsthop.services.relay.flow_table import FlowTable
from firsthop.services.relay.flows import Deliver, Drop, Forward, RelayLimits
from firsthop.shared.address import normalize_host, source_key
from firsthop.shared.wire.proxy_v2 import (
    FAMILY_INET6_DGRAM,
    FAMILY_INET6_STREAM,
    FAMILY_INET_DGRAM,
    build_proxy_v2,
    parse_proxy_v2,
)
from firsthop.shared.wire.route_token import DestinationFilter
from tests.support import KEYS, binding_request, binding_success, mint, rtp
from tests.unit.test_flow_table import C1 as C4
from tests.unit.test_flow_table import INGRESS as INGRESS4
from tests.unit.test_flow_table import T0
from tests.unit.test_flow_table import TX1 as TX4

INGRESS6 = ("2001:db8:ffff::1", 3478)
TCP4 = (INGRESS4[0], 443)
TCP6 = (INGRESS6[0], 443)
TX6 = ("fd00::5", 5004)
C6 = ("2001:db8:1:2::5", 40000)


def dual(limits: RelayLimits | None = None, *, v6: bool = True) -> FlowTable:
    return FlowTable(
        cluster=1,
        keys=KEYS,
        ingress=INGRESS4,
        ingress_other=INGRESS6 if v6 else None,
        ingress_tcp=TCP4,
        ingress_tcp_other=TCP6 if v6 else None,
        allow_dest=DestinationFilter(["10.0.0.0/16", "fd00::/8"]),
        limits=limits or RelayLimits(),
        now=T0,
    )


def test_a_v6_client_is_framed_in_ipv6_to_the_v6_ingress_and_answered() -> None:
    t = dual()
    token = mint(*TX4, issued_at=T0)
    d = t.on_client(C6, binding_request(token), T0)
    assert isinstance(d, Forward) and d.dest == TX4
    assert d.header[13] == FAMILY_INET6_DGRAM  # PROXY v2 §2.2: AF_INET6, DGRAM
    hdr = parse_proxy_v2(d.header)
    assert (hdr.src, hdr.dst) == (C6, INGRESS6)
    back = t.on_return(TX4, build_proxy_v2(INGRESS6, C6) + binding_success(), T0)
    assert back == Deliver(C6, 52)
    # established: media both ways, the fast paths included
    assert t.known_client(C6, 160, rtp()[0], T0) is t.flows[C6]
    flow = t.known_return(build_proxy_v2(INGRESS6, C6), TX4, 160, T0)
    assert flow is not None and flow.client == C6


def test_v4_and_v6_clients_side_by_side_each_in_its_own_family() -> None:
    t = dual()
    token = mint(*TX4, issued_at=T0)
    d4 = t.on_client(C4, binding_request(token), T0)
    d6 = t.on_client(C6, binding_request(token), T0)
    assert isinstance(d4, Forward) and isinstance(d6, Forward)
    assert d4.header[13] == FAMILY_INET_DGRAM and len(d4.header) == 28
    assert d6.header[13] == FAMILY_INET6_DGRAM and len(d6.header) == 52
    assert parse_proxy_v2(d4.header).dst == INGRESS4
    assert t.on_return(TX4, build_proxy_v2(INGRESS4, C4) + binding_success(), T0) == Deliver(C4, 28)
    assert t.on_return(TX4, build_proxy_v2(INGRESS6, C6) + binding_success(), T0) == Deliver(C6, 52)
    assert t.established_count == 2


def test_a_v6_ice_tcp_client_is_marked_stream_in_ipv6() -> None:
    t = dual()
    d = t.on_tcp_client(C6, binding_request(mint(*TX4, issued_at=T0)), T0)
    assert isinstance(d, Forward) and d.header[13] == FAMILY_INET6_STREAM
    assert parse_proxy_v2(d.header).dst == TCP6
    ret = build_proxy_v2(TCP6, C6, stream=True) + binding_success()
    assert t.on_return(TX4, ret, T0) == Deliver(C6, 52, stream=True)


def test_a_client_of_a_family_without_an_ingress_is_a_counted_drop() -> None:
    t = dual(v6=False)
    d = t.on_client(C6, binding_request(mint(*TX4, issued_at=T0)), T0)
    assert d == Drop("ingress_family")
    assert t.drops["ingress_family"] == 1 and not t.flows


def test_a_v6_transceiver_token_routes_there_if_the_allow_list_has_it() -> None:
    t = dual()
    d = t.on_client(C4, binding_request(mint(*TX6, issued_at=T0)), T0)
    assert isinstance(d, Forward) and d.dest == TX6
    # a v4 client toward a v6 transceiver: the frame is the client's family (v4 ingress)
    assert parse_proxy_v2(d.header).src == C4
    refused = t.on_client(C6, binding_request(mint("fe80::1", 5004, issued_at=T0)), T0)
    assert refused == Drop("dest_not_allowed")
    # a v4-mapped destination is judged as IPv6: no v6 CIDR covers it, so refused
    mapped = t.on_client(
        ("2001:db8:9::1", 1), binding_request(mint("::ffff:10.0.0.1", 5004, issued_at=T0)), T0
    )
    assert mapped == Drop("dest_not_allowed")


def test_pending_flows_per_source_count_an_ipv6_slash_64_as_one_source() -> None:
    t = dual(RelayLimits(max_pending_per_ip=3, new_flow_burst=1000))
    token = mint(*TX4, issued_at=T0)
    # one host rotating through its /64: one budget
    for i in range(3):
        assert isinstance(
            t.on_client((f"2001:db8:1:2::{i + 1:x}", 1), binding_request(token), T0), Forward
        )
    assert t.on_client(("2001:db8:1:2:ffff::9", 1), binding_request(token), T0) == Drop(
        "pending_per_ip"
    )
    # the next /64 is somebody else
    other = mint(*TX4, issued_at=T0)
    assert isinstance(t.on_client(("2001:db8:1:3::1", 1), binding_request(other), T0), Forward)
    assert t.pending_per_ip["2001:db8:1:2::/64"] == 3
    t.expire(T0 + 11)
    assert not t.pending_per_ip  # released by /64 as they expire


def test_new_flow_rate_counts_an_ipv6_slash_64_as_one_source() -> None:
    t = dual(RelayLimits(new_flow_rate=1, new_flow_burst=2, max_pending_per_token=100))
    token = mint(*TX4, issued_at=T0)
    got = [
        t.on_client((f"2001:db8:7:7::{i + 1:x}", 1), binding_request(token), T0) for i in range(4)
    ]
    assert [type(d) for d in got] == [Forward, Forward, Drop, Drop]
    assert t.drops["rate_limited"] == 2


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("203.0.113.5", "203.0.113.5"),
        ("2001:db8:1:2::5", "2001:db8:1:2::/64"),
        ("2001:0DB8:0001:0002:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
        ("::1", "::/64"),
        ("::ffff:192.0.2.1", "192.0.2.1"),  # a v4 client seen through a v6 socket
        ("fe80::1%eth0", "fe80::/64"),
        ("not-an-ip:", "not-an-ip:"),
    ],
)
def test_source_key(host: str, key: str) -> None:
    assert source_key(host) == key


def test_normalize_host_writes_python_s_compressed_form_and_unmaps_v4() -> None:
    assert normalize_host("2001:0DB8:0:0::0001") == "2001:db8::1"
    assert normalize_host("::ffff:192.0.2.1") == "192.0.2.1"
    assert normalize_host("192.0.2.1") == "192.0.2.1"
    assert normalize_host("relay.example") == "relay.example"


def test_listen_public_and_listen_tcp_take_one_address_per_family() -> None:
    assert per_family(["0.0.0.0:3478,[::]:3478"], "--listen") == [
        ("0.0.0.0", 3478),
        ("::", 3478),
    ]
    assert per_family(["[::1]:1", "127.0.0.1:2"], "--listen") == [("::1", 1), ("127.0.0.1", 2)]
    with pytest.raises(ValueError, match="one address per IP family"):
        per_family(["10.0.0.1:3478", "10.0.0.2:3478"], "--listen")
    config = RelayConfig(
        listen=("0.0.0.0", 3478),
        listen_other=("::", 3478),
        listen_tcp=("::", 443),
        public=("2001:db8::7", 3478),
    )
    # the v4 ingress is the --listen itself; the v6 one is --public; TCP takes --public's host
    assert config.ingresses == [("0.0.0.0", 3478), ("2001:db8::7", 3478)]
    assert config.ingresses_tcp == [("2001:db8::7", 443)]
    assert RelayConfig.from_json(config.to_json()) == config


def test_relay_flags_parse_dual_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from firsthop.services.relay import config as relay_config

    monkeypatch.setenv("FIRSTHOP_LISTEN", "0.0.0.0:3478,[::]:3478")
    parser = argparse.ArgumentParser()
    relay_config.register(parser.add_subparsers(), "relay")
    args = parser.parse_args(
        ["relay", "--route-keys", "1=" + "A" * 43 + "=", "--listen-tcp", "[::]:443"]
    )
    config = config_from_args(args)
    assert config.listens == [("0.0.0.0", 3478), ("::", 3478)]
    assert config.listens_tcp == [("::", 443)]
    with pytest.raises(SystemExit, match="no --listen of its IP family"):
        config_from_args(
            parser.parse_args(
                [
                    "relay",
                    "--route-keys",
                    "1=" + "A" * 43 + "=",
                    "--listen",
                    "0.0.0.0:1",
                    "--public",
                    "[2001:db8::1]:1",
                ]
            )
        )


def test_configured_addresses_are_written_canonically() -> None:
    from firsthop.services.signaling.config import parse_ingress

    # a v4-mapped --listen is an IPv4 one (and binds an IPv4 socket)
    assert per_family(["[2001:0DB8::0005]:3478", "[::ffff:192.0.2.1]:1"], "--listen") == [
        ("2001:db8::5", 3478),
        ("192.0.2.1", 1),
    ]
    assert parse_ingress(["a=[2001:0DB8::5]:3478", "a=192.0.2.1:3478"], "a") == {
        "a": ["[2001:db8::5]:3478", "192.0.2.1:3478"]
    }
