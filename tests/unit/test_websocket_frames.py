"""The WebSocket framing codec (shared/wire/websocket.py): RFC 6455 §5, checked against
wsproto both ways, and garbage."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from wsproto import ConnectionType
from wsproto.connection import Connection
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage

from firsthop.shared.wire import websocket as wsw
from firsthop.shared.wire.websocket import (
    BINARY,
    CLOSE,
    PING,
    TEXT,
    Close,
    InvalidText,
    MessageTooBig,
    ProtocolViolation,
    WebSocketError,
    WebSocketReader,
    close_payload,
    encode_frame,
    mask,
    split_handshake,
)

messages = st.one_of(st.binary(max_size=70000), st.text(max_size=300))


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(edges, edges[1:], strict=False)]


def feed_all(reader: WebSocketReader, chunks: list[bytes]) -> list[wsw.Event]:
    return [event for chunk in chunks for event in reader.feed(chunk)]


@settings(max_examples=150)
@given(st.lists(messages, min_size=1, max_size=4), st.lists(st.integers(0, 1 << 20)), st.booleans())
def test_messages_round_trip_whatever_the_chunking(
    sent: list[str | bytes], cuts: list[int], client: bool
) -> None:
    wire = b"".join(
        encode_frame(
            TEXT if isinstance(m, str) else BINARY,
            m.encode() if isinstance(m, str) else m,
            os.urandom(4) if client else None,
        )
        for m in sent
    )
    reader = WebSocketReader(masked=client, max_message=1 << 20)
    assert feed_all(reader, chunked(wire, cuts)) == sent


@given(st.binary(max_size=300), st.binary(min_size=4, max_size=4))
def test_masking_twice_gives_the_payload_back(payload: bytes, key: bytes) -> None:
    masked = mask(payload, key)
    assert len(masked) == len(payload)
    assert masked == bytes(b ^ key[i % 4] for i, b in enumerate(payload))
    assert mask(masked, key) == payload


@settings(max_examples=300)
@given(st.binary(max_size=200), st.booleans())
def test_garbage_raises_only_the_modules_errors(data: bytes, masked: bool) -> None:
    reader = WebSocketReader(masked=masked, max_message=100)
    try:
        reader.feed(data)
    except WebSocketError as exc:
        assert exc.code in (1002, 1007, 1009)


@given(messages)
def test_wsproto_client_frames_parse_here(message: str | bytes) -> None:
    client = Connection(ConnectionType.CLIENT)
    event = TextMessage(data=message) if isinstance(message, str) else BytesMessage(data=message)
    reader = WebSocketReader(masked=True, max_message=1 << 20)
    assert reader.feed(client.send(event)) == [message]


@given(messages, st.booleans())
def test_frames_made_here_parse_in_wsproto(message: str | bytes, client: bool) -> None:
    peer = Connection(ConnectionType.SERVER if client else ConnectionType.CLIENT)
    data = message.encode() if isinstance(message, str) else message
    opcode = TEXT if isinstance(message, str) else BINARY
    peer.receive_data(encode_frame(opcode, data, os.urandom(4) if client else None))
    events = list(peer.events())
    got = (str if isinstance(message, str) else bytes)().join(e.data for e in events)  # type: ignore[attr-defined]
    assert got == message
    assert all(e.message_finished for e in events[-1:])  # type: ignore[attr-defined]


def test_fragments_and_control_frames_between_them() -> None:
    server = Connection(ConnectionType.SERVER)
    wire = server.send(BytesMessage(data=b"ab", message_finished=False))
    wire += server.send(Ping(payload=b"p"))
    wire += server.send(BytesMessage(data=b"cd", message_finished=True))
    wire += server.send(CloseConnection(code=1001, reason="going"))
    reader = WebSocketReader(masked=False, max_message=100)
    assert reader.feed(wire) == [wsw.Ping(b"p"), b"abcd", Close(1001, "going")]


def test_the_bound_counts_a_whole_fragmented_message_before_buffering_it() -> None:
    server = Connection(ConnectionType.SERVER)
    reader = WebSocketReader(masked=False, max_message=100)
    assert reader.feed(server.send(BytesMessage(data=b"x" * 60, message_finished=False))) == []
    with pytest.raises(MessageTooBig):  # the header alone says so
        reader.feed(server.send(BytesMessage(data=b"x" * 41))[:4])
    exact = WebSocketReader(masked=False, max_message=100)
    assert exact.feed(encode_frame(BINARY, b"x" * 100)) == [b"x" * 100]


@pytest.mark.parametrize(
    ("frame", "error"),
    [
        (bytes([0x80 | 0x3, 0]), ProtocolViolation),  # unknown opcode
        (bytes([0x80 | 0x40 | BINARY, 0]), ProtocolViolation),  # RSV1, nothing negotiated
        (bytes([PING, 0]), ProtocolViolation),  # a fragmented control frame
        (bytes([0x80 | PING, 126, 0, 126]) + b"x" * 126, ProtocolViolation),  # over 125
        (bytes([0x80 | 0x0, 1, 0]), ProtocolViolation),  # continuation of nothing
        (bytes([BINARY, 1, 0, 0x80 | BINARY, 1, 0]), ProtocolViolation),  # two at once
        (bytes([0x80 | BINARY, 0x80 | 1]) + b"\0\0\0\0x", ProtocolViolation),  # server masked
        (bytes([0x80 | BINARY, 127, 0x80]) + bytes(7), ProtocolViolation),  # top length bit
        (encode_frame(TEXT, b"\xff"), InvalidText),
        (encode_frame(CLOSE, b"\x03"), ProtocolViolation),  # a one-byte Close
        (encode_frame(CLOSE, b"\x03\xe8\xff"), InvalidText),
    ],
)
def test_what_no_server_may_send(frame: bytes, error: type[WebSocketError]) -> None:
    with pytest.raises(error):
        WebSocketReader(masked=False, max_message=1000).feed(frame)


def test_a_client_must_mask() -> None:
    with pytest.raises(ProtocolViolation):
        WebSocketReader(masked=True, max_message=1000).feed(encode_frame(BINARY, b"x"))


def test_close_payloads() -> None:
    assert close_payload(1000) == b"\x03\xe8"
    assert close_payload(wsw.NO_STATUS) == b""
    assert len(close_payload(1001, "x" * 500)) == 125
    reader = WebSocketReader(masked=False, max_message=10)
    assert reader.feed(encode_frame(CLOSE, b"")) == [Close(wsw.NO_STATUS, "")]


def test_the_handshake_head_is_cut_from_the_frames_behind_it() -> None:
    head = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n"
    frame = encode_frame(BINARY, b"early")
    assert split_handshake(head[:-1]) is None
    assert split_handshake(head + frame) == (head, frame)


def test_an_error_carries_the_messages_before_the_bad_frame() -> None:
    reader = WebSocketReader(masked=False, max_message=10)
    with pytest.raises(MessageTooBig) as caught:
        reader.feed(encode_frame(BINARY, b"ok") + encode_frame(TEXT, b"x" * 11))
    assert caught.value.events == [b"ok"]
