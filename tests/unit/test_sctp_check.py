"""`shared/wire/sctp_check.py`: what a caller's SCTP packet must look like before aiortc's
parser reads it. Packets built by aiortc's own serializer pass; each misreading a helper's
attacker read found is refused; and whatever passes, aiortc parses without raising (a
property test over random chunks, their CRC32c made right)."""

from __future__ import annotations

import struct

from aiortc.rtcsctptransport import (
    RECONFIG_PARAM_TYPES,
    DataChunk,
    ForwardTsnChunk,
    HeartbeatChunk,
    InitChunk,
    ReconfigChunk,
    SackChunk,
    StreamResetOutgoingParam,
    parse_packet,
    serialize_packet,
)
from google_crc32c import value as crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from firsthop.services.transceiver.rtc.sctp_hooks import last_of_each
from firsthop.shared.wire import sctp_check
from firsthop.shared.wire.sctp_check import MALFORMED, REFUSED, check


def packet(
    *chunks: tuple[int, int, bytes], ports: tuple[int, int] = (5000, 5000), tag: int = 0x12345678
) -> bytes:
    """An SCTP packet of raw chunks (type, flags, body), padded, its CRC32c right (`ports`
    and verification `tag` as its association's, for one sent over a real DTLS)."""
    body = b"".join(
        struct.pack("!BBH", kind, flags, 4 + len(b)) + b + b"\0" * (-len(b) % 4)
        for kind, flags, b in chunks
    )
    header = struct.pack("!HHL", *ports, tag)
    crc = crc32c(header + b"\0\0\0\0" + body)
    return header + struct.pack("<L", crc) + body


def of(chunk: object) -> bytes:
    return serialize_packet(5000, 5000, 0x12345678, chunk)  # type: ignore[arg-type]


def test_packets_aiortcs_own_stack_sends_pass() -> None:
    data = DataChunk(flags=3)
    data.tsn, data.stream_id, data.stream_seq, data.protocol = 7, 1, 0, 51
    data.user_data = b'{"type":"hello"}'
    sack = SackChunk()
    sack.cumulative_tsn, sack.advertised_rwnd = 100, 1 << 20
    sack.gaps, sack.duplicates = [(2, 3), (5, 9)], [99]
    beat = HeartbeatChunk()
    beat.params = [(1, b"\x01" * 12)]
    reset = ReconfigChunk()
    reset.params = [(13, bytes(StreamResetOutgoingParam(1, 2, 3, [1, 3])))]
    forward = ForwardTsnChunk()
    forward.cumulative_tsn, forward.streams = 50, [(1, 4), (3, 0)]
    init = InitChunk()
    init.initiate_tag, init.advertised_rwnd, init.initial_tsn = 1, 1 << 20, 5
    init.outbound_streams = init.inbound_streams = 65535
    init.params = [(0xC000, b""), (0x8008, b"\x82\xc0")]
    for chunk in (data, sack, beat, reset, forward, init):
        assert check(of(chunk)) is None, chunk
    both = bytes(data) + bytes(sack)  # (chunks as aiortc bundles them: padded)
    header = struct.pack("!HHL", 5000, 5000, 1)
    assert check(header + struct.pack("<L", crc32c(header + bytes(4) + both)) + both) is None


def test_a_parameter_of_length_zero_is_malformed() -> None:
    """aiortc's `decode_params` never moves past it: the thread loops for good (20 bytes)."""
    for kind in (sctp_check.HEARTBEAT, sctp_check.ABORT, sctp_check.ERROR, sctp_check.RECONFIG):
        assert check(packet((kind, 0, b"\x00\x01\x00\x00"))) == MALFORMED
    init_fields = bytes(16)
    assert check(packet((sctp_check.INIT, 0, init_fields + b"\x00\x01\x00\x00"))) == MALFORMED
    assert check(packet((sctp_check.HEARTBEAT, 0, b"\x00\x01\x00\x09abcd"))) == MALFORMED  # past


def test_a_sacks_gap_blocks_are_bounded_and_must_be_there() -> None:
    def sack(gaps: list[tuple[int, int]], claimed: int | None = None) -> bytes:
        n = len(gaps) if claimed is None else claimed
        body = struct.pack("!LLHH", 100, 1 << 20, n, 0)
        return packet((3, 0, body + b"".join(struct.pack("!HH", *g) for g in gaps)))

    assert check(sack([(1, 1024)])) is None
    assert check(sack([(1, 1025)])) == REFUSED
    assert check(sack([(1, 65535)] * 358)) == REFUSED  # (1.65 s of aiortc's before)
    assert check(sack([(1, 2)], claimed=5)) == MALFORMED
    assert check(sack([(5, 4)])) == MALFORMED  # (start past end: aiortc raised)
    assert check(packet((3, 0, bytes(11)))) == MALFORMED


def test_a_forward_tsn_names_few_streams_each_once_and_whole() -> None:
    def forward(streams: list[tuple[int, int]], tail: bytes = b"") -> bytes:
        pairs = b"".join(struct.pack("!HH", *s) for s in streams)
        return packet((192, 0, struct.pack("!L", 9) + pairs + tail))

    assert check(forward([(1, 2), (3, 4)])) is None
    # usrsctp names a stream once per abandoned chunk: its list passes (`last_of_each`)
    assert check(forward([(1, 2)] * 40 + [(i, 0) for i in range(9)])) is None
    assert check(forward([(1, 2)], tail=b"\x00\x01")) == MALFORMED


def test_a_forward_tsns_streams_are_each_taken_once_at_their_latest() -> None:
    """One stream named 360 times cost aiortc 8.8 ms a chunk (a pass a pair)."""
    pairs = [(1, 5), (1, 7), (2, 0), (1, 6), (1, 65535), (2, 3)] * 60
    assert last_of_each(pairs) == [(1, 7), (2, 3)]  # (65535 is before 7, RFC 1982)


def test_chunks_too_short_for_their_fields_and_a_bundled_init_are_malformed() -> None:
    assert check(packet((sctp_check.DATA, 3, bytes(11)))) == MALFORMED
    assert check(packet((sctp_check.SHUTDOWN, 0, b"\x00"))) == MALFORMED
    assert check(packet((sctp_check.INIT, 0, bytes(16)), (sctp_check.DATA, 3, bytes(13)))) == (
        MALFORMED
    )
    assert check(b"\x00" * 15) == MALFORMED
    bad_length = bytearray(packet((sctp_check.DATA, 3, bytes(13))))
    bad_length[14:16] = struct.pack("!H", 200)  # a chunk longer than the packet
    assert check(bytes(bad_length)) == MALFORMED


def test_reconfig_parameters_are_whole_and_few() -> None:
    def reconfig(*params: tuple[int, bytes]) -> bytes:
        body = b"".join(
            struct.pack("!HH", t, 4 + len(v)) + v + b"\0" * (-len(v) % 4) for t, v in params
        )
        return packet((sctp_check.RECONFIG, 0, body))

    reset = struct.pack("!LLL", 1, 2, 3) + struct.pack("!HH", 1, 3)
    assert check(reconfig((13, reset), (16, struct.pack("!LL", 1, 0)))) is None
    assert check(reconfig((13, reset[:11]))) == MALFORMED
    assert check(reconfig((13, reset + b"\x01"))) == MALFORMED  # half a stream id
    assert check(reconfig((16, b"\x00" * 7))) == MALFORMED
    assert check(reconfig(*[(16, struct.pack("!LL", i, 0)) for i in range(3)])) == REFUSED
    one = (sctp_check.RECONFIG, 0, struct.pack("!HH", 16, 12) + struct.pack("!LL", 1, 0))
    assert check(packet(one, one)) is None  # (a response and a request, bundled)
    assert check(packet(one, one, one)) == REFUSED  # (8 of them had drawn 16 sends)
    many = struct.pack("!LLL", 1, 2, 3) + b"".join(struct.pack("!H", i) for i in range(40))
    assert check(reconfig((13, many))) is None  # (dcSCTP resets closed channels together)


def test_chunks_of_a_kind_sent_once_a_packet_come_once() -> None:
    beat = (sctp_check.HEARTBEAT, 0, b"\x00\x01\x00\x08abcd")
    assert check(packet(beat)) is None
    assert check(packet(beat, beat)) == REFUSED  # (362 of them: as many answers sent)
    sack = (3, 0, struct.pack("!LLHH", 1, 1, 0, 0))
    assert check(packet(sack, sack)) == REFUSED
    error = (sctp_check.ERROR, 0, b"")
    assert check(packet(error, error)) == REFUSED  # (361 empty ones: 0.86 ms in aiortc)


def test_control_chunks_are_few_a_packet_and_data_is_not_counted() -> None:
    unknown = (0x3F, 0, b"")  # (a type aiortc skips, as an extension it does not know)
    assert check(packet(*[unknown] * sctp_check.MAX_CONTROL)) is None
    assert check(packet(*[unknown] * (sctp_check.MAX_CONTROL + 1))) == REFUSED
    data = (sctp_check.DATA, 3, bytes(13))
    assert check(packet(*[data] * 50)) is None  # (DATA: the chunk rate's business)


def test_an_init_once_the_association_is_up_is_refused() -> None:
    """aiortc would start the association again (its TSNs anew, its data channels no longer
    told to the session). A COOKIE ECHO again is a lost COOKIE ACK's retransmission."""
    init = packet((sctp_check.INIT, 0, bytes(16)))
    assert check(init) is None
    assert check(init, established=True) == REFUSED
    assert check(packet((sctp_check.COOKIE_ECHO, 0, bytes(24))), established=True) is None


KINDS = st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 14, 130, 192, 77])


@st.composite
def chunks(draw: st.DrawFn) -> tuple[int, int, bytes]:
    kind = draw(KINDS)
    if kind in (4, 5, 6, 9, 130) and draw(st.booleans()):  # parameters, some well formed
        params = draw(
            st.lists(
                st.tuples(st.sampled_from([1, 13, 16, 17, 0x8008]), st.binary(max_size=24)),
                max_size=3,
            )
        )
        body = b"".join(
            struct.pack("!HH", t, 4 + len(v)) + v + b"\0" * (-len(v) % 4) for t, v in params
        )
    else:
        body = draw(st.binary(max_size=64))
    return kind, draw(st.integers(0, 255)), body


@settings(max_examples=1500, deadline=None)
@given(st.lists(chunks(), min_size=1, max_size=4))
def test_what_passes_aiortc_parses_and_reads_without_raising(
    drawn: list[tuple[int, int, bytes]],
) -> None:
    data = packet(*drawn)
    if check(data) is not None:
        return
    _, _, _, parsed = parse_packet(data)  # (a parameter of length 0 would never return)
    for chunk in parsed:
        if isinstance(chunk, ReconfigChunk):
            for ptype, value in chunk.params:
                cls = RECONFIG_PARAM_TYPES.get(ptype)
                if cls is not None:
                    cls.parse(value)
        if isinstance(chunk, SackChunk):
            assert sum(max(0, b - a + 1) for a, b in chunk.gaps) <= sctp_check.MAX_GAP_SPAN


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200))
def test_no_bytes_make_the_check_raise(data: bytes) -> None:
    assert check(data) in (None, MALFORMED, REFUSED)
