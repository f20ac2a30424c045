"""The WebSocket connection rules both ends share (`shared/wire/websocket_connection.py`)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firsthop.shared.wire.websocket import (
    CLOSE,
    PING,
    PONG,
    TEXT,
    WebSocketReader,
    close_payload,
    encode_frame,
)
from firsthop.shared.wire.websocket_connection import (
    LOST,
    PEER_CLOSED,
    TOO_BIG,
    VIOLATION,
    ConnectionEnded,
    MaskKeys,
    WebSocketConnection,
)

KEY = b"\x01\x02\x03\x04"


def pair() -> tuple[WebSocketConnection, WebSocketConnection]:
    client = WebSocketConnection(client=True, max_message=1000, mask_key=lambda: KEY)
    server = WebSocketConnection(client=False, max_message=1000)
    return client, server


def from_client(opcode: int, payload: bytes) -> bytes:
    return encode_frame(opcode, payload, KEY)


def test_messages_both_ways_a_client_masks_and_a_server_does_not() -> None:
    client, server = pair()
    frame = client.send("hello")
    assert frame == encode_frame(TEXT, b"hello", KEY)
    assert server.receive_data(frame + client.send(b"\x00\x01")) == ["hello", b"\x00\x01"]
    back = server.send(b"pcm")
    assert back == encode_frame(0x2, b"pcm")  # unmasked
    assert client.receive_data(back[:2]) == [] and client.receive_data(back[2:]) == [b"pcm"]
    assert client.ended is None and server.ended is None


def test_a_ping_is_answered_with_its_payload_in_order_with_the_messages() -> None:
    _, server = pair()
    got = server.receive_data(
        from_client(TEXT, b"a") + from_client(PING, b"p1") + from_client(TEXT, b"b")
    )
    assert got == ["a", "b"]
    assert server.data_to_send() == encode_frame(PONG, b"p1")
    assert server.data_to_send() == b""
    client, _ = pair()
    assert client.receive_data(encode_frame(PING, b"x")) == []
    assert client.data_to_send() == encode_frame(PONG, b"x", KEY)  # a client's Pong is masked


def test_a_burst_of_pings_costs_one_pong_for_the_latest() -> None:
    """RFC 6455 §5.5.3: Pings not yet answered are answered by one Pong, the latest's: a
    peer's flood of Pings costs one frame back per read, and less than it sent."""
    _, server = pair()
    burst = b"".join(from_client(PING, b"%d" % i) for i in range(1000))
    assert server.receive_data(burst + from_client(PING, b"last")) == []
    assert server.data_to_send() == encode_frame(PONG, b"last")
    server.receive_data(from_client(PING, b"one read"))  # (answered later: the latest wins)
    server.receive_data(from_client(PING, b"the next"))
    assert server.data_to_send() == encode_frame(PONG, b"the next")
    assert server.receive_data(from_client(PING, b"p") + from_client(CLOSE, b"\x03\xe8")) == []
    assert server.data_to_send() == encode_frame(PONG, b"p") + encode_frame(CLOSE, b"\x03\xe8")


def test_a_close_is_answered_once_echoing_its_code_and_ends_the_connection() -> None:
    _, server = pair()
    got = server.receive_data(
        from_client(TEXT, b"last")
        + from_client(CLOSE, close_payload(1001, "going"))
        + from_client(TEXT, b"after")
    )
    assert got == ["last"]  # what came before stands; nothing after it is read
    assert server.ended is not None
    assert (server.ended.how, server.ended.code, server.ended.reason) == (
        PEER_CLOSED,
        1001,
        "going",
    )
    assert server.send("reply to the last") == encode_frame(TEXT, b"reply to the last")
    assert server.data_to_send() == encode_frame(CLOSE, close_payload(1001))
    assert server.receive_data(from_client(TEXT, b"more")) == []
    with pytest.raises(ConnectionEnded):  # once the answer is out
        server.send("reply")
    assert server.close() == b""  # answered already


def test_a_limited_read_leaves_the_rest_for_later_and_a_close_among_them_still_ends_it() -> None:
    """`limit` frames at a time: `more` says frames wait; a Close read in a later batch ends
    the connection there, and what follows it is never read."""
    _, server = pair()
    wire = b"".join(from_client(TEXT, b"%d" % i) for i in range(5))
    wire += from_client(CLOSE, close_payload(1000)) + from_client(TEXT, b"after")
    assert server.receive_data(wire, 2) == ["0", "1"] and server.more
    assert server.receive_data(b"", 2) == ["2", "3"] and server.more
    assert server.receive_data(b"", 2) == ["4"]
    assert server.ended is not None and server.ended.how == PEER_CLOSED
    assert not server.more and server.receive_data(b"", 2) == []


def test_a_bad_frame_ends_it_after_the_good_ones_with_the_violations_code() -> None:
    _, server = pair()
    unmasked = encode_frame(TEXT, b"x")  # a client must mask (RFC 6455 §5.1)
    got = server.receive_data(from_client(TEXT, b"ok") + unmasked)
    assert got == ["ok"]
    assert server.ended is not None and server.ended.how == VIOLATION
    assert server.ended.code == 1002
    answer = WebSocketReader(masked=False, max_message=1000).feed(server.data_to_send())
    assert [getattr(e, "code", None) for e in answer] == [1002]


def test_a_message_over_the_bound_is_answered_1009() -> None:
    _, server = pair()
    assert server.receive_data(from_client(TEXT, b"x" * 1001)) == []
    assert server.ended is not None and (server.ended.how, server.ended.code) == (TOO_BIG, 1009)
    answer = WebSocketReader(masked=False, max_message=1000).feed(server.data_to_send())
    assert [getattr(e, "code", None) for e in answer] == [1009]


def test_our_close_stops_our_messages_and_the_peers_close_then_ends_it_unanswered() -> None:
    client, server = pair()
    bye = server.close(1000, "done")
    assert bye == encode_frame(CLOSE, close_payload(1000, "done"))
    assert server.close() == b""
    with pytest.raises(ConnectionEnded):
        server.send("more")
    assert client.receive_data(bye) == []
    answer = client.data_to_send()
    assert client.ended is not None and client.ended.how == PEER_CLOSED
    assert server.receive_data(answer) == []
    assert server.ended is not None and server.ended.code == 1000
    assert server.data_to_send() == b""  # (our Close went already: no second one)


def test_a_lost_socket_ends_it_as_1006() -> None:
    _, server = pair()
    server.connection_lost()
    assert server.ended is not None and (server.ended.how, server.ended.code) == (LOST, 1006)


@given(st.lists(st.binary(max_size=300), max_size=8))
def test_no_bytes_make_it_raise(chunks: list[bytes]) -> None:
    for client in (True, False):
        conn = WebSocketConnection(client=client, max_message=1000)
        for chunk in chunks:
            for message in conn.receive_data(chunk):
                assert isinstance(message, (str, bytes))
            conn.data_to_send()
        if conn.ended is None:
            conn.send("still open")


def test_masking_keys_come_from_the_strong_source_a_batch_at_a_time_each_once() -> None:
    drawn: list[int] = []

    def source(n: int) -> bytes:
        drawn.append(n)
        return bytes(range(len(drawn), len(drawn) + n))  # (each batch different)

    keys = MaskKeys(batch=3, source=source)
    got = [keys() for _ in range(7)]
    assert drawn == [12, 12, 12]  # one draw per 3 keys
    assert all(len(k) == 4 for k in got)
    assert got[:3] == [bytes(range(1, 13))[i : i + 4] for i in (0, 4, 8)]  # in order, once
    assert got[3] == bytes(range(2, 6)) and got[6] == bytes(range(3, 7))
    # the client's frames use them: a frame's key is the next one drawn
    client = WebSocketConnection(client=True, max_message=1000, mask_key=MaskKeys())
    reader = WebSocketReader(masked=True, max_message=1000)
    assert reader.feed(client.send(b"x" * 100) + client.send("y")) == [b"x" * 100, "y"]
