from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from firsthop.services.transceiver.mux import Delivery, SessionMux, Unrouted
from firsthop.shared.wire.proxy_v2 import build_proxy_v2, parse_proxy_v2
from tests.support import binding_request, mint, rtp

RELAY = ("10.0.0.9", 40000)
RELAY2 = ("10.0.0.10", 40001)
INGRESS = ("198.51.100.1", 3478)
CLIENT = ("203.0.113.5", 5555)


class S:
    pass


def framed(payload: bytes, client: tuple[str, int] = CLIENT) -> bytes:
    return build_proxy_v2(client, INGRESS) + payload


def test_binding_request_finds_session_by_ufrag_and_routes_back_through_the_relay() -> None:
    mux: SessionMux[S] = SessionMux()
    s = S()
    token = mint("10.0.0.1", 5004).decode()
    mux.add_ufrag(token, s)
    d = mux.on_datagram(RELAY, framed(binding_request(token.encode())))
    assert isinstance(d, Delivery) and d.session is s and d.client == CLIENT
    assert mux.frame_for(CLIENT, b"resp") is None  # not before the check authenticated
    mux.note_route(s, d)
    out = mux.frame_for(CLIENT, b"resp")
    assert out is not None
    data, dest = out
    assert dest == RELAY
    hdr = parse_proxy_v2(data)
    assert (hdr.src, hdr.dst) == (INGRESS, CLIENT)
    assert data[hdr.payload_offset :] == b"resp"


def test_only_stun_until_ice_validates_the_client() -> None:
    mux: SessionMux[S] = SessionMux()
    s = S()
    token = mint().decode()
    mux.add_ufrag(token, s)
    mux.on_datagram(RELAY, framed(binding_request(token.encode())))
    assert mux.on_datagram(RELAY, framed(b"\x16\xfe\xfd" + bytes(30))) is None
    assert mux.drops["unvalidated"] == 1
    mux.validated(s, CLIENT)
    d = mux.on_datagram(RELAY, framed(rtp()))
    assert isinstance(d, Delivery) and d.session is s


def test_replies_follow_the_relay_that_last_delivered() -> None:
    mux: SessionMux[S] = SessionMux()
    s = S()
    mux.validated(s, CLIENT)
    mux.on_datagram(RELAY, framed(rtp()))
    mux.on_datagram(RELAY2, framed(rtp()))
    out = mux.frame_for(CLIENT, b"x")
    assert out is not None and out[1] == RELAY2


def test_drops() -> None:
    mux: SessionMux[S] = SessionMux()
    assert mux.on_datagram(CLIENT, rtp()) is None  # unframed without --accept-direct
    token = mint()
    assert mux.on_datagram(RELAY, framed(binding_request(token))) == Unrouted(
        token, CLIENT, RELAY, INGRESS
    )
    assert mux.on_datagram(RELAY, framed(b"")) is None
    assert mux.on_datagram(RELAY, framed(bytes(1501))) is None
    assert mux.on_datagram(RELAY, build_proxy_v2(CLIENT, INGRESS)[:20]) is None
    assert mux.frame_for(("1.2.3.4", 1), b"x") is None
    assert set(mux.drops) == {
        "unframed",
        "unknown_ufrag",
        "empty",
        "oversize",
        "proxy_malformed",
        "no_route",
    }


def test_direct_mode_answers_unframed() -> None:
    mux: SessionMux[S] = SessionMux(accept_direct=True)
    s = S()
    token = mint().decode()
    mux.add_ufrag(token, s)
    d = mux.on_datagram(CLIENT, binding_request(token.encode()))
    assert isinstance(d, Delivery)
    mux.note_route(s, d)
    assert mux.frame_for(CLIENT, b"resp") == (b"resp", CLIENT)


def test_remove_session_forgets_everything() -> None:
    mux: SessionMux[S] = SessionMux()
    s = S()
    token = mint().decode()
    mux.add_ufrag(token, s)
    mux.validated(s, CLIENT)
    mux.on_datagram(RELAY, framed(rtp()))
    mux.remove_session(s, [token])
    assert not mux.by_ufrag and not mux.by_client and not mux.routes


@given(st.binary(max_size=200), st.booleans())
def test_garbage_never_raises(data: bytes, direct: bool) -> None:
    mux: SessionMux[S] = SessionMux(accept_direct=direct)
    mux.on_datagram(RELAY, data)
    mux.on_datagram(RELAY, build_proxy_v2(CLIENT, INGRESS) + data)


def test_a_flows_header_is_parsed_once() -> None:
    mux: SessionMux[S] = SessionMux()
    s = S()
    mux.validated(s, CLIENT)
    first = mux.on_datagram(RELAY, framed(rtp(1)))
    second = mux.on_datagram(RELAY, framed(rtp(2)))
    assert isinstance(first, Delivery) and isinstance(second, Delivery)
    assert (second.client, second.payload) == (CLIENT, rtp(2))
    assert list(mux.headers.values()) == [(CLIENT, INGRESS, False)]
    # a header with TLVs is not cached, and still delivers
    hdr = bytearray(build_proxy_v2(CLIENT, INGRESS))
    hdr[14:16] = (12 + 4).to_bytes(2, "big")
    d = mux.on_datagram(RELAY, bytes(hdr) + b"\x04\x00\x01x" + rtp(3))
    assert isinstance(d, Delivery) and d.payload == rtp(3) and len(mux.headers) == 1


def test_unauthenticated_traffic_from_many_sources_leaves_no_state() -> None:
    mux: SessionMux[S] = SessionMux()
    s = S()
    token = mint().decode()
    mux.add_ufrag(token, s)
    for i in range(2000):
        client = (f"198.18.{i // 250}.{i % 250 + 1}", 1024 + i)
        mux.on_datagram(RELAY, framed(binding_request(token.encode()), client))
        mux.on_datagram(RELAY, framed(rtp(), client))
        mux.on_datagram(RELAY, framed(binding_request(mint()), client))
    assert not mux.routes and not mux.clients_of and not mux.by_client and not mux.headers
    assert mux.drops["unvalidated"] == 2000 and mux.drops["unknown_ufrag"] == 2000


def test_only_the_address_being_validated_may_answer_and_only_with_stun() -> None:
    mux: SessionMux[S] = SessionMux()
    s = S()
    other = ("203.0.113.77", 7777)
    mux.expect(s, other)
    answer = bytes([0x01, 0x01]) + bytes(18)
    d = mux.on_datagram(RELAY, framed(answer, other))
    assert isinstance(d, Delivery) and d.session is s
    assert mux.on_datagram(RELAY, framed(rtp(), other)) is None  # media: not yet
    assert mux.on_datagram(RELAY, framed(answer, CLIENT)) is None  # nobody else
    mux.expect(s, CLIENT)  # one validation per session: the old one is forgotten
    assert mux.on_datagram(RELAY, framed(answer, other)) is None
    mux.remove_session(s, [])
    assert not mux.probing and not mux.probe_of


def test_forgetting_a_path_drops_its_route_and_validation() -> None:
    mux: SessionMux[S] = SessionMux()
    s = S()
    mux.validated(s, CLIENT)
    mux.on_datagram(RELAY, framed(rtp()))
    mux.forget(s, CLIENT)
    assert not mux.by_client and not mux.routes
    assert mux.on_datagram(RELAY, framed(rtp())) is None


def test_a_tcp_client_is_answered_marked_tcp_through_its_relay() -> None:
    # ICE-TCP: the relay marks the client's transport STREAM; replies and revocation notices
    # name the client the same way, which is how the relay finds its connection.
    mux: SessionMux[S] = SessionMux(accept_direct=True)
    s = S()
    token = mint("10.0.0.1", 5004)
    mux.add_ufrag(token.decode(), s)
    d = mux.on_datagram(
        RELAY, build_proxy_v2(CLIENT, INGRESS, stream=True) + binding_request(token)
    )
    assert isinstance(d, Delivery) and d.stream and d.relay == RELAY
    mux.note_route(s, d)
    mux.validated(s, CLIENT)
    out = mux.frame_for(CLIENT, b"resp")
    assert out is not None and out[1] == RELAY
    assert parse_proxy_v2(out[0]).stream
    media = mux.on_datagram(RELAY, build_proxy_v2(CLIENT, INGRESS, stream=True) + rtp())
    assert isinstance(media, Delivery) and media.stream
    assert list(mux.headers.values()) == [(CLIENT, INGRESS, True)]
    gone = mux.on_datagram(
        RELAY, build_proxy_v2(CLIENT, INGRESS, stream=True) + binding_request(mint())
    )
    assert isinstance(gone, Unrouted) and gone.stream
