"""The relay's flow table core, driven with a fake clock and no sockets."""

from __future__ import annotations

import pytest

from services.relay.flow_table import (
    HELD,
    MAX_DATAGRAM,
    Deliver,
    Drop,
    FlowTable,
    Forward,
    Recover,
    RelayLimits,
    ReturnToPeer,
)
from shared.wire.proxy_v2 import build_proxy_v2, parse_proxy_v2
from shared.wire.route_token import DestinationFilter
from tests.support import KEYS, binding_request, mint, rtp

T0 = 1_800_000_000.0
INGRESS = ("198.51.100.1", 3478)
TX1 = ("10.0.0.1", 5004)
TX2 = ("10.0.0.2", 5004)
PEER_B = ("10.9.0.1", 3479)
C1 = ("203.0.113.5", 40000)
C2 = ("203.0.113.6", 40001)


def table(**limits: float) -> FlowTable:
    return FlowTable(
        cluster=1,
        keys=KEYS,
        ingress=INGRESS,
        allow_dest=DestinationFilter(["10.0.0.0/16"]),
        peers={2: PEER_B},
        limits=RelayLimits(**limits),  # type: ignore[arg-type]
        now=T0,
    )


def ret(dest_payload: bytes, client: tuple[str, int] = C1) -> bytes:
    return build_proxy_v2(INGRESS, client) + dest_payload


def open_flow(t: FlowTable, client: tuple[str, int] = C1, tx: tuple[str, int] = TX1) -> bytes:
    token = mint(*tx, issued_at=T0)
    d = t.on_client(client, binding_request(token), T0)
    assert isinstance(d, Forward) and d.dest == tx
    return token


def test_first_binding_request_pins_a_pending_flow_framed_to_the_token_destination() -> None:
    t = table()
    token = mint(*TX1, issued_at=T0)
    d = t.on_client(C1, binding_request(token), T0)
    assert isinstance(d, Forward)
    assert d.dest == TX1
    hdr = parse_proxy_v2(d.header)
    assert (hdr.src, hdr.dst) == (C1, INGRESS)
    assert t.pending == 1 and t.established_count == 0
    # later non-STUN datagrams of a pending flow go the same way (DTLS after ICE)
    assert t.on_client(C1, b"\x16\xfe\xfd" + bytes(20), T0 + 0.1) == d


def test_return_from_destination_establishes_and_delivers() -> None:
    t = table()
    open_flow(t)
    d = t.on_return(TX1, ret(b"\x01\x01\x00\x00" + bytes(16)), T0 + 0.01)
    assert d == Deliver(C1, 28)
    assert t.pending == 0 and t.established_count == 1
    assert [f.client for f in t.due_for_store(T0 + 0.02)] == [C1]


def test_unknown_client_non_stun_is_dropped_without_recovery() -> None:
    t = table()
    assert t.on_client(C1, rtp(), T0) == Drop("no_flow")
    assert t.drops["no_flow"] == 1


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        (b"A" * 40, "token_malformed"),
        (mint(*TX1, key_id=2, issued_at=T0)[:-2] + b"AA", "token_bad_mac"),
        (mint(*TX1, issued_at=T0 - 5 * 3600), "token_expired"),
        (mint(*TX1, issued_at=T0 + 120), "token_future"),
        (mint("192.168.0.1", 5004, issued_at=T0), "dest_not_allowed"),
        (mint(*TX1, cluster=9, issued_at=T0), "unknown_cluster"),
        (b"evtj", "token_malformed"),  # RFC 5769's foreign ufrag
    ],
)
def test_bad_tokens_are_counted_drops(token: bytes, reason: str) -> None:
    t = table()
    assert t.on_client(C1, binding_request(token), T0) == Drop(reason)
    assert t.drops[reason] == 1
    assert not t.flows


def test_other_cluster_goes_to_peer_relay_without_allow_list() -> None:
    t = table()
    token = mint("172.16.0.9", 5004, cluster=2, issued_at=T0)  # outside our allow-list
    d = t.on_client(C1, binding_request(token), T0)
    assert isinstance(d, Forward) and d.dest == PEER_B


def test_no_send_to_client_without_flow() -> None:
    t = table()
    assert t.on_return(TX1, ret(b"x"), T0) == Drop("return_no_flow")
    assert t.on_return(TX1, b"garbage" * 5, T0) == Drop("proxy_malformed")


def test_return_from_wrong_source_is_dropped() -> None:
    t = table()
    open_flow(t)
    assert t.on_return(TX2, ret(b"x"), T0) == Drop("return_wrong_source")
    assert t.pending == 1


def test_pending_expires_after_10s_established_after_60s_idle() -> None:
    t = table()
    open_flow(t, C1)
    open_flow(t, C2)
    t.on_return(TX1, ret(b"x", C2), T0)
    assert t.expire(T0 + 10) == 0
    assert t.expire(T0 + 10.5) == 1  # C1 never answered
    assert C1 not in t.flows and C2 in t.flows
    # consent checks every few seconds keep an established flow alive
    for i in range(1, 30):
        t.on_client(C2, rtp(i), T0 + i * 5)
        assert t.expire(T0 + i * 5) == 0
    assert t.expire(T0 + 29 * 5 + 60.5) == 1
    assert not t.flows and t.pending == 0


def test_ice_restart_repoints_only_when_the_new_destination_answers() -> None:
    t = table()
    open_flow(t, C1, TX1)
    t.on_return(TX1, ret(b"x"), T0)
    new = mint(*TX2, issued_at=T0)
    d = t.on_client(C1, binding_request(new), T0 + 1)
    assert isinstance(d, Forward) and d.dest == TX2  # the check reaches the new destination
    assert t.on_client(C1, rtp(), T0 + 1).dest == TX1  # type: ignore[union-attr]
    assert t.on_return(TX1, ret(b"media"), T0 + 1) == Deliver(C1, 28)  # old still works
    # a retransmitted check with the new token goes to the new place again
    assert t.on_client(C1, binding_request(new), T0 + 1.5).dest == TX2  # type: ignore[union-attr]
    assert t.on_return(TX2, ret(b"resp"), T0 + 2) == Deliver(C1, 28)
    assert t.on_client(C1, rtp(), T0 + 2).dest == TX2  # type: ignore[union-attr]
    assert t.on_return(TX1, ret(b"late"), T0 + 2) == Drop("return_wrong_source")
    assert [f.token for f in t.due_for_store(T0 + 3)] == [new]


def test_spoofed_restart_that_never_answers_changes_nothing() -> None:
    t = table()
    open_flow(t, C1, TX1)
    t.on_return(TX1, ret(b"x"), T0)
    t.on_client(C1, binding_request(mint(*TX2, issued_at=T0)), T0 + 1)
    t.expire(T0 + 12)
    flow = t.flows[C1]
    assert flow.candidate is None and flow.dest == TX1
    assert t.on_return(TX2, ret(b"x"), T0 + 12) == Drop("return_wrong_source")


def test_restart_to_same_destination_just_updates_token() -> None:
    t = table()
    open_flow(t, C1, TX1)
    t.on_return(TX1, ret(b"x"), T0)
    t.due_for_store(T0)
    new = mint(*TX1, issued_at=T0)
    assert t.on_client(C1, binding_request(new), T0 + 1).dest == TX1  # type: ignore[union-attr]
    assert t.flows[C1].token == new and t.flows[C1].candidate is None
    assert [f.token for f in t.due_for_store(T0 + 1)] == [new]


def test_invalid_token_from_established_client_is_dropped_and_flow_kept() -> None:
    t = table()
    open_flow(t)
    t.on_return(TX1, ret(b"x"), T0)
    assert t.on_client(C1, binding_request(b"B" * 40), T0) == Drop("token_malformed")
    assert t.on_client(C1, rtp(), T0).dest == TX1  # type: ignore[union-attr]


def test_pending_caps_per_ip_and_global() -> None:
    t = table(max_pending_per_ip=2, max_pending=3, new_flow_rate=1000, new_flow_burst=1000)
    for port in (1, 2):
        assert isinstance(
            t.on_client(("203.0.113.9", port), binding_request(mint(*TX1, issued_at=T0)), T0),
            Forward,
        )
    assert t.on_client(("203.0.113.9", 3), binding_request(mint(*TX1, issued_at=T0)), T0) == Drop(
        "pending_per_ip"
    )
    assert isinstance(
        t.on_client(("203.0.113.10", 1), binding_request(mint(*TX1, issued_at=T0)), T0), Forward
    )
    assert t.on_client(("203.0.113.11", 1), binding_request(mint(*TX1, issued_at=T0)), T0) == Drop(
        "pending_full"
    )
    # an answer frees a pending slot
    t.on_return(TX1, ret(b"x", ("203.0.113.9", 1)), T0)
    assert isinstance(
        t.on_client(("203.0.113.11", 1), binding_request(mint(*TX1, issued_at=T0)), T0), Forward
    )


def test_table_cap() -> None:
    t = table(max_flows=2, new_flow_rate=1000, new_flow_burst=1000)
    open_flow(t, C1)
    open_flow(t, C2)
    d = t.on_client(("203.0.113.99", 1), binding_request(mint(*TX1, issued_at=T0)), T0)
    assert d == Drop("table_full")


def test_new_flow_rate_limit_per_source_ip() -> None:
    t = table(new_flow_rate=1, new_flow_burst=3, max_pending_per_ip=100)
    results = [
        t.on_client(("203.0.113.7", p), binding_request(mint(*TX1, issued_at=T0)), T0)
        for p in range(5)
    ]
    assert [isinstance(r, Forward) for r in results] == [True, True, True, False, False]
    assert t.drops["rate_limited"] == 2
    # another source is not affected; the limited one refills at 1/s
    assert isinstance(t.on_client(C2, binding_request(mint(*TX1, issued_at=T0)), T0), Forward)
    d = t.on_client(("203.0.113.7", 9), binding_request(mint(*TX1, issued_at=T0)), T0 + 1.01)
    assert isinstance(d, Forward)


def test_oversize_dropped_both_ways() -> None:
    t = table()
    open_flow(t)
    assert t.on_client(C1, bytes(MAX_DATAGRAM + 1), T0) == Drop("oversize")
    assert t.on_return(TX1, ret(bytes(MAX_DATAGRAM + 1)), T0) == Drop("oversize")
    assert isinstance(t.on_client(C1, bytes([0x80]) + bytes(MAX_DATAGRAM - 1), T0), Forward)


def test_second_hop_forwards_unchanged_and_returns_to_first_hop() -> None:
    b = FlowTable(
        cluster=2,
        keys=KEYS,
        ingress=("192.0.2.2", 3478),
        allow_dest=DestinationFilter(["10.0.0.0/16"]),
        peers={1: ("10.9.0.2", 3479)},
        now=T0,
    )
    a_worker = ("10.9.0.2", 45000)
    token = mint(*TX2, cluster=2, issued_at=T0)
    framed = build_proxy_v2(C1, INGRESS) + binding_request(token)
    d = b.on_peer(a_worker, framed, T0)
    assert d == Forward(TX2, b"", 28)
    # the transceiver answers with src = A's ingress, dst = the client
    assert b.on_return(TX2, build_proxy_v2(INGRESS, C1) + b"resp", T0) == ReturnToPeer(a_worker)
    media = build_proxy_v2(C1, INGRESS) + rtp()
    assert b.on_peer(a_worker, media, T0) == Forward(TX2, b"", 28)
    # a token for yet another cluster is never forwarded a second time
    other = build_proxy_v2(C2, INGRESS) + binding_request(mint(*TX2, cluster=1, issued_at=T0))
    assert b.on_peer(a_worker, other, T0) == Drop("hop_loop")
    # and strangers cannot use the peer path
    assert b.on_peer(("203.0.113.1", 1), framed, T0) == Drop("peer_not_allowed")


def test_recovery_holds_datagrams_then_replays_them() -> None:
    t = table()
    t.recovery = True
    assert t.on_client(C1, rtp(1), T0) == Recover(C1, None)
    assert t.on_client(C1, rtp(2), T0) is HELD
    token = mint(*TX1, issued_at=T0)
    out = t.recovered(C1, token, T0 + 0.002)
    assert [d for _, d in out] == [Forward(TX1, build_proxy_v2(C1, INGRESS))] * 2
    assert [data for data, _ in out] == [rtp(1), rtp(2)]
    assert t.flows[C1].established and t.recoveries == 1
    assert t.on_return(TX1, ret(b"x"), T0) == Deliver(C1, 28)


def test_recovery_miss_is_negative_cached_and_reverified() -> None:
    t = table()
    t.recovery = True
    assert isinstance(t.on_client(C1, rtp(), T0), Recover)
    assert t.recovered(C1, None, T0) == []
    assert t.on_client(C1, rtp(), T0 + 1) == Drop("no_flow")
    assert isinstance(t.on_client(C1, rtp(), T0 + 6), Recover)
    # a cached token that no longer verifies (here: now outside our allow-list) is refused
    assert t.recovered(C1, mint("10.1.0.1", 1, issued_at=T0), T0 + 6) == []
    assert C1 not in t.flows


def test_recovery_lookups_are_rate_limited() -> None:
    t = table(lookup_rate=2)
    t.recovery = True
    decisions = [t.on_client(("203.0.113.8", p), rtp(), T0) for p in range(4)]
    assert [type(d).__name__ for d in decisions] == ["Recover", "Recover", "Drop", "Drop"]


def test_store_refresh_only_while_traffic_flows() -> None:
    t = table()
    open_flow(t)
    t.on_return(TX1, ret(b"x"), T0)
    assert len(t.due_for_store(T0)) == 1
    assert t.due_for_store(T0 + 5) == []
    t.on_client(C1, rtp(), T0 + 6)
    t.expire(T0 + 10)  # the sweep notices the flow is due
    assert len(t.due_for_store(T0 + 10)) == 1
    t.expire(T0 + 25)
    assert t.due_for_store(T0 + 25) == []  # no traffic since the last write


def test_incremental_sweep_covers_every_flow_once_per_pass() -> None:
    t = table(new_flow_rate=1e6, new_flow_burst=1e6, max_pending_per_ip=1000)
    for port in range(100):
        t.on_client(("203.0.113.50", 1000 + port), binding_request(mint(*TX1, issued_at=T0)), T0)
    assert t.size == 100
    later = T0 + 11  # all pending flows are past their 10 s
    assert [t.sweep(later, budget=30) for _ in range(4)] == [30, 30, 30, 10]
    assert t.size == 0 and t.pending == 0
