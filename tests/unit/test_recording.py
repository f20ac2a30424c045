"""Recordings' pure parts: Ogg pages and Opus framing (RFC 3533, 7845, 6716), the recorder's
alignment with a fake clock, and the store's names and retention."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firsthop.services.transceiver.media.recorder import FRAME, SETTLE, SILENCE, CallRecorder
from firsthop.services.transceiver.recordings import RecordingError, RecordingStore, safe_name
from firsthop.shared.wire.ogg import (
    OggWriter,
    OpusPacketError,
    ogg_crc,
    opus_head,
    packet_samples,
    self_delimited,
)

VOICE = bytes([0xFC]) + bytes(range(1, 80))  # CELT FB 20 ms, mono, code 0 (TOC 0xfc)


def pages(data: bytes) -> list[tuple[int, int, list[bytes]]]:
    """(flags, granule, packets) of each page, CRCs checked."""
    out = []
    while data:
        assert data[:4] == b"OggS"
        flags, granule, _, _, crc, count = struct.unpack("<BqIIIB", data[5:27])
        lacing = data[27 : 27 + count]
        size = 27 + count + sum(lacing)
        page = bytearray(data[:size])
        page[22:26] = b"\0\0\0\0"
        assert ogg_crc(bytes(page)) == crc
        body, packets, current = data[27 + count : size], [], b""
        for value in lacing:
            current, body = current + body[:value], body[value:]
            if value < 255:
                packets.append(current)
                current = b""
        out.append((flags, granule, packets))
        data = data[size:]
    return out


def crc_by_the_book(data: bytes) -> int:
    """RFC 3533 §6 bit by bit: polynomial 0x04C11DB7, MSB first, 0 in, nothing out."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if crc & 0x80000000 else crc << 1
    return crc


def test_the_ogg_crc_is_the_one_of_rfc_3533() -> None:
    assert ogg_crc(b"") == 0
    assert ogg_crc(b"OggS") == crc_by_the_book(b"OggS")


@given(st.binary(max_size=300))
def test_the_fast_crc_agrees_with_the_book(data: bytes) -> None:
    assert ogg_crc(data) == crc_by_the_book(data)


def test_opus_packets_durations_and_self_delimiting() -> None:
    assert packet_samples(VOICE) == FRAME
    assert packet_samples(SILENCE) == FRAME
    assert packet_samples(bytes([0x08])) == 960  # SILK NB 20 ms
    assert packet_samples(bytes([0xFD])) == 1920  # code 1: two frames
    assert packet_samples(bytes([0xF3, 0x03])) == 3 * 480  # code 3, three 10 ms CELT frames
    assert self_delimited(VOICE) == VOICE[:1] + bytes([79]) + VOICE[1:]
    big = bytes([0xFC]) + bytes(300)
    framed = self_delimited(big)
    assert framed[1] == 252 + (300 & 3) and framed[2] == (300 - 252) >> 2
    for bad in (b"", bytes([0xFD, 1, 2])):
        with pytest.raises(OpusPacketError):
            self_delimited(bad)


def test_a_recording_is_a_two_channel_ogg_opus_stream_aligned_slot_by_slot() -> None:
    rec = CallRecorder(start=10.0, serial=7, comments=["CALL_ID=c1"])
    t = 10.0
    for i in range(100):
        if i % 10 != 3:  # the caller's tenth packets are lost
            rec.caller(VOICE, 5000 + i * FRAME, t + 0.003)
        if 40 <= i < 60:
            rec.agent(VOICE, t)
        t += 0.02
    data = rec.take() + rec.close(t)
    found = pages(data)
    head, tags, *audio = found
    assert head[0] == 0x02 and head[2][0] == opus_head(2, 2, 0, bytes([1, 0]), 0)
    assert tags[2][0].startswith(b"OpusTags") and b"CALL_ID=c1" in tags[2][0]
    packets = [p for _, _, ps in audio for p in ps]
    assert audio[-1][0] & 0x04 and audio[-1][1] == len(packets) * FRAME  # last page, granule
    voice_framed = self_delimited(VOICE)
    agent = [p.startswith(voice_framed) for p in packets]
    caller = [p.endswith(VOICE) for p in packets]
    assert agent.index(True) == 40 and sum(agent) == 20  # the agent's slots, where they were
    assert [i for i, c in enumerate(caller[:100]) if not c] == list(range(3, 100, 10))
    assert rec.replaced == 0 and rec.late == 0


def test_the_caller_keeps_its_own_spacing_and_what_comes_too_late_is_counted() -> None:
    rec = CallRecorder(start=0.0, serial=1)
    rec.caller(VOICE, 0, 0.0)
    rec.caller(VOICE, 2 * FRAME, 0.015)  # early by arrival, but its timestamp says slot 2
    rec.caller(VOICE, 1 * FRAME, 0.05)  # reordered: still slot 1
    rec.agent(SILENCE, 1.0)  # time passes: slots before 1.0 - SETTLE are written
    rec.caller(VOICE, 3 * FRAME, 1.0)  # slot 3, long written: late
    assert rec.late == 1
    packets = [p for _, _, ps in pages(rec.take() + rec.close(1.0))[2:] for p in ps]
    assert [p.endswith(VOICE) for p in packets[:4]] == [True, True, True, False]
    assert len(packets) == round(1.0 / 0.02) + 1 and 50 - SETTLE > 3


def test_a_packet_not_of_20_ms_is_written_as_silence_and_counted() -> None:
    rec = CallRecorder(start=0.0, serial=1)
    rec.caller(bytes([0xFD, 1, 2]), 0, 0.0)  # 40 ms
    rec.agent(bytes([0xFD, 1, 2]), 0.0)
    assert rec.replaced == 2


@given(st.lists(st.tuples(st.binary(max_size=40), st.integers(0, 2**32 - 1)), max_size=60))
def test_no_caller_packet_raises_and_the_file_stays_whole(
    packets: list[tuple[bytes, int]],
) -> None:
    rec = CallRecorder(start=0.0, serial=1)
    for i, (data, ts) in enumerate(packets):
        rec.caller(data or None, ts, i * 0.02)
    assert pages(rec.take() + rec.close(len(packets) * 0.02 + 1))  # every page checks


def test_store_names_and_retention(tmp_path: Path) -> None:
    for bad in ("../x", "a/b", "", "x" * 200, "a b"):
        with pytest.raises(RecordingError):
            safe_name(bad)
    store = RecordingStore(str(tmp_path), keep=3600, max_bytes=250)
    for name in ("old", "mid", "new"):
        rec = store.open(name)
        assert store.find(name) == "live"
        rec.write(bytes(100))
        rec.cut(1500)
        rec.finish(1.0, {})
    # 300 bytes over a 250 bound: the oldest went
    assert store.find("old") is None and store.find("new") == tmp_path / "new.opus"
    assert json.loads((tmp_path / "new.json").read_text())["cuts_ms"] == [1500]
    with pytest.raises(RecordingError):
        store.open("new")  # never written twice
    os.utime(tmp_path / "mid.opus", (0, 0))
    store.prune()
    assert store.find("mid") is None and store.find("new") is not None  # past its keep
    (tmp_path / "crashed.opus.part").write_bytes(b"OggS")
    again = RecordingStore(str(tmp_path), keep=3600, max_bytes=1 << 20)
    assert again.find("crashed") == tmp_path / "crashed.opus"
    assert again.meta("crashed")["interrupted"] is True


def test_ogg_writer_pages_hold_at_most_a_second() -> None:
    writer = OggWriter(serial=3)
    writer.header(b"OpusHead")
    for _ in range(120):
        writer.audio(VOICE, FRAME)
    writer.close()
    found = pages(writer.take())
    assert [len(p) for _, _, p in found] == [1, 50, 50, 20]
    assert [g for _, g, _ in found] == [0, 50 * FRAME, 100 * FRAME, 120 * FRAME]
