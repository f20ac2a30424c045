"""Recordings' pure parts: Ogg pages and Opus framing (RFC 3533, 7845, 6716), the recorder's
alignment with a fake clock, and the store's names and retention."""

from __future__ import annotations

import json
import os
import struct
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firsthop.services.transceiver.media.recorder import (
    FRAME,
    G711_FRAME,
    SETTLE,
    SILENCE,
    CallRecorder,
    OggOpus,
    WavG711,
)
from firsthop.services.transceiver.recordings import (
    MEDIA_TYPES,
    RecordingError,
    RecordingStore,
    safe_name,
)
from firsthop.shared.wire import wav
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
    rec = CallRecorder(10.0, OggOpus(7, ["CALL_ID=c1"]))
    t = 10.0
    for i in range(100):
        if i % 10 != 3:  # the caller's tenth packets are lost
            rec.caller(VOICE, 5000 + i * FRAME, t + 0.003)
        if 40 <= i < 60:
            rec.agent(VOICE, t, t)
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
    rec = CallRecorder(0.0, OggOpus(1))
    rec.caller(VOICE, 0, 0.0)
    rec.caller(VOICE, 2 * FRAME, 0.015)  # early by arrival, but its timestamp says slot 2
    rec.caller(VOICE, 1 * FRAME, 0.05)  # reordered: still slot 1
    rec.agent(SILENCE, 1.0, 1.0)  # time passes: slots before 1.0 - SETTLE are written
    rec.caller(VOICE, 2 * FRAME, 0.06)  # a duplicate of slot 2: not written twice
    assert rec.late == 1
    packets = [p for _, _, ps in pages(rec.take() + rec.close(1.0))[2:] for p in ps]
    assert [p.endswith(VOICE) for p in packets[:4]] == [True, True, True, False]
    assert len(packets) == round(1.0 / 0.02) + 1 and 50 - SETTLE > 3


@pytest.mark.parametrize("ppm", [-2000, 2000])
def test_a_caller_clock_off_ours_is_drawn_again_not_dropped(ppm: int) -> None:
    """A caller's timestamps running 0.2 % slow or fast (or a delay that changes): its line
    leaves the window and is drawn again, every packet is written, and never far from when it
    came (two minutes: a slot of drift each 10 s)."""
    rec = CallRecorder(0.0, OggOpus(1))
    spacing = FRAME * (1 + ppm / 1e6)
    data = bytearray()
    for i in range(6000):
        now = i * 0.02
        rec.caller(VOICE, round(i * spacing) % (1 << 32), now + 0.005)
        rec.agent(SILENCE, now, now)
        data += rec.take()
    data += rec.close(6000 * 0.02)
    packets = [p for _, _, ps in pages(bytes(data))[2:] for p in ps]
    heard = [i for i, p in enumerate(packets) if p.endswith(VOICE)]
    assert rec.rebased >= 1
    assert len(heard) >= 6000 - 15 * rec.rebased, (len(heard), rec.rebased, rec.late)
    assert abs(max(heard) - 5999) <= 10  # never far from when it came


def test_frames_a_stall_piled_up_keep_their_own_slots() -> None:
    rec = CallRecorder(0.0, OggOpus(1))
    for i in range(10):
        rec.agent(VOICE, i * 0.02, i * 0.02)
    for i in range(10, 13):  # a 60 ms stall: three frames sent at once, at 0.26
        rec.agent(VOICE, i * 0.02, 0.26)
    for i in range(13, 60):
        rec.agent(VOICE if i < 20 else SILENCE, i * 0.02, i * 0.02)
    packets = [p for _, _, ps in pages(rec.take() + rec.close(1.2))[2:] for p in ps]
    agent = [p.startswith(self_delimited(VOICE)) for p in packets]
    assert agent[:20] == [True] * 20 and not any(agent[20:])  # no slot moved


def test_a_packet_not_of_20_ms_is_written_as_silence_and_counted() -> None:
    rec = CallRecorder(0.0, OggOpus(1))
    rec.caller(bytes([0xFD, 1, 2]), 0, 0.0)  # 40 ms
    rec.agent(bytes([0xFD, 1, 2]), 0.0, 0.0)
    assert rec.replaced == 2


@given(st.lists(st.tuples(st.binary(max_size=40), st.integers(0, 2**32 - 1)), max_size=60))
def test_no_caller_packet_raises_and_the_file_stays_whole(
    packets: list[tuple[bytes, int]],
) -> None:
    rec = CallRecorder(0.0, OggOpus(1))
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
        rec.finish(1.0, ".opus", {})
        store.settle()
    # 300 bytes over a 250 bound: the oldest went
    assert store.find("old") is None and store.find("new") == tmp_path / "new.opus"
    assert json.loads((tmp_path / "new.json").read_text())["cuts_ms"] == [1500]
    assert not (tmp_path / "old.json").exists()
    with pytest.raises(RecordingError):
        store.open("new")  # never written twice
    os.utime(tmp_path / "mid.opus", (0, 0))
    store.prune()
    assert store.find("mid") is None and store.find("new") is not None  # past its keep
    with pytest.raises(RecordingError):
        RecordingStore(str(tmp_path), keep=3600, max_bytes=1 << 20)  # one transceiver a dir
    store.close()
    (tmp_path / "crashed.opus.part").write_bytes(b"OggS")
    again = RecordingStore(str(tmp_path), keep=3600, max_bytes=1 << 20)
    assert again.find("crashed") == tmp_path / "crashed.opus"
    assert again.meta("crashed")["interrupted"] is True
    again.close()


def test_a_recording_that_cannot_be_written_ends_quietly_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    store = RecordingStore(str(tmp_path), keep=3600, max_bytes=1 << 20, max_file_bytes=150)
    failing = store.open("full")
    assert failing.file is not None
    failing.file.close()  # the next write raises (as a full disk would)
    failing.write(b"OggS")
    failing.finish(1.0, ".opus", {})  # (nothing left to finish)
    store.settle()
    assert store.counters["recording_failed"] == 1
    assert store.find("full") is None and not list(tmp_path.glob("full*"))
    big = store.open("big")
    big.write(bytes(100))
    big.write(bytes(100))  # past 150 bytes: the file keeps what it had
    big.finish(1.0, ".opus", {})
    unset = store.open("never")  # a call whose setup failed
    unset.discard()
    store.settle()
    assert (tmp_path / "big.opus").stat().st_size == 100
    assert json.loads((tmp_path / "big.json").read_text())["truncated"] is True
    assert store.counters["recording_truncated"] == 1
    assert store.find("never") is None and not list(tmp_path.glob("never*"))
    store.close()


def test_ogg_writer_pages_hold_at_most_a_second() -> None:
    writer = OggWriter(serial=3)
    writer.header(b"OpusHead")
    for _ in range(120):
        writer.audio(VOICE, FRAME)
    writer.close()
    found = pages(writer.take())
    assert [len(p) for _, _, p in found] == [1, 50, 50, 20]
    assert [g for _, g, _ in found] == [0, 50 * FRAME, 100 * FRAME, 120 * FRAME]


def test_big_packets_start_a_new_page_before_the_lacing_runs_out() -> None:
    writer = OggWriter(serial=3)
    big = bytes([0xFC]) + bytes(1400)  # 6 lacing values each
    for _ in range(49):
        writer.audio(big, FRAME)
    writer.close()
    found = pages(writer.take())
    assert all(len(packets) * 6 <= 255 for _, _, packets in found)
    assert sum(len(packets) for _, _, packets in found) == 49
    with pytest.raises(OpusPacketError):
        writer.audio(bytes(255 * 255), FRAME)


# -- a G.711 phone call's recording: WAVE, its own law, nothing coded again ----------------------

ULAW = bytes(range(0, 160))  # a 20 ms slot of some mu-law bytes (not silence: 0xff)
AGENT = bytes(range(50, 210))


def wav_fields(data: bytes) -> tuple[int, int, int, int, int, int, int]:
    """(tag, channels, rate, block align, bits, fact samples, data size) of a WAVE header."""
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt " and data[38:42] == b"fact"
    tag, channels, rate, _, block, bits = struct.unpack_from("<HHIIHH", data, 20)
    assert struct.unpack_from("<I", data, 4)[0] in (len(data) - 8, 0xFFFFFFFF)
    (samples,) = struct.unpack_from("<I", data, 46)
    assert data[50:54] == b"data"
    (size,) = struct.unpack_from("<I", data, 54)
    return tag, channels, rate, block, bits, samples, size


def test_a_wave_header_of_g711_and_its_sizes() -> None:
    head = wav.g711_header(wav.MULAW, 2, 8000)
    assert len(head) == wav.HEADER == 58
    assert wav_fields(head) == (7, 2, 8000, 2, 8, 0xFFFFFFFF, 0xFFFFFFFF)  # not known yet
    sized = wav.sized_header(head, 321)  # a torn last frame is not counted
    assert wav_fields(sized + bytes(320)) == (7, 2, 8000, 2, 8, 160, 320)
    assert wav.data_size(sized) == 320
    assert wav_fields(wav.g711_header(wav.ALAW, 1, 8000, 5) + bytes(5))[::5] == (6, 5)
    assert wav.interleave(b"ab", b"AB") == b"aAbB"
    with pytest.raises(wav.WavError):
        wav.g711_header(1, 2, 8000)  # PCM is no G.711
    with pytest.raises(wav.WavError):
        wav.sized_header(b"RIFF", 0)
    with pytest.raises(wav.WavError):
        wav.interleave(b"a", b"")


def channels_of(data: bytes) -> tuple[bytes, bytes]:
    body = data[wav.HEADER :]
    return body[0::2], body[1::2]


def test_a_g711_call_is_recorded_as_wave_caller_left_agent_right_slot_by_slot() -> None:
    rec = CallRecorder(5.0, WavG711("pcmu"))
    t = 5.0
    for i in range(60):
        if i % 10 != 3:  # the caller's tenth packets are lost: silence in their slots
            rec.caller(ULAW, 1000 + i * G711_FRAME, t + 0.004)
        if 20 <= i < 30:
            rec.agent(AGENT, t, t)
        t += 0.02
    data = rec.take() + rec.close(t)
    left, right = channels_of(data)
    assert len(left) == len(right) == (60 + 1) * G711_FRAME  # to the same end
    slots = [left[i * 160 : (i + 1) * 160] for i in range(60)]
    assert [i for i, s in enumerate(slots) if s != ULAW] == list(range(3, 60, 10))
    assert slots[3] == b"\xff" * 160  # mu-law silence
    agent = [right[i * 160 : (i + 1) * 160] == AGENT for i in range(61)]
    assert agent.index(True) == 20 and sum(agent) == 10
    assert rec.replaced == 0 and rec.late == 0 and rec.seconds == pytest.approx(61 * 0.02)


@pytest.mark.parametrize("ms", [10, 20, 30, 40, 50])
def test_a_g711_caller_is_placed_sample_by_sample_whatever_its_packets_hold(ms: int) -> None:
    """A trunk may send 10, 30 ms or more a packet: every byte lands where its timestamp
    says, so the caller's channel is what it sent, byte for byte, from its first slot on."""
    said = bytes(i % 251 for i in range(8000))  # a second of bytes no two slots share
    size = 8 * ms
    rec = CallRecorder(0.0, WavG711("pcmu"))
    for i in range(len(said) // size):
        rec.caller(said[i * size : (i + 1) * size], 7 + i * size, i * ms / 1000 + 0.003)
    left, _ = channels_of(rec.take() + rec.close(1.1))
    n = len(said) // size * size
    assert left[:n] == said[:n] and left[n:] == b"\xff" * (len(left) - n)
    assert rec.late == rec.replaced == rec.rebased == 0


def test_the_agents_frames_not_of_20_ms_are_silence_and_the_file_comes_a_second_at_a_time() -> None:
    rec = CallRecorder(0.0, WavG711("pcma"))
    rec.caller(ULAW[:100], 0, 0.0)  # 12.5 ms: its samples, the rest of the slot silent
    rec.agent(AGENT[:80], 0.0, 0.0)  # the agent's are whole frames: counted, silence
    assert rec.replaced == 1
    assert rec.take() == b""  # (nothing a second long yet)
    for i in range(1, 61):
        rec.agent(AGENT, i * 0.02, i * 0.02)
    first = rec.take()
    assert wav.HEADER + 16000 <= len(first) < wav.HEADER + 16000 + 320  # a second's page
    left, right = channels_of(first + rec.take() + rec.close(1.3))
    assert left[:100] == ULAW[:100] and left[100:160] == b"\xd5" * 60  # A-law silence
    assert right[:160] == b"\xd5" * 160 and right[160:320] == AGENT
    with pytest.raises(ValueError):
        WavG711("opus")


def test_a_finished_wave_recording_gets_its_sizes_and_an_interrupted_one_too(
    tmp_path: Path,
) -> None:
    store = RecordingStore(str(tmp_path), keep=3600, max_bytes=1 << 20)
    rec = store.open("phone")
    recorder = CallRecorder(0.0, WavG711("pcmu"))
    for i in range(50):
        recorder.caller(ULAW, i * G711_FRAME, i * 0.02)
        rec.write(recorder.take())
    rec.write(recorder.close(1.0))
    rec.finish(recorder.seconds, recorder.file.suffix, {"format": recorder.file.media_type})
    store.settle()
    path = tmp_path / "phone.wav"
    assert store.find("phone") == path and MEDIA_TYPES[path.suffix] == "audio/wav"
    data = path.read_bytes()
    assert wav_fields(data)[5:] == (51 * 160, 51 * 320)
    assert store.meta("phone")["format"] == "audio/wav"
    store.close()
    # a process stopped mid-call: its WAVE part (a torn last frame too) is sized and kept,
    # an Ogg one and one of the older naming (`.opus.part`) as they are
    (tmp_path / "cut.part").write_bytes(wav.g711_header(wav.MULAW, 2, 8000) + bytes(641))
    (tmp_path / "ogg.part").write_bytes(b"OggS")
    (tmp_path / "older.opus.part").write_bytes(b"OggS")
    (tmp_path / "empty.part").write_bytes(b"")  # stopped before its first write: no file
    (tmp_path / "torn.part").write_bytes(wav.g711_header(wav.MULAW, 2, 8000)[:30])  # ditto
    (tmp_path / "foreign.part").write_bytes(b"RIFF" + bytes(100))  # not ours: left alone
    again = RecordingStore(str(tmp_path), keep=3600, max_bytes=1 << 20)
    assert not list(tmp_path.glob("empty*")) and not list(tmp_path.glob("torn*"))
    assert [p.name for p in tmp_path.glob("foreign*")] == ["foreign.part"]
    assert again.meta("cut")["format"] == "audio/wav" and again.meta("ogg")["format"] == "audio/ogg"
    cut = (tmp_path / "cut.wav").read_bytes()
    assert len(cut) == wav.HEADER + 640 and wav_fields(cut)[5:] == (320, 640)
    assert again.find("ogg") == tmp_path / "ogg.opus"
    assert again.find("older") == tmp_path / "older.opus"
    assert again.meta("cut")["interrupted"] is True
    with pytest.raises(RecordingError):
        again.open("phone")  # a .wav of it is there: never written twice
    again.prune(now=time.time() + 7200)  # past its keep: both kinds go
    assert not list(tmp_path.glob("*.wav")) and not list(tmp_path.glob("*.opus"))
    again.close()


def test_recordings_being_written_count_toward_the_budget_and_stop_growing_past_it(
    tmp_path: Path,
) -> None:
    """Many calls recorded at once cannot write past `max_bytes` between two ends: what is
    being written counts, the oldest finished ones go to make room, and past the budget on
    their own the recordings stop growing (`recording_truncated`), never the calls."""
    store = RecordingStore(str(tmp_path), keep=3600, max_bytes=6400)
    old = store.open("old")
    old.write(bytes(3000))
    old.finish(1.0, ".opus", {})
    store.settle()
    live = [store.open(f"live{i}") for i in range(4)]
    for _ in range(10):
        for rec in live:
            rec.write(bytes(200))
    store.settle()
    assert store.find("old") is None  # made room (3000 + 4 x 2000 > 6400)
    assert store.live_bytes <= 6400 and sum(r.size for r in live) == store.live_bytes
    assert store.counters["recording_truncated"] >= 1 and all(r.file for r in live)
    for rec in live:
        rec.finish(1.0, ".opus", {})
    store.settle()
    assert store.live_bytes == 0
    store.close()
