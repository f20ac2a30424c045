from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firsthop.shared.wire import rfc4571
from firsthop.shared.wire.rfc4571 import Deframer, OversizeFrame, frame
from tests.support import drain_limited


def test_frame_layout() -> None:
    assert frame(b"abc") == b"\x00\x03abc"
    assert frame(b"") == b"\x00\x00"
    assert rfc4571.prefix(0x1234) == b"\x12\x34"
    with pytest.raises(OversizeFrame):
        frame(bytes(0x10000))
    with pytest.raises(OversizeFrame):
        rfc4571.prefix(-1)


def test_partial_reads_byte_by_byte() -> None:
    d = Deframer()
    stream = frame(b"hello") + frame(b"") + frame(b"world!")
    out: list[bytes] = []
    for i in range(len(stream)):
        out += d.feed(stream[i : i + 1])
        if out == [b"hello"]:
            assert d.buffered < len(frame(b"world!")) + 2
    assert out == [b"hello", b"", b"world!"]
    assert d.buffered == 0


def test_many_frames_in_one_read_and_a_tail() -> None:
    d = Deframer()
    assert d.feed(frame(b"a") + frame(b"bb") + frame(b"ccc")[:3]) == [b"a", b"bb"]
    assert d.buffered == 3
    assert d.feed(b"cc") == [b"ccc"]
    assert d.feed(memoryview(frame(b"dd"))) == [b"dd"]


def test_oversize_frame_fails_the_stream() -> None:
    d = Deframer(max_frame=1500)
    assert d.feed(frame(bytes(1500))) == [bytes(1500)]
    with pytest.raises(OversizeFrame):
        d.feed(b"\x05\xdd")  # 1501: known from the length alone, before any payload
    assert d.buffered == 0  # nothing held for a stream that failed
    with pytest.raises(OversizeFrame):
        d.feed(frame(b"x"))


def test_bound_must_fit_the_length_field() -> None:
    with pytest.raises(ValueError):
        Deframer(max_frame=0x10000)


@given(st.lists(st.binary(max_size=300), max_size=20), st.lists(st.integers(1, 50), min_size=1))
def test_any_split_gives_the_frames_back(payloads: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(frame(p) for p in payloads)
    d = Deframer(max_frame=300)
    out = [f for piece in pieces(stream, cuts) for f in d.feed(piece)]
    assert out == payloads
    assert d.buffered == 0


@given(st.binary(max_size=2000))
def test_garbage_raises_only_framing_errors(data: bytes) -> None:
    d = Deframer(max_frame=1500)
    try:
        frames = d.feed(data)
    except rfc4571.FramingError:
        return
    assert sum(len(f) + 2 for f in frames) + d.buffered == len(data)


@given(
    st.lists(st.binary(max_size=300), max_size=40),
    st.lists(st.integers(1, 400), min_size=1),
    st.integers(1, 5),
)
def test_a_limited_feed_reads_at_most_its_limit_and_loses_nothing(
    payloads: list[bytes], cuts: list[int], limit: int
) -> None:
    """Fed with a limit and drained with b"" while `more`, the same frames come back as
    unlimited, whatever the split, never more than `limit` a call (empty frames count)."""
    stream = b"".join(frame(p) for p in payloads)
    d = Deframer(max_frame=300)
    out: list[bytes] = []
    for piece in pieces(stream, cuts):
        out += drain_limited(
            d.feed(piece, limit), lambda: d.feed(b"", limit), lambda: d.more, limit
        )
    assert out == payloads
    assert d.buffered == 0 and not d.more


def test_more_is_false_once_what_is_left_is_a_part_frame() -> None:
    d = Deframer()
    stream = frame(b"") * 3 + frame(b"abc")[:3]
    assert d.feed(stream, 2) == [b"", b""] and d.more
    assert d.feed(b"", 2) == [b""] and not d.more  # the rest: a part frame
    assert d.feed(b"bc", 2) == [b"abc"] and not d.more
    with pytest.raises(ValueError):
        d.feed(b"", 0)


def pieces(stream: bytes, cuts: list[int]) -> list[bytes]:
    """`stream` cut into pieces of the sizes in `cuts`, cycled (as TCP may hand it over)."""
    out, pos, i = [], 0, 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        out.append(stream[pos : pos + step])
        pos += step
        i += 1
    return out
