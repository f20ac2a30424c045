"""The per-frame loops in C (`shared/_speedups.c`) against numpy's (`shared/speedups.py`)."""

from __future__ import annotations

import array

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firsthop.shared import speedups
from firsthop.shared.speedups import mask_numpy, peak_numpy


def test_the_c_loops_are_built_here() -> None:
    """`make test`'s install builds them (setup.py): numpy's stand-ins are for a machine
    without a compiler, not this one."""
    assert speedups.BUILT
    assert speedups.mask is not mask_numpy
    assert speedups.peak is not peak_numpy


@given(st.binary(max_size=4000), st.binary(min_size=4, max_size=4))
def test_mask_is_numpys_and_undoes_itself(data: bytes, key: bytes) -> None:
    masked = speedups.mask(data, key)
    assert masked == mask_numpy(data, key)
    assert speedups.mask(masked, key) == data
    assert speedups.mask(bytearray(data), key) == masked  # any buffer


def test_mask_repeats_the_key_from_the_first_byte() -> None:
    """RFC 6455 §5.3: octet i of the payload is XORed with octet i mod 4 of the key."""
    key = bytes((1, 2, 4, 8))
    assert speedups.mask(bytes(11), key) == key * 2 + key[:3]
    assert speedups.mask(b"", key) == b""


@pytest.mark.parametrize("key", [b"", b"abc", b"abcde"])
def test_a_key_not_four_bytes_is_refused(key: bytes) -> None:
    for mask in (speedups.mask, mask_numpy):
        with pytest.raises(ValueError):
            mask(b"data", key)


@given(st.binary(max_size=4000))
def test_peak_is_numpys(pcm: bytes) -> None:
    assert speedups.peak(pcm) == peak_numpy(pcm)


def test_peak_of_the_extremes() -> None:
    assert speedups.peak((-32768).to_bytes(2, "little", signed=True)) == 32768
    assert speedups.peak((32767).to_bytes(2, "little", signed=True) + b"\x7f") == 32767
    assert speedups.peak((-65).to_bytes(2, "little", signed=True) * 3) == 65
    assert speedups.peak(b"") == speedups.peak(b"\xff") == 0


def test_numpys_count_bytes_as_c_does_whatever_the_buffers_items() -> None:
    """A helper's read (stop 42): numpy's stand-ins counted a buffer's items, not its bytes,
    so an array of 16-bit samples had half its samples looked at (peak 2000 for 30000) and
    a mask of one refused."""
    samples = memoryview(array.array("h", [1000, -2000, 3000, -30000]))  # (4 items, 8 bytes)
    assert peak_numpy(samples) == speedups.peak(samples) == 30000
    odd = memoryview(array.array("h", [1, 2, 3]))
    assert mask_numpy(odd, b"abcd") == speedups.mask(odd, b"abcd")
