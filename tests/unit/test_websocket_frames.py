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
from tests.support import drain_limited

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


# -- the protocol lawyer's cases -------------------------------------------------------------


def frame(opcode: int, payload: bytes, *, fin: bool = True, key: bytes | None = None) -> bytes:
    """Any frame, final or not (`encode_frame` makes final ones only)."""
    whole = encode_frame(opcode, payload, key)
    return whole if fin else bytes([whole[0] & ~wsw.FIN]) + whole[1:]


@settings(max_examples=150)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.binary(max_size=3000), st.text(max_size=200)),
            st.lists(st.integers(0, 3000), max_size=5),  # where the message is cut into fragments
            st.lists(st.sampled_from(["ping", "pong"]), max_size=3),  # between its fragments
        ),
        min_size=1,
        max_size=4,
    ),
    st.lists(st.integers(0, 1 << 20)),
    st.booleans(),
)
def test_fragmented_messages_with_control_frames_between_round_trip(
    sent: list[tuple[str | bytes, list[int], list[str]]], cuts: list[int], client: bool
) -> None:
    wire, expected = b"", list[wsw.Event]()
    for message, fragment_at, controls in sent:
        data = message.encode() if isinstance(message, str) else message  # (cut mid-character too)
        pieces = chunked(data, fragment_at)
        for i, piece in enumerate(pieces):
            opcode = (TEXT if isinstance(message, str) else BINARY) if i == 0 else wsw.CONTINUATION
            last = i == len(pieces) - 1
            wire += frame(opcode, piece, fin=last, key=os.urandom(4) if client else None)
            if last:
                expected.append(message)
            if i < len(controls):
                control = PING if controls[i] == "ping" else wsw.PONG
                wire += frame(control, b"c%d" % i, key=os.urandom(4) if client else None)
                expected.append((wsw.Ping if control == PING else wsw.Pong)(b"c%d" % i))
    reader = WebSocketReader(masked=client, max_message=1 << 20)
    assert feed_all(reader, chunked(wire, cuts)) == expected


@settings(max_examples=150)
@given(
    st.lists(st.one_of(st.binary(max_size=300), st.text(max_size=50), st.none()), max_size=40),
    st.lists(st.integers(0, 1 << 14)),
    st.integers(1, 6),
    st.booleans(),
)
def test_a_limited_feed_reads_at_most_its_limit_and_loses_nothing(
    sent: list[str | bytes | None], cuts: list[int], limit: int, client: bool
) -> None:
    """Fed with a limit, and drained with b"" while `more`, a reader gives the same events
    as unlimited whatever the chunking, never more than `limit` a call (None: a Ping)."""
    wire, expected = b"", list[wsw.Event]()
    for m in sent:
        key = os.urandom(4) if client else None
        if m is None:
            wire += encode_frame(PING, b"p", key)
            expected.append(wsw.Ping(b"p"))
        else:
            wire += encode_frame(*((TEXT, m.encode()) if isinstance(m, str) else (BINARY, m)), key)
            expected.append(m)
    reader = WebSocketReader(masked=client, max_message=1 << 20)
    got: list[wsw.Event] = []
    for chunk in chunked(wire, cuts):
        batch = reader.feed(chunk, limit)
        got += drain_limited(batch, lambda: reader.feed(b"", limit), lambda: reader.more, limit)
    assert got == expected
    assert not reader.more


def test_more_is_false_once_what_waits_is_a_frame_not_whole() -> None:
    reader = WebSocketReader(masked=False, max_message=1 << 20)
    wire = encode_frame(BINARY, b"a") * 3 + encode_frame(BINARY, b"bcd")[:3]
    assert reader.feed(wire, 2) == [b"a", b"a"] and reader.more
    assert reader.feed(b"", 2) == [b"a"] and not reader.more  # the rest is a part frame
    assert reader.feed(b"", 2) == [] and not reader.more
    assert reader.feed(b"cd") == [b"bcd"] and not reader.more
    with pytest.raises(ValueError):
        reader.feed(b"", 0)  # (no frame read, and `more` would stay true)


@pytest.mark.parametrize(
    "frame_",
    [
        bytes([0x80 | BINARY, 126, 0, 5]) + b"x" * 5,  # 16 bits for a length under 126
        bytes([0x80 | BINARY, 127]) + (200).to_bytes(8, "big") + b"x" * 200,  # 64 for 200
        bytes([0x80 | PING, 126, 0, 1]) + b"x",  # a control frame's too
    ],
)
def test_a_length_not_in_its_shortest_form_is_refused_as_wsproto_does(frame_: bytes) -> None:
    with pytest.raises(ProtocolViolation, match="shortest form"):
        WebSocketReader(masked=False, max_message=1000).feed(frame_)
    client = Connection(ConnectionType.CLIENT)
    client.receive_data(frame_)
    assert isinstance(next(client.events()), CloseConnection)  # (wsproto: 1002 too)


@pytest.mark.parametrize("code", [0, 999, 1004, 1005, 1006, 1015, 1016, 2000, 2999, 5000, 65535])
def test_a_close_code_no_peer_may_send_is_a_violation(code: int) -> None:
    """§7.4: 1005, 1006 and 1015 are never sent, 1004 and 1016-2999 are reserved, and no
    code is under 1000 or over 4999; echoing one back would put it on the wire."""
    with pytest.raises(ProtocolViolation):
        WebSocketReader(masked=False, max_message=10).feed(frame(CLOSE, code.to_bytes(2, "big")))


@pytest.mark.parametrize("code", [1000, 1001, 1002, 1003, 1007, 1011, 1012, 1014, 3000, 4999])
def test_the_close_codes_a_peer_may_send(code: int) -> None:
    reader = WebSocketReader(masked=True, max_message=10)
    data = frame(CLOSE, code.to_bytes(2, "big") + "fin é".encode(), key=os.urandom(4))
    assert reader.feed(data) == [Close(code, "fin é")]


@pytest.mark.parametrize("opcode", [0x3, 0x7, 0xB, 0xF])
def test_reserved_opcodes_are_refused(opcode: int) -> None:
    with pytest.raises(ProtocolViolation, match="unknown opcode"):
        WebSocketReader(masked=False, max_message=10).feed(bytes([0x80 | opcode, 0]))


def test_a_long_close_reason_is_cut_at_a_character_boundary() -> None:
    payload = close_payload(1001, "é" * 100)  # 200 bytes of UTF-8, two to a character
    assert len(payload) == 124
    reader = WebSocketReader(masked=False, max_message=10)
    assert reader.feed(encode_frame(CLOSE, payload)) == [Close(1001, "é" * 61)]


@pytest.mark.parametrize("masked", [False, True])
def test_a_huge_declared_length_is_refused_from_the_header_alone(masked: bool) -> None:
    """A 64-bit length is refused the moment its last byte is in, whatever bytes the frame
    came in, before any payload is buffered."""
    head = bytes([0x80 | BINARY, (0x80 if masked else 0) | 127]) + (1 << 62).to_bytes(8, "big")
    reader = WebSocketReader(masked=masked, max_message=1 << 20)
    for byte in head[:-1]:
        assert reader.feed(bytes([byte])) == []
    with pytest.raises(MessageTooBig):
        reader.feed(head[-1:])


def test_many_fragments_hold_no_more_memory_than_their_payload() -> None:
    """Empty fragments add nothing, one-byte ones a byte each (not an object each): a peer
    cannot grow the reader's memory past `max_message` with fragments."""
    import tracemalloc

    # (an object, or a list slot, a fragment would hold 8-40 bytes each: 160 KB and more here)
    reader = WebSocketReader(masked=False, max_message=5_000)
    empty = frame(wsw.CONTINUATION, b"", fin=False) * 1000
    one = frame(wsw.CONTINUATION, b"x", fin=False) * 1000
    tracemalloc.start()
    try:
        reader.feed(frame(BINARY, b"", fin=False))
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(20):  # 20,000 empty fragments
            reader.feed(empty)
        for _ in range(4):  # 4,000 one-byte ones
            reader.feed(one)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert held < 2 * 5_000, held
    reader.feed(one)  # 5,000 bytes: the bound
    with pytest.raises(MessageTooBig):
        reader.feed(one)
    assert WebSocketReader(masked=False, max_message=10).feed(frame(BINARY, b"")) == [b""]


@pytest.mark.parametrize("masked", [False, True])
def test_a_stream_fed_a_byte_at_a_time(masked: bool) -> None:
    def key() -> bytes | None:
        return os.urandom(4) if masked else None

    wire = (
        frame(TEXT, "hé".encode()[:2], fin=False, key=key())  # a character cut in two
        + frame(PING, b"", key=key())
        + frame(wsw.CONTINUATION, "hé".encode()[2:], key=key())
        + frame(BINARY, b"y" * 300, key=key())  # a 16-bit length
        + frame(BINARY, b"z" * 70000, key=key())  # a 64-bit one
        + frame(CLOSE, close_payload(1000, "bye"), key=key())
    )
    reader = WebSocketReader(masked=masked, max_message=1 << 20)
    got = [event for i in range(len(wire)) for event in reader.feed(wire[i : i + 1])]
    assert got == [wsw.Ping(b""), "hé", b"y" * 300, b"z" * 70000, Close(1000, "bye")]


frame_parts = st.tuples(
    st.integers(0, 255),  # FIN, RSV, opcode
    st.sampled_from([0, 1, 5, 125, 126, 127]),  # the 7-bit length
    st.binary(max_size=12),  # what follows: an extended length, a key, a payload
)


@settings(max_examples=500)
@given(st.lists(frame_parts, max_size=8), st.booleans(), st.lists(st.integers(0, 200)))
def test_frame_shaped_garbage_raises_only_the_modules_errors_and_holds_little(
    parts: list[tuple[int, int, bytes]], masked: bool, cuts: list[int]
) -> None:
    wire = b"".join(bytes([a, (0x80 if masked else 0) | n]) + rest for a, n, rest in parts)
    reader = WebSocketReader(masked=masked, max_message=100)
    try:
        feed_all(reader, chunked(wire, cuts))
    except WebSocketError as exc:
        assert exc.code in (1002, 1007, 1009)
        assert all(isinstance(e, (str, bytes, wsw.Ping, wsw.Pong, Close)) for e in exc.events)
    assert len(reader._message) <= 100
