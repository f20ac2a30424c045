"""The per-call media core (services/transceiver/media/core.py) with a fake clock and a fake
caller speaking real SRTP (libsrtp with the other half of the same DTLS-style keys) and
real Opus: no peer connection, no socket."""

from __future__ import annotations

import math
import os

import numpy as np
import pylibsrtp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firsthop.services.transceiver.media import codecs, core
from firsthop.services.transceiver.media.core import (
    AudioReceived,
    CallMedia,
    FirstAudioReceived,
    FirstAudioSent,
    FramePlayed,
    FramesDropped,
    MediaParams,
)
from firsthop.services.transceiver.media.frames import FRAME_BYTES, FRAME_SAMPLES
from firsthop.services.transceiver.media.opus import OpusDecoder, OpusEncoder
from firsthop.services.transceiver.media.pacing import OutputQueue
from firsthop.services.transceiver.media.srtp import SrtpContext
from firsthop.shared.wire import rtcp, rtp

from .test_opus import encode, tone

KEYING = bytes(range(60))  # 2 * (16 + 14): AES128_CM_SHA1_80
PROFILE = "SRTP_AES128_CM_SHA1_80"
PT, OURS, THEIRS = 111, 0x5EED, 0xCA11E4


class Caller:
    """The far end: protects its RTP/RTCP with the client's keys, reads ours."""

    def __init__(self) -> None:
        self.media: CallMedia | None = None
        self.srtp = SrtpContext.from_keying_material(KEYING, PROFILE, client=True)
        self.heard: list[rtp.RtpPacket] = []
        self.rtcp: list[rtcp.RtcpPacket] = []

    def rtp(self, seq: int, ts: int, payload: bytes, ssrc: int = THEIRS, pt: int = PT) -> bytes:
        return self.srtp.protect_rtp(rtp.RtpPacket(pt, seq, ts, ssrc, payload).encode())

    def send(self, data: bytes, now: float) -> bool:
        """Whether the datagram authenticated (the media path may follow it)."""
        assert self.media is not None
        return self.media.receive_datagram(data, now)

    def collect(self) -> None:
        assert self.media is not None
        for data in self.media.datagrams_to_send():
            if rtp.is_rtcp(data):
                plain = self.srtp.unprotect_rtcp(data)
                assert plain is not None
                self.rtcp += rtcp.parse_rtcp(plain)
            else:
                plain = self.srtp.unprotect_rtp(data)
                assert plain is not None
                self.heard.append(rtp.parse_rtp(plain))


def make(random: bytes = b"") -> tuple[CallMedia, Caller]:
    counter = iter(range(1, 1 << 30))

    def fixed(n: int) -> bytes:  # deterministic "randomness": 0x01.., then 0x80.. (x1.0)
        return (random or bytes([next(counter) % 256])) * n if n != 2 else b"\x80\x00"

    params = MediaParams(ssrc=OURS, cname="firsthop", payload_type=PT, mid="0", mid_extension=1)
    media, caller = CallMedia(params, random=fixed), Caller()
    caller.media = media
    return media, caller


def server_keys() -> SrtpContext:
    return SrtpContext.from_keying_material(KEYING, PROFILE, client=False)


def keyed(random: bytes = b"") -> tuple[CallMedia, Caller]:
    """A call whose DTLS is done at t=0 (its clock started there)."""
    media, caller = make(random)
    media.start(server_keys(), 0.0, 0.0)
    return media, caller


def events(media: CallMedia) -> list[object]:
    out: list[object] = []
    while (e := media.next_event()) is not None:
        out.append(e)
    return out


def audio(evs: list[object]) -> list[bytes]:
    return [e.pcm for e in evs if isinstance(e, AudioReceived)]


PACKETS = encode(tone(60), fec=True)  # 1.2 s of a 440 Hz tone, VoIP mode with in-band FEC
# one Opus packet of the longest kind, 120 ms of the tone (through the core's own encoder)
LONGEST = OpusEncoder(codecs.OPUS_BITRATE).encode(tone(6).tobytes())


def seconds_heard(media: CallMedia) -> float:
    """Seconds of the caller's audio the core handed on since last asked."""
    return sum(len(pcm) for pcm in audio(events(media))) / 2 / 48000


# -- inbound ----------------------------------------------------------------------------------


def test_in_order_packets_each_become_one_frame() -> None:
    media, caller = keyed()
    for i in range(10):
        caller.send(caller.rtp(100 + i, 960 * i, PACKETS[i]), 0.02 * i)
    evs = events(media)
    assert isinstance(evs[0], FirstAudioReceived)
    frames = audio(evs)
    assert len(frames) == 10 and all(len(f) == FRAME_BYTES for f in frames)
    stats = media.stats()
    assert stats["rtp_packets_in"] == 10 and stats["frames_decoded"] == 10
    assert stats["rtp_lost"] == 0 and stats["rtp_bytes_in"] == sum(map(len, PACKETS[:10]))


def test_a_loss_is_repaired_from_the_next_packets_fec_and_counted() -> None:
    media, caller = keyed()
    for i in range(30):
        if i != 20:
            caller.send(caller.rtp(i, 960 * i, PACKETS[i]), 0.02 * i)
        if i == 22:  # the reorder window gave up on 20 once more packets queued
            pass
    frames = audio(events(media))
    stats = media.stats()
    assert len(frames) == 30  # the lost one has its slot
    assert stats["frames_repaired"] == 1 and stats["frames_repaired_fec"] == 1
    assert stats["jitter_skipped"] == 1 and stats["rtp_lost"] == 1


def test_reorder_costs_one_frame_once_then_the_window_absorbs_it() -> None:
    """At depth 0 (a clean link) a gap is given up on at once; the packet arriving late
    grows the window, and the next reorder of the same size loses nothing."""
    media, caller = keyed()
    for i in [0, 1, 2, 4, 3, 5, 6, 8, 7, 9]:
        caller.send(caller.rtp(i, 960 * i, PACKETS[i]), 0.02 * i)
    frames = audio(events(media))
    stats = media.stats()
    assert len(frames) == 10  # 3's slot repaired; 7 waited for
    assert stats["jitter_late"] == 1 and stats["frames_repaired"] == 1
    reference = OpusDecoder()
    expected = [reference.decode(PACKETS[i]) for i in range(3)]
    assert frames[:3] == expected


def test_a_duplicate_is_a_replay_dropped_by_srtp() -> None:
    media, caller = keyed()
    first = caller.rtp(1, 0, PACKETS[0])
    assert caller.send(first, 0.0)  # authenticated: the caller's own, fresh
    assert not caller.send(first, 0.001)  # a replay does not (it moves no media path)
    assert len(audio(events(media))) == 1
    assert media.stats()["srtp_replay_fail"] == 1 and media.stats()["rtp_packets_in"] == 1


def test_forged_srtp_is_a_counted_drop_that_takes_no_stream_place() -> None:
    media, caller = keyed()
    stranger = SrtpContext.from_keying_material(os.urandom(60), PROFILE, client=True)
    for ssrc in (1, 2, 3):  # three forged streams...
        forged = stranger.protect_rtp(rtp.RtpPacket(PT, 1, 0, ssrc, PACKETS[0]).encode())
        assert not caller.send(forged, 0.0)
        tampered = bytearray(caller.rtp(1, 0, PACKETS[0], ssrc=ssrc))
        tampered[-1] ^= 1
        assert not caller.send(bytes(tampered), 0.0)
    assert media.stats()["srtp_auth_fail"] == 6
    assert caller.send(caller.rtp(7, 0, PACKETS[0]), 0.0)  # ...the caller's own still counts
    assert len(audio(events(media))) == 1


def test_ssrc_change_starts_the_stream_clean_and_a_third_is_refused_unread() -> None:
    media, caller = keyed()
    for i in range(3):
        caller.send(caller.rtp(500 + i, 960 * i, PACKETS[i]), 0.02 * i)
    for i in range(3):  # replaceTrack: a new SSRC, its own sequence space
        caller.send(caller.rtp(9 + i, 77 + 960 * i, PACKETS[3 + i], ssrc=0xB0B), 0.1 + 0.02 * i)
    assert len(audio(events(media))) == 6
    caller.send(caller.rtp(1, 0, PACKETS[6], ssrc=0xC0C), 0.2)  # authentic, but a third
    stats = media.stats()
    assert stats["ssrc_changed"] == 1 and stats["ssrc_refused"] == 1
    assert stats["srtp_auth_fail"] == 0 and audio(events(media)) == []
    assert stats["rtp_lost"] == 0


def test_sequence_and_timestamp_wrap() -> None:
    media, caller = keyed()
    for i in range(12):
        seq, ts = (65530 + i) & 0xFFFF, (0xFFFFFFFF - 960 * 5 + 960 * i) & 0xFFFFFFFF
        caller.send(caller.rtp(seq, ts, PACKETS[i]), 0.02 * i)
    assert len(audio(events(media))) == 12
    assert media.stats()["rtp_lost"] == 0
    assert media._stream is not None and media._stream.extended_max == (1 << 16) + 5


def test_other_payload_types_and_non_media_are_counted_drops() -> None:
    media, caller = keyed()
    caller.send(caller.rtp(1, 0, b"\x00" * 4, pt=126), 0.0)  # telephone-event, say
    caller.send(b"\x16\xfe\xfd" + bytes(20), 0.0)  # DTLS: not the core's
    caller.send(b"\x80", 0.0)
    stats = media.stats()
    assert stats["rtp_payload_type_unknown"] == 1 and stats["media_malformed"] == 2
    assert audio(events(media)) == []


def test_a_caller_sending_audio_faster_than_real_time_is_decoded_at_most_in_real_time() -> None:
    """The caller's own authenticated 120 ms packets, 50 a second (6 s of audio a second):
    what is decoded, handed on and recorded keeps to AUDIO_RATE past AUDIO_BURST; the rest
    is dropped undecoded and counted. (Before: all of it decoded, 27 % of a core a call.)"""
    media, caller = keyed()
    payload = LONGEST
    assert codecs.opus_duration(payload) == pytest.approx(0.12)
    seconds = 10.0
    sent = int(seconds * 50)
    heard = 0.0
    for i in range(sent):
        caller.send(caller.rtp(i, i * 5760, payload), i * 0.02)
        heard += seconds_heard(media)
    budget = core.AUDIO_BURST + core.AUDIO_RATE * (sent - 1) * 0.02  # (by the last packet)
    assert budget - 0.121 <= heard <= budget + 0.001, (heard, budget)  # (0.12 s a packet)
    stats = media.stats()
    assert stats["audio_over_budget"] == sent - stats["frames_decoded"]
    assert stats["frames_decoded"] <= budget / 0.12 + 1 < sent / 4


def test_a_real_time_stream_and_its_losses_keep_within_the_audio_budget() -> None:
    """A minute of 20 ms packets, one in ten lost (repaired), and a second of them held up
    by the network and delivered at once: every frame decoded, nothing over a budget."""
    media, caller = keyed()
    for i in range(3000):
        if i % 10 == 3:
            continue  # lost: its slot is repaired when the next comes
        now = 21.0 if 1000 <= i < 1050 else i * 0.02  # (a stall of a second, let go)
        caller.send(caller.rtp(i, i * 960, PACKETS[i % len(PACKETS)]), now)
    stats = media.stats()
    assert stats["audio_over_budget"] == 0 and stats["media_rate_limited"] == 0
    assert stats["frames_decoded"] + stats["frames_repaired"] == 3000


def test_authenticated_datagrams_past_the_calls_rate_are_dropped_before_parsing() -> None:
    """A caller's own authenticated RTP and RTCP, 2,000 in a second: MEDIA_BURST of them and
    what MEDIA_RATE refills are handled, the rest dropped once authenticated (each still
    says it authenticated: the caller's path is the caller's)."""
    media, caller = keyed()
    took = [caller.send(caller.rtp(i, i * 960, PACKETS[i % 60]), i * 0.0005) for i in range(2000)]
    assert all(took)
    stats = media.stats()
    handled = stats["rtp_packets_in"]
    assert handled == pytest.approx(core.MEDIA_BURST + core.MEDIA_RATE * 1.0, abs=2)
    assert stats["media_rate_limited"] == 2000 - handled
    report = caller.srtp.protect_rtcp(rtcp.encode_rtcp([rtcp.ReceiverReport(THEIRS, ())]))
    assert caller.send(report, 1.0) and media.stats()["media_rate_limited"] == 2001 - handled
    assert caller.send(caller.rtp(2000, 2000 * 960, PACKETS[0]), 3.0)  # refilled: handled
    assert media.stats()["rtp_packets_in"] == handled + 1


def test_a_lost_frames_repair_is_charged_what_it_decodes() -> None:
    """A 120 ms packet, then empty ones each 6 ahead: every packet had the jitter buffer
    release 5 lost frames, each repaired as long as the last packet (120 ms) but charged
    20 ms, 7 s of audio a second handed on. Now each is charged what it decodes."""
    media, caller = keyed()
    payload = LONGEST
    caller.send(caller.rtp(0, 0, payload), 0.0)
    heard = seconds_heard(media)
    seconds, seq = 10.0, 0
    for i in range(1, int(seconds * 50)):
        seq += 6
        caller.send(caller.rtp(seq, seq * 5760, payload[:1]), i * 0.02)  # (a TOC byte alone)
        heard += seconds_heard(media)
    budget = core.AUDIO_BURST + core.AUDIO_RATE * seconds
    assert heard <= budget + 0.12, (heard, budget)
    assert media.stats()["audio_over_budget"] > 0


def test_srtcp_from_ever_new_ssrcs_is_refused_before_the_crypto() -> None:
    """libsrtp keeps a stream for every sender SSRC that authenticates and looks each
    packet's up in a list: a caller's SRTCP from new SSRCs, 1,000 a second, made every
    packet of its call slower without bound. Its RTP streams' SSRCs and MAX_SSRCS others
    (a receive-only caller's reports) are let through; the rest refused unread."""
    media, caller = keyed()
    caller.send(caller.rtp(0, 0, PACKETS[0]), 0.0)  # its RTP stream: THEIRS
    for i, ssrc in enumerate([THEIRS, 7, 8, 9, 10, 11]):
        report = rtcp.encode_rtcp([rtcp.ReceiverReport(ssrc, ())])
        took = caller.send(caller.srtp.protect_rtcp(report), 0.1 + i * 0.01)
        assert took == (i < 1 + core.MAX_SSRCS), (i, ssrc)
    stats = media.stats()
    assert stats["ssrc_refused"] == 3 and stats["rtcp_packets_in"] == 1 + core.MAX_SSRCS
    assert stats["srtp_auth_fail"] == 0  # (refused before libsrtp saw them)
    again = rtcp.encode_rtcp([rtcp.ReceiverReport(8, ())])  # a sender it kept: still heard
    assert caller.send(caller.srtp.protect_rtcp(again), 0.2)


def test_a_compound_rtcp_packet_is_read_to_its_first_few() -> None:
    media, caller = keyed()
    many = rtcp.encode_rtcp(
        [rtcp.ReceiverReport(THEIRS, ()), *(rtcp.Goodbye((THEIRS,)) for _ in range(140))]
    )
    assert caller.send(caller.srtp.protect_rtcp(many), 0.0)
    assert media.stats()["rtcp_bye_in"] == core.RTCP_PACKETS - 1


@settings(max_examples=300)
@given(st.binary(min_size=0, max_size=200), st.integers(128, 191))
def test_no_datagram_raises(data: bytes, first: int) -> None:
    media, caller = keyed()
    media.receive_datagram(bytes([first]) + data, 0.0)
    media.receive_datagram(bytes([first, 200]) + data, 0.0)  # as RTCP
    # ...nor does a malformed packet that authenticates
    plain = bytes([first]) + data[:11].ljust(11, b"\x00") + data[11:]
    try:
        protected = caller.srtp.protect_rtp(plain)
    except pylibsrtp.Error:  # (libsrtp will not protect what it cannot parse)
        return
    media.receive_datagram(protected, 0.0)


# -- outbound: the one output clock -------------------------------------------------------------


def pcm_tone(frames: int, level: int = 8000) -> bytes:
    return (tone(frames) * (level / 8000)).astype(np.int16).tobytes()


def test_silence_until_the_agent_speaks_then_its_first_frame_goes_at_once() -> None:
    media, caller = make()
    media.start(server_keys(), 10.0, 1_700_000_000.0)
    assert media.get_timer() == 10.0
    media.handle_timer(10.0)  # the first slot: silence
    caller.collect()
    assert len(caller.heard) == 1 and caller.heard[0].marker
    assert media.get_timer() == pytest.approx(10.02)
    media.push_audio(pcm_tone(2), tag=("r1", "i1"), now=10.005)  # idle: no wait for 10.02
    caller.collect()
    assert len(caller.heard) == 2
    assert media.get_timer() == pytest.approx(10.025)  # the clock re-phased to it
    evs = events(media)
    assert isinstance(evs[0], FirstAudioSent) and evs[1] == FramePlayed(("r1", "i1"))
    ts = [p.timestamp for p in caller.heard]
    assert ts[1] - ts[0] == FRAME_SAMPLES  # RTP time stays whole frames
    seqs = [p.sequence_number for p in caller.heard]
    assert seqs[1] == (seqs[0] + 1) & 0xFFFF
    assert rtp.extension(caller.heard[0], 1) == b"0"  # the MID (RFC 8843 §15)


def test_a_late_mid_speech_frame_gets_its_grace_and_keeps_the_phase() -> None:
    media, caller = make()
    media.start(server_keys(), 0.0, 0.0)
    media.push_audio(pcm_tone(3), now=0.0)
    for t in (0.0, 0.02, 0.04):
        media.handle_timer(t)
    caller.collect()
    assert media.stats()["agent_frames_played"] == 3
    media.handle_timer(0.06)  # nothing queued, mid-speech: wait up to LATE_GRACE
    caller.collect()
    n = len(caller.heard)
    assert media.get_timer() == pytest.approx(0.06 + core.LATE_GRACE)
    media.push_audio(pcm_tone(1), now=0.065)  # it came in its grace: played now
    caller.collect()
    assert len(caller.heard) == n + 1 and media.stats()["agent_frames_played"] == 4
    assert media.stats()["output_late_played"] == 1 and media.stats()["output_gaps"] == 0
    assert media.get_timer() == pytest.approx(0.08)  # the phase held
    media.handle_timer(0.08)  # nothing: grace again, then silence fills the slot
    media.handle_timer(0.08 + core.LATE_GRACE)
    caller.collect()
    assert len(caller.heard) == n + 2
    assert media.get_timer() == pytest.approx(0.10)
    too_late = 0.08 + core.LATE_GRACE + 0.001  # (its slot's silence has gone)
    media.push_audio(pcm_tone(1), now=too_late)  # too late for its slot: it takes the next
    media.handle_timer(0.10)
    assert media.stats()["output_gaps"] == 1  # a silent slot inside the speech: counted
    assert media.stats()["output_late_played"] == 1
    t = 0.12
    while not media.out.idle:  # the agent stops: each slot waits its grace, then silence
        media.handle_timer(t)
        media.handle_timer(t + core.LATE_GRACE)
        t += 0.02
    media.push_audio(pcm_tone(1), now=t)  # it speaks again, idle: no gap in between
    assert media.stats()["output_gaps"] == 1


def test_a_stream_that_keeps_coming_late_moves_the_clock_to_it() -> None:
    media, caller = make()
    media.start(server_keys(), 0.0, 0.0)
    media.push_audio(pcm_tone(2), now=0.0)
    for t in (0.0, 0.02):
        media.handle_timer(t)
    slot = 0.04
    for i in range(core.LATE_RUN):  # each frame 6 ms after its slot: played on arrival
        assert media.get_timer() == pytest.approx(slot)
        media.handle_timer(slot)
        media.push_audio(pcm_tone(1), now=slot + 0.006)
        slot += 0.02
        if i < core.LATE_RUN - 1:  # (one late frame, or two, is jitter: the phase holds)
            assert media.get_timer() == pytest.approx(slot)
    # the third in a row: the clock follows the stream (its next slot 6 ms later than the
    # old phase's), so a frame 5 ms past the old slot's grace is now within the new one's:
    # played on arrival, no gap
    assert media.get_timer() == pytest.approx(slot + 0.006)
    media.handle_timer(slot + 0.006)
    media.push_audio(pcm_tone(1), now=slot + core.LATE_GRACE + 0.005)
    stats = media.stats()
    assert stats["output_late_played"] == core.LATE_RUN + 1
    assert stats["output_gaps"] == 0 and stats["agent_frames_played"] == 2 + core.LATE_RUN + 1
    caller.collect()
    assert len(caller.heard) == 2 + core.LATE_RUN + 1


def test_the_frame_cutter_holds_a_part_frame_then_pads_it_in_its_slot() -> None:
    media, caller = make()
    media.start(server_keys(), 0.0, 0.0)
    media.handle_timer(0.0)  # silence
    said = pcm_tone(2)
    media.push_audio(said[: FRAME_BYTES // 2], now=0.005)  # half a frame: held
    assert not media.out.frames and media.stats()["agent_frames_played"] == 0
    media.push_audio(said[FRAME_BYTES // 2 : FRAME_BYTES * 3 // 2], now=0.006)
    assert media.stats()["agent_frames_played"] == 1  # idle: the whole frame went at once
    assert media.get_timer() == pytest.approx(0.026)
    # only the part is left: it gets the grace, then plays padded (the times are the clock's
    # own, as its loop calls it: 0.006 + 0.02 is not 0.026 in floating point)
    slot = media.get_timer()
    assert slot is not None
    media.handle_timer(slot)
    assert media.stats()["agent_frames_played"] == 1
    grace_end = media.get_timer()
    assert grace_end is not None
    assert grace_end == pytest.approx(0.026 + core.LATE_GRACE)
    media.handle_timer(grace_end)
    assert media.stats()["agent_frames_played"] == 2 and not media._cutter.held
    assert media.stats()["output_gaps"] == 0  # the padded part played: no gap
    caller.collect()
    decoder = OpusDecoder()
    heard = [decoder.decode(p.payload) for p in caller.heard]
    assert len(heard) == 3


def test_clear_drops_what_waits_and_tags_report_drops() -> None:
    media, caller = make()
    media.start(server_keys(), 0.0, 0.0)
    media.handle_timer(0.0)
    media.push_audio(pcm_tone(OutputQueue[object]().max_frames + 5), tag="t", now=0.001)
    evs = events(media)
    assert any(isinstance(e, FramesDropped) for e in evs)
    assert media.stats()["output_dropped_full"] >= 5
    media.clear()
    assert not media.out.frames


def test_after_a_stall_the_clock_plays_a_few_slots_then_rephases() -> None:
    media, caller = make()
    media.start(server_keys(), 0.0, 0.0)
    media.handle_timer(0.0)
    media.handle_timer(1.0)  # 50 slots missed
    caller.collect()
    assert len(caller.heard) == 1 + core.MAX_BEHIND + 1
    assert media.get_timer() == pytest.approx(1.02)


def test_the_agents_voice_decodes_to_what_it_said() -> None:
    media, caller = make()
    media.start(server_keys(), 0.0, 0.0)
    said = pcm_tone(20)
    media.push_audio(said, now=0.0)
    t = 0.0
    for _ in range(25):
        media.handle_timer(t)
        t += 0.02
    caller.collect()
    decoder = OpusDecoder()
    heard = np.frombuffer(
        b"".join(decoder.decode(p.payload) for p in caller.heard), np.int16
    ).astype(float)
    level = math.sqrt(np.mean(heard[10 * FRAME_SAMPLES : 18 * FRAME_SAMPLES] ** 2))
    assert 0.8 < level / (8000 / math.sqrt(2)) < 1.2


# -- RTCP -------------------------------------------------------------------------------------


def test_sender_reports_reception_reports_and_rtt() -> None:
    media, caller = make()
    media.start(server_keys(), 0.0, 1_700_000_000.0)
    t = 0.0
    for i in range(60):  # 1.2 s: packets both ways, one of the caller's lost
        if i != 30:
            caller.send(caller.rtp(i, 960 * i, PACKETS[i]), t)
        media.handle_timer(t)
        t = round(t + 0.02, 6)
    caller.collect()
    srs = [p for p in caller.rtcp if isinstance(p, rtcp.SenderReport)]
    assert srs, "an SR within 1.5 s"
    sr = srs[-1]
    assert sr.ssrc == OURS and sr.packet_count <= len(caller.heard)
    seconds = (sr.ntp_timestamp >> 32) - (1_700_000_000 + rtcp.NTP_EPOCH_OFFSET) % (1 << 32)
    assert 0 <= seconds <= 2  # NTP time of when it was sent, 0.5-1.5 s in
    (block,) = sr.reports
    assert block.ssrc == THEIRS and block.cumulative_lost == 1 and block.fraction_lost > 0
    assert block.highest_sequence >= 40
    sdes = [p for p in caller.rtcp if isinstance(p, rtcp.SourceDescription)]
    assert sdes[-1].chunks[0] == (OURS, ((rtcp.SDES_CNAME, b"firsthop"),))
    # the caller answers with an RR about our stream, 50 ms after our SR, sent 30 ms later
    dlsr = int(0.05 * 65536)
    rr = rtcp.ReceiverReport(
        THEIRS, (rtcp.ReportBlock(OURS, 0, 2, 0, 30, rtcp.middle_32(sr.ntp_timestamp), dlsr),)
    )
    sent_at = next(
        at for lsr, at in media._sent_srs.items() if lsr == rtcp.middle_32(sr.ntp_timestamp)
    )
    caller.send(caller.srtp.protect_rtcp(rtcp.encode_rtcp([rr])), sent_at + 0.08)
    assert media.rtt == pytest.approx(0.03, abs=0.001)
    assert media.remote_loss == 2 and media.remote_jitter == 30


def test_a_call_that_only_receives_sends_receiver_reports_and_no_rtp() -> None:
    params = MediaParams(ssrc=OURS, cname="firsthop", payload_type=PT, sending=False)
    media = CallMedia(params)
    caller = Caller()
    caller.media = media
    media.start(server_keys(), 0.0, 0.0)
    media.push_audio(pcm_tone(5), now=0.0)
    timer = media.get_timer()
    assert timer is not None and 0.5 <= timer <= 1.5  # RTCP's, no output slot
    media.handle_timer(timer)
    caller.collect()
    assert caller.heard == [] and isinstance(caller.rtcp[0], rtcp.ReceiverReport)
    assert caller.rtcp[0].reports == ()
    forged = bytearray(caller.srtp.protect_rtcp(rtcp.encode_rtcp([rtcp.Goodbye((THEIRS,))])))
    forged[5] ^= 1
    assert not caller.send(bytes(forged), 2.0)
    assert media.stats()["srtp_auth_fail"] == 1 and media.stats()["rtcp_bye_in"] == 0
    assert caller.send(caller.srtp.protect_rtcp(rtcp.encode_rtcp([rtcp.Goodbye((THEIRS,))])), 2.1)


def test_before_the_keys_media_is_dropped_and_the_agents_audio_waits() -> None:
    media, caller = make()
    assert not caller.send(caller.rtp(1, 0, PACKETS[0]), 0.0)
    assert media.stats()["srtp_before_keys"] == 1 and media.get_timer() is None
    media.push_audio(pcm_tone(2), now=0.1)  # the greeting, before DTLS is done
    media.start(server_keys(), 0.3, 0.0)
    assert media.get_timer() == 0.3
    media.handle_timer(0.3)
    media.handle_timer(0.32)
    caller.collect()
    assert media.stats()["agent_frames_played"] == 2 and len(caller.heard) == 2


def test_speech_after_a_gap_or_a_pause_decodes_at_its_level_at_once() -> None:
    """Moved from the asyncio track: a silent slot is encoded by the call's own encoder for
    the first few (the decoder's energy prediction stays in step), then the cached frame."""
    from firsthop.services.call.caller import tone_power

    media, caller = keyed()
    script = [True] * 10 + [False] + [True] * 6 + [False] * 15 + [True] * 6
    full_tone = pcm_tone(len(script), level=9830)
    t = 0.0
    for i, speaks in enumerate(script):
        if speaks:
            media.push_audio(full_tone[i * FRAME_BYTES : (i + 1) * FRAME_BYTES])
        media.handle_timer(t)
        media.handle_timer(t + core.LATE_GRACE)
        t = round(t + 0.02, 6)
    caller.collect()
    sent = [p.payload for p in caller.heard]
    decoder = OpusDecoder()
    power = [tone_power(decoder.decode(p), 440.0) for p in sent]
    full = min(power[5:10])
    assert full > 0.01
    assert min(power[12:17]) > 0.5 * full, power[11:17]  # from the second frame on
    assert min(power[33:38]) > 0.5 * full, power[32:38]
    assert sent[21:32] == [codecs.OPUS_SILENCE] * 11


def test_a_long_outage_is_repaired_for_five_frames_then_silence() -> None:
    media, caller = keyed()
    for i in list(range(10)) + list(range(20, 30)):  # 10 packets lost in a row
        caller.send(caller.rtp(i, 960 * i, PACKETS[i]), 0.02 * i)
    stats = media.stats()
    assert stats["jitter_skipped"] == 10 and stats["jitter_concealed"] == 5
    assert stats["frames_repaired"] == 5 and len(audio(events(media))) == 25


def test_the_summary_gives_rtt_jitter_and_loss_as_both_ends_saw_them() -> None:
    media, caller = keyed()
    assert media.summary() == {}
    for i in range(20):
        if i != 10:
            caller.send(caller.rtp(i, 960 * i, PACKETS[i]), 0.02 * i + (0.004 if i % 2 else 0))
    summary = media.summary()
    assert summary["loss_in"] == pytest.approx(1 / 20)
    assert 0.001 < summary["jitter_s"] < 0.004  # 4 ms of alternate-packet jitter, smoothed
    assert "rtt_s" not in summary  # no report of ours yet
