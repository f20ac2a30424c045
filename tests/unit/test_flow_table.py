"""The relay's flow table core, driven with a fake clock and no sockets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firsthop.services.relay.flow_table import FlowTable
from firsthop.services.relay.flows import (
    CONSUMED,
    HELD,
    MAX_DATAGRAM,
    Decision,
    Deliver,
    Drop,
    Forward,
    Recover,
    RelayLimits,
    ReturnToPeer,
)
from firsthop.shared.address import Address
from firsthop.shared.wire.proxy_v2 import build_proxy_v2, parse_proxy_v2, revocation_tlv
from firsthop.shared.wire.route_token import DestinationFilter
from tests.support import KEYS, binding_request, binding_success, mint, rtp

OK = binding_success()

T0 = 1_800_000_000.0
INGRESS = ("198.51.100.1", 3478)
TX1 = ("10.0.0.1", 5004)
TX2 = ("10.0.0.2", 5004)
PEER_B = ("10.9.0.1", 3479)
C1 = ("203.0.113.5", 40000)
C2 = ("203.0.113.6", 40001)


def table(limits: RelayLimits | None = None) -> FlowTable:
    return FlowTable(
        cluster=1,
        keys=KEYS,
        ingress=INGRESS,
        allow_dest=DestinationFilter(["10.0.0.0/16"]),
        peers={2: PEER_B},
        limits=limits or RelayLimits(),
        now=T0,
    )


def ret(dest_payload: bytes, client: tuple[str, int] = C1) -> bytes:
    return build_proxy_v2(INGRESS, client) + dest_payload


def ret_tcp(payload: bytes, client: tuple[str, int] = C1) -> bytes:
    return build_proxy_v2(INGRESS, client, stream=True) + payload


def forwarded_to(d: Decision) -> Address:
    """Where a decision forwards to (and that it is a `Forward`)."""
    assert isinstance(d, Forward), d
    return d.dest


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
    d = t.on_return(TX1, ret(OK), T0 + 0.01)
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
    ids=lambda value: value if isinstance(value, str) else "token",  # (tokens are random)
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
    t.on_return(TX1, ret(OK, C2), T0)
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
    t.on_return(TX1, ret(OK), T0)
    new = mint(*TX2, issued_at=T0)
    d = t.on_client(C1, binding_request(new), T0 + 1)
    assert isinstance(d, Forward) and d.dest == TX2  # the check reaches the new destination
    assert forwarded_to(t.on_client(C1, rtp(), T0 + 1)) == TX1
    assert t.on_return(TX1, ret(b"media"), T0 + 1) == Deliver(C1, 28)  # old still works
    # a retransmitted check with the new token goes to the new place again
    assert forwarded_to(t.on_client(C1, binding_request(new), T0 + 1.5)) == TX2
    assert t.on_return(TX2, ret(b"media"), T0 + 2) == Drop("return_unconfirmed")
    assert t.on_return(TX2, ret(OK), T0 + 2) == Deliver(C1, 28)
    assert forwarded_to(t.on_client(C1, rtp(), T0 + 2)) == TX2
    assert t.on_return(TX1, ret(b"late"), T0 + 2) == Drop("return_wrong_source")
    assert [f.token for f in t.due_for_store(T0 + 3)] == [new]


def test_spoofed_restart_that_never_answers_changes_nothing() -> None:
    t = table()
    open_flow(t, C1, TX1)
    t.on_return(TX1, ret(OK), T0)
    t.on_client(C1, binding_request(mint(*TX2, issued_at=T0)), T0 + 1)
    t.expire(T0 + 12)
    flow = t.flows[C1]
    assert flow.candidate is None and flow.dest == TX1
    assert t.on_return(TX2, ret(b"x"), T0 + 12) == Drop("return_wrong_source")


def test_restart_to_same_destination_just_updates_token() -> None:
    t = table()
    open_flow(t, C1, TX1)
    t.on_return(TX1, ret(OK), T0)
    t.due_for_store(T0)
    new = mint(*TX1, issued_at=T0)
    assert forwarded_to(t.on_client(C1, binding_request(new), T0 + 1)) == TX1
    assert t.flows[C1].token == new and t.flows[C1].candidate is None
    assert [f.token for f in t.due_for_store(T0 + 1)] == [new]


def test_invalid_token_from_established_client_is_dropped_and_flow_kept() -> None:
    t = table()
    open_flow(t)
    t.on_return(TX1, ret(OK), T0)
    assert t.on_client(C1, binding_request(b"B" * 40), T0) == Drop("token_malformed")
    assert forwarded_to(t.on_client(C1, rtp(), T0)) == TX1


def test_pending_caps_per_ip_and_global() -> None:
    t = table(
        RelayLimits(max_pending_per_ip=2, max_pending=3, new_flow_rate=1000, new_flow_burst=1000)
    )
    token = mint(*TX1, issued_at=T0)
    for port in (1, 2):
        assert isinstance(t.on_client(("203.0.113.9", port), binding_request(token), T0), Forward)
    assert t.on_client(("203.0.113.9", 3), binding_request(token), T0) == Drop("pending_per_ip")
    assert isinstance(t.on_client(("203.0.113.10", 1), binding_request(token), T0), Forward)
    # the pool is full, and held by this very token: nothing fairer to give way
    assert t.on_client(("203.0.113.11", 1), binding_request(token), T0) == Drop("pending_full")
    # an answer frees a pending slot
    t.on_return(TX1, ret(OK, ("203.0.113.9", 1)), T0)
    assert isinstance(t.on_client(("203.0.113.11", 1), binding_request(token), T0), Forward)


def spoofed(i: int) -> tuple[str, int]:
    return (f"198.18.{i // 250}.{i % 250 + 1}", 1024 + i)


def test_one_token_opens_at_most_its_cap_of_pending_flows_from_spoofed_sources() -> None:
    t = table(RelayLimits(new_flow_rate=1000, new_flow_burst=1000))
    token = mint(*TX1, issued_at=T0)
    decisions = [t.on_client(spoofed(i), binding_request(token), T0) for i in range(200)]
    assert sum(isinstance(d, Forward) for d in decisions) == 8
    assert t.drops["pending_per_token"] == 192 and t.pending == 8


def test_a_full_pending_pool_makes_room_for_a_new_calls_token() -> None:
    t = table(RelayLimits(max_pending=20, new_flow_rate=1000, new_flow_burst=1000))
    flood = [mint(*TX1, issued_at=T0) for _ in range(10)]  # many tokens, 2 flows each
    for i in range(20):
        assert isinstance(t.on_client(spoofed(i), binding_request(flood[i % 10]), T0), Forward)
    assert t.pending == 20
    oldest = t.flows[spoofed(0)]
    new_call = mint(*TX1, issued_at=T0)
    assert isinstance(t.on_client(C1, binding_request(new_call), T0 + 1), Forward)
    assert t.pending == 20 and C1 in t.flows and not t._is_live(oldest)
    assert t.evictions["pending_fair_share"] == 1
    # the new call's answer establishes it (a slot frees), and its next pair gets that slot
    assert t.on_return(TX1, ret(OK), T0 + 1.05) == Deliver(C1, 28)
    assert isinstance(t.on_client(C2, binding_request(new_call), T0 + 1.1), Forward)
    # but a flood token holding as many as the fullest gets no one's slot
    assert t.on_client(spoofed(99), binding_request(flood[3]), T0 + 1.2) == Drop("pending_full")
    # and a forged token takes nobody's slot (the victim yields only to a verified token)
    forged = new_call[:-4] + b"AAAA"
    assert t.on_client(spoofed(98), binding_request(forged), T0 + 1.3) == Drop("token_bad_mac")
    assert t.pending == 20 and t.evictions["pending_fair_share"] == 1


def test_established_flows_per_token_are_capped_the_least_recently_used_yields() -> None:
    t = table(RelayLimits(new_flow_rate=1000, new_flow_burst=1000))
    token = mint(*TX1, issued_at=T0)
    for i in range(8):
        t.on_client(spoofed(i), binding_request(token), T0 + i)
        assert t.on_return(TX1, ret(OK, spoofed(i)), T0 + i) == Deliver(spoofed(i), 28)
    t.on_client(spoofed(0), rtp(), T0 + 20)  # the first path is the busiest, not the LRU
    t.on_client(C1, binding_request(token), T0 + 21)  # a NAT rebinding: a ninth path
    assert t.on_return(TX1, ret(OK), T0 + 21) == Deliver(C1, 28)
    assert t.established_count == 8 and spoofed(1) not in t.flows and spoofed(0) in t.flows
    assert t.evictions["established_per_token"] == 1


def test_nothing_but_a_binding_success_from_the_destination_establishes() -> None:
    t = table()
    open_flow(t)
    for junk in (b"x", rtp(), binding_request(mint(*TX1, issued_at=T0)), OK[:19], OK + b"\0"):
        assert t.on_return(TX1, ret(junk), T0) == Drop("return_unconfirmed")
    error = bytearray(OK)
    error[1] = 0x11  # Binding error response
    assert t.on_return(TX1, ret(bytes(error)), T0) == Drop("return_unconfirmed")
    assert t.pending == 1 and t.established_count == 0
    assert t.on_return(TX1, ret(OK), T0) == Deliver(C1, 28)


def notice(token: bytes, client: tuple[str, int] = C1) -> bytes:
    return build_proxy_v2(INGRESS, client, revocation_tlv(token))


def test_a_revocation_from_the_tokens_transceiver_ends_its_flows_and_refuses_it() -> None:
    t = table()
    token = open_flow(t, C1)
    t.on_return(TX1, ret(OK), T0)
    open_flow(t, C2)  # another call, untouched
    # from anyone but the transceiver the token names, a notice is refused
    assert t.on_return(TX2, notice(token), T0 + 1) == Drop("revocation_wrong_source")
    assert t.on_return(TX1, notice(b"B" * 40), T0 + 1) == Drop("revocation_invalid")
    assert C1 in t.flows and not t.revoked
    assert t.on_return(TX1, notice(token), T0 + 1) is CONSUMED
    assert C1 not in t.flows and C2 in t.flows and t.revocations == 1
    assert t.on_client(C1, binding_request(token), T0 + 2) == Drop("token_revoked")
    assert t.on_client(("198.18.0.1", 9), binding_request(token), T0 + 2) == Drop("token_revoked")
    # the memory of it ends when the token would have expired anyway, and is bounded
    t.expire(T0 + 4 * 3600 + 1)
    assert not t.revoked


def test_the_revoked_list_is_bounded() -> None:
    t = table(RelayLimits(max_revoked=3))
    tokens = [mint(*TX1, issued_at=T0) for _ in range(5)]
    for token in tokens:
        assert t.on_return(TX1, notice(token), T0) is CONSUMED
    assert list(t.revoked) == tokens[2:]


def second_hop() -> FlowTable:
    """A relay of cluster 2 whose peer is cluster 1's relay at 10.9.0.2:3479."""
    return FlowTable(
        cluster=2,
        keys=KEYS,
        ingress=("192.0.2.2", 3478),
        allow_dest=DestinationFilter(["10.0.0.0/16"]),
        peers={1: ("10.9.0.2", 3479)},
        now=T0,
    )


def test_a_second_hop_passes_a_revocation_back_to_the_first() -> None:
    b = second_hop()
    a_worker = ("10.9.0.2", 45000)
    token = mint(*TX2, cluster=2, issued_at=T0)
    b.on_peer(a_worker, build_proxy_v2(C1, INGRESS) + binding_request(token), T0)
    assert b.on_return(TX2, notice(token), T0) == ReturnToPeer(a_worker)
    assert b.revoked and not b.hop_flows
    # the first hop believes it from the peer relay the token's cluster routes to
    a = table()
    a.on_client(C1, binding_request(token), T0)
    assert a.on_return(PEER_B, notice(token), T0) is CONSUMED
    assert token in a.revoked and C1 not in a.flows


def test_table_cap() -> None:
    t = table(RelayLimits(max_flows=2, new_flow_rate=1000, new_flow_burst=1000))
    open_flow(t, C1)
    open_flow(t, C2)
    d = t.on_client(("203.0.113.99", 1), binding_request(mint(*TX1, issued_at=T0)), T0)
    assert d == Drop("table_full")


def test_new_flow_rate_limit_per_source_ip() -> None:
    t = table(RelayLimits(new_flow_rate=1, new_flow_burst=3, max_pending_per_ip=100))
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
    b = second_hop()
    a_worker = ("10.9.0.2", 45000)
    token = mint(*TX2, cluster=2, issued_at=T0)
    framed = build_proxy_v2(C1, INGRESS) + binding_request(token)
    d = b.on_peer(a_worker, framed, T0)
    assert d == Forward(TX2, b"", 28)
    # the transceiver answers with src = A's ingress, dst = the client
    assert b.on_return(TX2, build_proxy_v2(INGRESS, C1) + OK, T0) == ReturnToPeer(a_worker)
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
    t = table(RelayLimits(lookup_rate=2))
    t.recovery = True
    decisions = [t.on_client(("203.0.113.8", p), rtp(), T0) for p in range(4)]
    assert [type(d).__name__ for d in decisions] == ["Recover", "Recover", "Drop", "Drop"]


def test_store_refresh_only_while_traffic_flows() -> None:
    t = table()
    open_flow(t)
    t.on_return(TX1, ret(OK), T0)
    assert len(t.due_for_store(T0)) == 1
    assert t.due_for_store(T0 + 5) == []
    t.on_client(C1, rtp(), T0 + 6)
    t.expire(T0 + 10)  # the sweep notices the flow is due
    assert len(t.due_for_store(T0 + 10)) == 1
    t.expire(T0 + 25)
    assert t.due_for_store(T0 + 25) == []  # no traffic since the last write


def test_incremental_sweep_covers_every_flow_once_per_pass() -> None:
    t = table(RelayLimits(new_flow_rate=1e6, new_flow_burst=1e6, max_pending_per_ip=1000))
    for port in range(100):
        t.on_client(("203.0.113.50", 1000 + port), binding_request(mint(*TX1, issued_at=T0)), T0)
    assert t.size == 100
    later = T0 + 11  # all pending flows are past their 10 s
    assert [t.sweep(later, budget=30) for _ in range(4)] == [30, 30, 30, 10]
    assert t.size == 0 and t.pending == 0


# -- properties: what no sequence of datagrams can do ------------------------------------

TOKENS = [mint(*TX1, issued_at=T0), mint(*TX1, issued_at=T0), mint(*TX2, issued_at=T0)]
DTLS = b"\x16\xfe\xfd" + bytes(20)
SOURCES = [spoofed(i) for i in range(8)]  # few, so that answers meet their flows


@dataclass(frozen=True)
class FromClient:
    """A datagram from `src` to the ingress: a check carrying `token`, RTP or DTLS (`tcp`:
    a frame on an ICE-TCP connection from `src`)."""

    src: Address
    token: bytes
    kind: Literal["check", "rtp", "dtls"]
    tcp: bool = False

    def data(self) -> bytes:
        if self.kind == "check":
            return binding_request(self.token)
        return rtp() if self.kind == "rtp" else DTLS


@dataclass(frozen=True)
class FromDest:
    """A framed datagram from `dest` on the return path, for `client` (`tcp`: marked
    STREAM, an ICE-TCP client)."""

    dest: Address
    client: Address
    payload: bytes
    tcp: bool = False


@dataclass(frozen=True)
class Answer:
    """The flow's own destination (or candidate) answers the client's check."""

    client: Address
    tcp: bool = False


@dataclass(frozen=True)
class Closed:
    """The ICE-TCP connection from `client` closed."""

    client: Address


@dataclass(frozen=True)
class Tick:
    seconds: float


Op = FromClient | FromDest | Answer | Closed | Tick

client_datagram = st.builds(
    FromClient,
    st.sampled_from(SOURCES),
    st.sampled_from([TOKENS[0], TOKENS[0], *TOKENS, TOKENS[0][:-4] + b"AAAA"]),
    st.sampled_from(["check", "check", "check", "rtp", "dtls"]),
    st.booleans(),
)
unconfirmed_return = st.builds(
    FromDest,
    st.sampled_from([TX1, TX2, ("10.0.0.3", 5004)]),
    st.sampled_from(SOURCES),
    st.sampled_from([b"x", rtp(), OK[:19], bytes([0x01, 0x11]) + OK[2:], binding_request(b"a")]),
    st.booleans(),
)
any_return = st.builds(
    FromDest,
    st.sampled_from([TX1, TX2]),
    st.sampled_from(SOURCES),
    st.sampled_from([b"x", OK]),
    st.booleans(),
)
answer = st.builds(Answer, st.sampled_from(SOURCES), st.booleans())  # the right place answers
closed = st.builds(Closed, st.sampled_from(SOURCES))
tick = st.builds(Tick, st.floats(0.0, 15.0))


def play(t: FlowTable, ops: list[Op]) -> list[Decision]:
    now = T0
    decisions: list[Decision] = []
    for op in ops:
        match op:
            case FromClient():
                on = t.on_tcp_client if op.tcp else t.on_client
                decisions.append(on(op.src, op.data(), now))
            case Answer(client, tcp):
                flow = (t.tcp_flows if tcp else t.flows).get(client)
                if flow is not None:
                    dest = flow.candidate.dest if flow.candidate else flow.dest
                    back = ret_tcp(OK, flow.client) if tcp else ret(OK, flow.client)
                    decisions.append(t.on_return(dest, back, now))
            case FromDest(dest, client, payload, tcp):
                back = ret_tcp(payload, client) if tcp else ret(payload, client)
                decisions.append(t.on_return(dest, back, now))
            case Closed(client):
                t.forget_tcp(client)
            case Tick(seconds):
                now += seconds
                t.sweep(now, budget=7)
        check_invariants(t)
    return decisions


def check_invariants(t: FlowTable) -> None:
    lim = t.limits
    live = [*t.flows.values(), *t.tcp_flows.values(), *t.hop_flows.values()]
    assert all(f.stream for f in t.tcp_flows.values())
    assert not any(f.stream for f in t.flows.values())
    assert t.pending == sum(not f.established for f in live)
    assert sum(t.pending_per_ip.values()) == t.pending
    assert all(t.by_return[f.return_key] is f for f in live)
    by_token: dict[bytes, list[int]] = {}
    for f in live:
        counts = by_token.setdefault(f.token, [0, 0])
        counts[f.established] += 1
    for token, (pending, established) in by_token.items():
        assert pending == t.ledger.pending_count(token) <= lim.max_pending_per_token
        assert established == len(t.ledger.established(token)) <= lim.max_flows_per_token
    assert t.pending <= lim.max_pending and t.size <= lim.max_flows


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(client_datagram, client_datagram, unconfirmed_return, closed, tick),
        min_size=20,
        max_size=120,
    )
)
def test_no_unauthenticated_sequence_establishes_a_flow_or_reaches_a_client(
    ops: list[Op],
) -> None:
    t = table(RelayLimits(max_pending=12, new_flow_rate=1000, new_flow_burst=1000))
    decisions = play(t, ops)
    assert t.established_count == 0
    assert not any(isinstance(d, (Deliver, ReturnToPeer)) for d in decisions)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(client_datagram, client_datagram, answer, any_return, closed, tick),
        min_size=20,
        max_size=150,
    )
)
def test_no_sequence_breaks_the_per_token_caps_or_the_books(ops: list[Op]) -> None:
    t = table(
        RelayLimits(
            max_pending=6,
            max_pending_per_token=2,
            max_flows_per_token=1,
            new_flow_rate=1000,
            new_flow_burst=1000,
        )
    )
    play(t, ops)


# -- the data plane's fast paths agree with the core ----------------------------------------


@dataclass(frozen=True)
class Datagram:
    """What a data-plane socket reads: from a client (UDP, or a frame of an ICE-TCP
    connection), or framed on the return path."""

    direction: Literal["client", "tcp", "return"]
    src: Address
    data: bytes


def fast_then_full(t: FlowTable, op: Datagram, now: float) -> Decision:
    """What the data-plane thread decides: the fast path if it applies, else the core."""
    src, data = op.src, op.data
    if op.direction == "client":
        flow = t.known_client(src, len(data), data[0] if data else 0, now)
        if flow is not None:
            return Forward(flow.dest, flow.header)
        return t.on_client(src, data, now)
    if op.direction == "tcp":
        flow = t.known_tcp_client(src, len(data), data[0] if data else 0, now)
        if flow is not None:
            return Forward(flow.dest, flow.header)
        return t.on_tcp_client(src, data, now)
    flow = t.known_return(data[:28], src, len(data) - 28, now) if len(data) >= 28 else None
    if flow is not None:
        if flow.via is not None:
            return ReturnToPeer(flow.via)
        return Deliver(flow.client, 28, flow.stream)
    return t.on_return(src, data, now)


def full(t: FlowTable, op: Datagram, now: float) -> Decision:
    if op.direction == "client":
        return t.on_client(op.src, op.data, now)
    if op.direction == "tcp":
        return t.on_tcp_client(op.src, op.data, now)
    return t.on_return(op.src, op.data, now)


def snapshot(t: FlowTable) -> object:
    flows = sorted(
        (f.client, f.stream, f.dest, f.token, f.established, f.last_seen)
        for f in (*t.flows.values(), *t.tcp_flows.values())
    )
    return flows, t.pending, dict(t.drops)


client_op = st.builds(
    Datagram,
    st.sampled_from(["client", "tcp"]),
    st.sampled_from(SOURCES),
    st.sampled_from([binding_request(TOKENS[0]), binding_request(TOKENS[2]), rtp(), DTLS, b""]),
)
return_op = st.builds(
    Datagram,
    st.just("return"),
    st.sampled_from([TX1, TX2]),
    st.one_of(
        st.builds(ret, st.sampled_from([OK, rtp(), b"x"]), st.sampled_from(SOURCES)),
        st.builds(ret_tcp, st.sampled_from([OK, rtp(), b"x"]), st.sampled_from(SOURCES)),
    ),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(client_op, client_op, return_op), min_size=5, max_size=80))
def test_the_fast_paths_decide_and_record_what_the_core_does(ops: list[Datagram]) -> None:
    fast = table(RelayLimits(new_flow_rate=1000, new_flow_burst=1000))
    core = table(RelayLimits(new_flow_rate=1000, new_flow_burst=1000))
    for i, op in enumerate(ops):
        now = T0 + i * 0.01
        assert fast_then_full(fast, op, now) == full(core, op, now)
        assert snapshot(fast) == snapshot(core)


# -- ICE-TCP clients (RFC 6544): a table of their own, marked STREAM ----------------------


def test_a_tcp_client_is_routed_like_udp_and_marked_stream_both_ways() -> None:
    t = table()
    token = mint(*TX1, issued_at=T0)
    d = t.on_tcp_client(C1, binding_request(token), T0)
    assert isinstance(d, Forward) and d.dest == TX1
    assert parse_proxy_v2(d.header).stream and (parse_proxy_v2(d.header).src == C1)
    # a reply marked DGRAM names a UDP client of that address, which has no flow
    assert t.on_return(TX1, ret(OK), T0) == Drop("return_no_flow")
    assert t.on_return(TX1, ret_tcp(OK), T0) == Deliver(C1, 28, stream=True)
    flow = t.known_tcp_client(C1, 100, 0x80, T0 + 1)
    assert flow is not None and flow.dest == TX1
    assert t.known_return(ret_tcp(b"")[:28], TX1, 100, T0 + 1) is flow
    assert t.established_count == 1 and t.size == 1


def test_a_udp_client_of_the_same_address_never_reaches_a_tcp_flow() -> None:
    t = table()
    token = mint(*TX1, issued_at=T0)
    t.on_tcp_client(C1, binding_request(token), T0)
    t.on_return(TX1, ret_tcp(OK), T0)
    assert t.known_client(C1, 100, 0x80, T0) is None
    assert t.on_client(C1, rtp(), T0) == Drop("no_flow")


def test_a_tcp_flow_ends_with_its_connection_and_is_never_cached_or_recovered() -> None:
    t = FlowTable(
        cluster=1,
        keys=KEYS,
        ingress=INGRESS,
        ingress_tcp=(INGRESS[0], 443),
        allow_dest=DestinationFilter(["10.0.0.0/16"]),
        recovery=True,
        now=T0,
    )
    token = mint(*TX1, issued_at=T0)
    d = t.on_tcp_client(C1, binding_request(token), T0)
    assert isinstance(d, Forward) and parse_proxy_v2(d.header).dst == (INGRESS[0], 443)
    reply = build_proxy_v2((INGRESS[0], 443), C1, stream=True) + OK
    assert isinstance(t.on_return(TX1, reply, T0), Deliver)
    assert t.due_for_store(T0) == []  # a connection cannot be recovered: not written
    t.forget_tcp(C1)
    assert t.size == 0 and not t.ledger.flows_of(token)
    # after the connection: nothing but a new check opens a flow, and no cache lookup
    assert t.on_tcp_client(C1, rtp(), T0 + 1) == Drop("no_flow")


def test_tcp_flows_share_the_per_token_caps_and_revocation() -> None:
    t = table(RelayLimits(max_pending_per_token=2))
    token = mint(*TX1, issued_at=T0)
    assert isinstance(t.on_client(C1, binding_request(token), T0), Forward)
    assert isinstance(t.on_tcp_client(C2, binding_request(token), T0), Forward)
    assert t.on_tcp_client(("203.0.113.7", 1), binding_request(token), T0) == Drop(
        "pending_per_token"
    )
    notice = build_proxy_v2(INGRESS, C2, revocation_tlv(token), stream=True)
    assert t.on_return(TX1, notice, T0) is CONSUMED
    assert t.size == 0


def test_a_second_hop_keeps_the_stream_mark() -> None:
    first = table()
    token = mint("10.1.0.1", 5004, cluster=2, issued_at=T0)
    d = first.on_tcp_client(C1, binding_request(token), T0)
    assert isinstance(d, Forward) and d.dest == PEER_B
    second = FlowTable(
        cluster=2,
        keys=KEYS,
        ingress=("198.51.100.2", 3478),
        allow_dest=DestinationFilter(["10.0.0.0/8"]),
        now=T0,
    )
    framed = d.header + binding_request(token)
    hop = second.on_peer(("10.0.0.9", 3479), framed, T0)
    assert isinstance(hop, Forward) and hop.header == b""  # as it is: still marked STREAM
    back = build_proxy_v2(INGRESS, C1, stream=True) + OK
    assert second.on_return(("10.1.0.1", 5004), back, T0) == ReturnToPeer(("10.0.0.9", 3479))
    assert first.on_return(PEER_B, back, T0) == Deliver(C1, 28, stream=True)
