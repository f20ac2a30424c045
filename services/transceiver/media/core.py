"""One call's media after the DTLS handshake, sans-IO: `CallMedia`.

Shaped like aioquic's connection. The I/O side feeds it the caller's SRTP and SRTCP
(`receive_datagram(data, now)`) and the agent's audio (`push_audio(pcm, tag, now)`,
`clear()`). It calls `handle_timer(now)` when `get_timer()` says, sends what
`datagrams_to_send()` returns to the call's selected path, and reads `next_event()` until
None. It must re-read `get_timer()` after every call into the core. Time is monotonic
seconds, passed in; randomness (SSRC-independent: initial sequence number and timestamp, the
RTCP interval's jitter) is injected.

What it owns:

* **inbound**: SRTP/SRTCP unprotected here (`srtp.py`: a forged or replayed packet is a
  counted drop that leaves no state). At most `MAX_SSRCS` streams per call, and one of a
  stream it has not yet heard is refused before the crypto runs (RTCP: the streams' SSRCs
  and `MAX_SSRCS` senders of reports alone). What authenticated is held to budgets a call:
  `MEDIA_RATE` datagrams a second, `AUDIO_RATE` seconds of audio decoded a second (each
  packet timed before it is decoded), `DTMF_RATE` keys told. Payload type, sequence
  and timestamp come from `shared/wire/rtp.py`. Loss, jitter and the extended highest
  sequence are kept for the reception report (RFC 3550 A.1, A.3, A.8). The jitter buffer
  (`jitter.py`) hands frames on in order, with lost ones in their slots. Opus is decoded
  (`opus.py`) and a loss is repaired from the next packet's in-band FEC, or concealed.
  Every 20 ms frame the caller sent becomes one `AudioReceived`;
* **outbound**: the ONE output clock (the policy of `pacing.py`: an idle call's first frame
  goes at once, a late mid-speech frame gets `LATE_GRACE` (`LATE_RUN` of them in a row and
  the clock re-phases to the agent's stream), a backlog drains through
  silence). Before it sits the frame cutter: the agent's PCM of any length is cut into 20 ms
  frames, and a part-frame is held until the rest comes or its slot is due (then padded).
  Then Opus encode, RTP sequence numbers and timestamps, SRTP;
* **RTCP**: an SR (or an RR before we have sent) with a reception report and SDES CNAME,
  every 0.5-1.5 s (RFC 3550 §6.2's randomisation); the caller's reports give the loss and
  jitter it sees and the round-trip time (§6.4.1: now - LSR - DLSR);
* **statistics** of the call (`stats()`), summed into the transceiver's counters at its end
  and set on its span.

It imports none of socket, trio, asyncio, aiortc or aioice (the purity test checks).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from firsthop.services.transceiver.media.codecs import CallCodec, CodecError, make_codec
from firsthop.services.transceiver.media.denoise import DenoiseError, Denoiser
from firsthop.services.transceiver.media.frames import CALL_RATE, FrameCutter
from firsthop.services.transceiver.media.jitter import Frame, LowLatencyJitterBuffer
from firsthop.services.transceiver.media.pacing import OutputQueue
from firsthop.services.transceiver.media.recorder import CallRecorder, OggOpus, WavG711
from firsthop.services.transceiver.media.srtp import PLAIN_RTP, PlainRtp, SrtpContext, SrtpCounts
from firsthop.shared.ratelimit import TokenBucket
from firsthop.shared.wire import dtmf, rtcp, rtp

MAX_SSRCS = 2  # RTP streams a caller may send (one audio track; one more for a switch)
# Seconds a mid-speech frame may be late before silence fills its slot. 8 ms until stop 47;
# at 16 the knee's gaps fell from 109-546 to 4-14 a step (20-80 calls) and residence p99 from
# 13.6-15.8 to 5.2-6.7 ms: a frame a little late had waited out a silent slot and the next.
LATE_GRACE = 0.016
LATE_RUN = 3  # the agent's frames late in a row (each within its grace) before the clock follows
MAX_BEHIND = 5  # slots the clock plays back to back after a stall; past that it re-phases
RTCP_INTERVAL = 1.0  # seconds, randomised 0.5-1.5x (RFC 3550 §6.3.1)
SENT_SRS = 8  # our last SRs remembered to time the caller's reports of them (RTT)
MAX_DROPOUT, MAX_MISORDER = 3000, 100  # RFC 3550 A.1
EVENTS = 512  # events waiting for the I/O side; past that the oldest audio is dropped
# The caller's audio decoded (and handed on, and recorded) at most this many seconds a
# second, with this many seconds banked: real time with room for a clock running fast and
# for what a stalled network delivers at once. Past it a frame is dropped undecoded
# (`audio_over_budget`). Without it, a caller's own authenticated 120 ms packets at the
# session's 1,000 datagrams a second had us decode 110 s of audio a second: one call took
# 27 % of a core, a normal one 4 % (docs/security.md).
AUDIO_RATE = 1.05
AUDIO_BURST = 4.0  # (ICE-TCP's retransmissions can hold seconds of it back, then let go)
# The caller's authenticated RTP and RTCP handled at most this many a second (burst: banked):
# 2.5 times a stream of 10 ms packets, 5 s of one banked. Past it a datagram is dropped
# once its authentication is checked (`media_rate_limited`), before it is parsed: a flood
# of authenticated packets of any length had cost 7 % of a core a call, not 4.
MEDIA_RATE = 250.0
MEDIA_BURST = 500.0
RTCP_PACKETS = 8  # of a compound RTCP datagram, read (an SR or RR, SDES, BYE: 3 at most)
# Keys (RFC 4733) told a second, with a burst banked: a dialler sends about 10 (a 50 ms tone
# and a 50 ms gap); past it a key is dropped, counted (`dtmf_rate_limited`), not told.
DTMF_RATE = 20.0
DTMF_BURST = 40.0


# -- what the I/O side is told ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AudioReceived:
    """One 20 ms frame of the caller, PCM16 mono 48 kHz (decoded, or repaired)."""

    pcm: bytes


@dataclass(frozen=True, slots=True)
class CodedAudioReceived:
    """A phone call's G.711 payload as it came (one per packet; a lost one's slot carries
    encoded silence): for an agent that takes the call's own codec, straight through."""

    payload: bytes


@dataclass(frozen=True, slots=True)
class FirstAudioReceived:
    pass


@dataclass(frozen=True, slots=True)
class FirstAudioSent:
    pass


@dataclass(frozen=True, slots=True)
class FramePlayed:
    """A tagged frame of the agent's went out: the caller hears it now."""

    tag: Hashable


@dataclass(frozen=True, slots=True)
class FramesDropped:
    """Tagged frames of the agent's that will never play (the queue's bounds)."""

    tags: tuple[Hashable, ...]


@dataclass(frozen=True, slots=True)
class DtmfReceived:
    """The caller pressed a key (RFC 4733 telephone-event): `digit` is 0-9, *, #, A-D;
    `duration` in seconds (as far as it is known when the event is first heard)."""

    digit: str
    duration: float


MediaEvent = (
    AudioReceived
    | CodedAudioReceived
    | FirstAudioReceived
    | FirstAudioSent
    | FramePlayed
    | FramesDropped
    | DtmfReceived
)


@dataclass(frozen=True, slots=True)
class MediaParams:
    """What offer/answer settled for the call's one audio stream."""

    ssrc: int  # ours, as the answer's a=ssrc says
    cname: str
    payload_type: int = 111  # the call's codec, as negotiated
    sending: bool = True  # the answer's direction lets us send (sendrecv, sendonly)
    mid: str | None = None
    mid_extension: int | None = None  # the extmap id of urn:ietf:params:rtp-hdrext:sdes:mid
    codec: str = "opus"  # or pcmu, pcma (`codecs.py`)
    telephone_event: int | None = None  # RFC 4733's payload type, if negotiated
    rtcp: bool = True  # send RTCP (a phone call: only if the trunk muxes it on the RTP port)


class CodedFrame(bytes):
    """A queued frame already in the call's codec (`push_coded`): sent as it is."""


class _Packet:
    """What the jitter buffer reads of a packet (`jitter.py`'s duck type)."""

    __slots__ = ("sequence_number", "timestamp", "payload_type", "payload")

    def __init__(self, seq: int, timestamp: int, payload_type: int, data: bytes) -> None:
        self.sequence_number = seq
        self.timestamp = timestamp
        self.payload_type = payload_type
        self.payload = data


class _Reception:
    """One inbound stream's reception statistics (RFC 3550 A.1, A.3, A.8)."""

    __slots__ = (
        "ssrc", "rate", "base", "max_seq", "cycles", "received", "expected_prior",
        "received_prior", "transit", "jitter",
    )  # fmt: skip

    def __init__(self, ssrc: int, seq: int, rate: int) -> None:
        self.ssrc = ssrc
        self.rate = rate  # the RTP clock
        self.base = seq
        self.max_seq = seq
        self.cycles = 0
        self.received = 0
        self.expected_prior = 0
        self.received_prior = 0
        self.transit: float | None = None
        self.jitter = 0.0  # timestamp units

    def update(self, seq: int, timestamp: int, now: float) -> None:
        delta = (seq - self.max_seq) & 0xFFFF
        if delta < MAX_DROPOUT:
            if seq < self.max_seq:
                self.cycles += 1 << 16
            self.max_seq = seq
        elif delta <= (1 << 16) - MAX_MISORDER:  # a jump: the stream starts over here
            self.base = self.max_seq = seq
            self.cycles = self.received = self.expected_prior = self.received_prior = 0
            self.transit = None
        self.received += 1
        transit = now * self.rate - timestamp
        if self.transit is not None:
            d = abs(transit - self.transit)
            if d < self.rate * 10:  # (a timestamp jump is not jitter)
                self.jitter += (d - self.jitter) / 16
        self.transit = transit

    @property
    def extended_max(self) -> int:
        return self.cycles + self.max_seq

    @property
    def lost(self) -> int:
        return self.extended_max - self.base + 1 - self.received

    def block(self, lsr: int, dlsr: int) -> rtcp.ReportBlock:
        expected = self.extended_max - self.base + 1
        expected_interval = expected - self.expected_prior
        received_interval = self.received - self.received_prior
        self.expected_prior, self.received_prior = expected, self.received
        lost_interval = expected_interval - received_interval
        fraction = 0
        if expected_interval > 0 and lost_interval > 0:
            fraction = min(255, (lost_interval << 8) // expected_interval)
        return rtcp.ReportBlock(
            self.ssrc, fraction, self.lost, self.extended_max, int(self.jitter), lsr, dlsr
        )


class CallMedia:
    def __init__(self, params: MediaParams, *, random: Callable[[int], bytes] = os.urandom) -> None:
        self.params = params
        self._srtp: SrtpContext | PlainRtp | None = None  # the keys, once DTLS has them
        self._srtp_counts: SrtpCounts | None = None  # what they counted, once closed
        self._closed = False
        self._random = random
        self._events: deque[MediaEvent] = deque()
        self._outbox: list[bytes] = []
        self.counts: dict[str, int] = dict.fromkeys(STATS, 0)
        # inbound
        self._ssrcs: set[int] = set()  # streams that authenticated (at most MAX_SSRCS)
        self._rtcp_ssrcs: set[int] = set()  # senders of RTCP alone, likewise
        self._stream: _Reception | None = None
        self._jitter = LowLatencyJitterBuffer(sink=self._on_frame)
        # (full at their first use, whenever that is: a bucket refills up to its burst)
        self._audio_budget = TokenBucket(AUDIO_RATE, AUDIO_BURST, 0.0)
        self._packet_budget = TokenBucket(MEDIA_RATE, MEDIA_BURST, 0.0)
        self._dtmf_budget = TokenBucket(DTMF_RATE, DTMF_BURST, 0.0)
        # of the streams before this one
        self._late_before = self._skipped_before = self._concealed_before = 0
        self.codec: CallCodec = make_codec(params.codec)
        self._rate = self.codec.clock_rate
        self._ts_scale = CALL_RATE // self._rate  # the output clock counts 48 kHz samples
        self._coded = params.codec in ("pcmu", "pcma")  # its payloads go out as they came
        self._dtmf_last: int | None = None  # the RTP timestamp of the last key heard
        self._audio_started = False
        self._denoiser: Denoiser | None = None  # RNNoise, when the session asks
        self.recorder: CallRecorder | None = None  # both sides as carried, when the call asks
        self._now = 0.0  # (of the datagram being handled: the jitter buffer calls back)
        self._their_lsr = 0  # the caller's last SR (middle 32 bits of its NTP time)
        self._their_lsr_at = 0.0
        # outbound
        self.out: OutputQueue[Hashable] = OutputQueue()
        self._cutter = FrameCutter()  # the agent's audio short of a whole frame...
        self._part_tag: Hashable | None = None  # ...and whose it is
        self._seq = int.from_bytes(random(2), "big")
        self._ts_base = int.from_bytes(random(4), "big")
        self._slot: float | None = None  # when the current frame is due
        self._grace = False  # the current slot waits `LATE_GRACE` for a late frame
        self._gap_run = 0  # silent slots since the agent's last frame, each after a grace
        self._late_run = 0  # the agent's frames in a row that came after their slot
        self._silent_run = 0
        self._sent_first = False
        self._ext = b""
        if params.mid is not None and params.mid_extension is not None:
            self._ext = rtp.encode_extensions(
                ((params.mid_extension, params.mid.encode()),), rtp.ONE_BYTE_PROFILE
            )
        # RTCP
        self._wall = 0.0  # wall clock minus `now`, for the SR's NTP time
        self._rtcp_at: float | None = None
        self._sent_srs: dict[int, float] = {}  # LSR -> when we sent that SR
        self._last_sent_at = 0.0
        self._last_sent_ts = 0
        self.rtt: float | None = None  # seconds, from the caller's last report of our SR
        self.remote_loss = 0  # what the caller's last report says it lost of ours
        self.remote_jitter = 0  # timestamp units, as it reported

    # -- the clock ----------------------------------------------------------------------------

    def start(self, srtp: SrtpContext | None, now: float, wall: float) -> None:
        """The keys are here (the DTLS handshake is done; None: a phone call's plain RTP,
        which has none): media flows, the output clock (if the call sends) and RTCP start.
        `wall` is the Unix time at `now` (for the NTP timestamps of SRs). What the agent
        queued before plays from now."""
        if self._srtp is not None or self._closed:
            return
        self._srtp = srtp if srtp is not None else PLAIN_RTP
        self._wall = wall - now
        if self.params.sending:
            self._slot = self.out.next_deadline(now)
        self._rtcp_at = now + self._rtcp_interval() if self.params.rtcp else None

    def get_timer(self) -> float | None:
        if self._slot is None:
            return self._rtcp_at
        slot = self._slot + LATE_GRACE if self._grace else self._slot
        return min(slot, self._rtcp_at) if self._rtcp_at is not None else slot

    def handle_timer(self, now: float) -> None:
        played = 0
        while self._slot is not None and now >= self._slot:
            if played >= MAX_BEHIND:  # a stall: play from now, not every missed slot
                self.out.rephase(now)
                self._slot = now
            if not self._grace and not self.out.frames and not self.out.idle:
                # Mid-speech and the next frame is not here yet: give it a moment before
                # playing silence (a gap), keeping the clock, so the next tick catches up.
                self._grace = True
            if self._grace and now < self._slot + LATE_GRACE:
                break
            self._play(now)
            played += 1
        if self._rtcp_at is not None and now >= self._rtcp_at:
            self._send_rtcp(now)
            self._rtcp_at = now + self._rtcp_interval()

    def _rtcp_interval(self) -> float:
        return RTCP_INTERVAL * (0.5 + int.from_bytes(self._random(2), "big") / 65536)

    # -- the agent's side ---------------------------------------------------------------------

    def push_audio(self, pcm: bytes, tag: Hashable | None = None, now: float | None = None) -> None:
        """Queue the agent's PCM16 mono 48 kHz, any length: cut into 20 ms frames here (a
        part-frame waits for the rest). An idle call's first frame goes out at once."""
        if self._cutter.held and tag is None:
            tag = self._part_tag
        frames = self._cutter.cut(pcm)
        self._part_tag = tag if self._cutter.held else None
        self._queue(frames, tag, now)

    def push_coded(
        self, payload: bytes, tag: Hashable | None = None, now: float | None = None
    ) -> None:
        """Queue one 20 ms frame already in the call's codec (G.711 straight through from an
        agent that speaks it): it takes its slot on the same clock and goes out as it is."""
        self._queue([CodedFrame(payload)], tag, now)

    def _queue(self, frames: list[bytes], tag: Hashable | None, now: float | None) -> None:
        if not frames:
            return
        was_idle = self.out.may_start_early()
        dropped = self.out.push_frames(frames, tag)
        if dropped:
            self._event(FramesDropped(tuple(dropped)))
        if now is None or self._slot is None or not self.out.frames:
            return
        if was_idle and now < self._slot:
            # Idle: the agent's audio starts now, not at the next tick of a clock that
            # started when DTLS did; the clock re-phases to it.
            rephase = True
        elif self._grace:  # the late frame came within its grace: it takes its slot now
            self.counts["output_late_played"] += 1
            self._late_run += 1
            # LATE_RUN in a row: the agent's stream lives after our tick (its clock, or the
            # path to it, moved); the clock follows it, so its jitter has the whole grace.
            rephase = self._late_run >= LATE_RUN
        else:  # on time: it waits for its tick
            self._late_run = 0
            return
        if rephase:
            self.out.rephase(now)
            self._slot = now
            self._late_run = 0
        self._play(now)

    def clear(self) -> None:
        """Drop the agent's queued audio (barge-in)."""
        self.out.clear()
        self._cutter.clear()
        self._part_tag = None

    def configure_output(self, max_frames: int, drain_quiet: bool) -> None:
        """A backend that sends a whole answer ahead: a bigger queue, its pauses kept."""
        self.out.max_frames, self.out.drain_quiet = max_frames, drain_quiet

    def _play(self, now: float) -> None:
        """The current slot's frame: the agent's, its padded part-frame, or silence."""
        out = self.out
        if not out.frames and self._cutter.held:  # its slot is due: padded, it plays
            padded = self._cutter.pad()
            assert padded is not None
            out.push_frames([padded], self._part_tag)
            self._part_tag = None
        pcm = out.pop()
        if pcm is None:
            # Mid-speech and its frame did not come even within the grace: a gap, if the
            # agent's speech goes on (else it was the end of it, once the call is idle).
            self._gap_run = 0 if out.idle else self._gap_run + int(self._grace)
            self._silent_run += 1
            payload = self.codec.silence(self._silent_run)
        else:
            self.counts["output_gaps"] += self._gap_run
            self._silent_run = self._gap_run = 0
            self.counts["agent_frames_played"] += 1
            if isinstance(pcm, CodedFrame):
                payload = bytes(pcm)
                self.counts["agent_frames_straight_through"] += 1
            else:
                payload = self.codec.encode(pcm)
            if not self._sent_first:
                self._sent_first = True
                self._event(FirstAudioSent())
            if out.played_tag is not None:
                self._event(FramePlayed(out.played_tag))
        self._send_rtp(payload, now)
        if self.recorder is not None:
            due = self._slot if self._slot is not None else now
            self.recorder.agent(payload, min(due, now), now)
        self._grace = False
        self._slot = out.next_deadline(now)

    def _send_rtp(self, payload: bytes, now: float) -> None:
        params = self.params
        ts = (self._ts_base + self.out.pts // self._ts_scale) & 0xFFFFFFFF
        head = rtp.pack_header(
            params.payload_type,
            self._seq,
            ts,
            params.ssrc,
            marker=self.counts["rtp_packets_out"] == 0,
            extension=bool(self._ext),
        )
        self._seq = (self._seq + 1) & 0xFFFF
        assert self._srtp is not None  # (the clock runs once the keys are here)
        self._outbox.append(self._srtp.protect_rtp(head + self._ext + payload))
        self.counts["rtp_packets_out"] += 1
        self.counts["rtp_bytes_out"] += len(payload)
        self._last_sent_at, self._last_sent_ts = now, ts

    # -- the caller's side --------------------------------------------------------------------

    def receive_datagram(self, data: bytes, now: float) -> bool:
        """One SRTP or SRTCP datagram from the call's validated path (RFC 7983: first byte
        128-191; anything else is not ours and is dropped). Whether it authenticated: the
        caller's own and fresh (SRTP's authentication and replay checks passed; a phone
        call's plain RTP always does), whatever it then held."""
        if len(data) < 8 or not 127 < data[0] < 192:
            self.counts["media_malformed"] += 1
            return False
        self._now = now
        srtp = self._srtp
        if srtp is None:
            self.counts["srtp_after_close" if self._closed else "srtp_before_keys"] += 1
            return False
        if rtp.is_rtcp(data):
            # libsrtp keeps a stream for each sender SSRC that authenticates, and looks
            # every packet's up in a list: a caller's SRTCP from ever new SSRCs made every
            # packet of the call slower (1 ms at 100,000). Those of its RTP streams, and
            # MAX_SSRCS more (a receive-only caller's reports), are let through to it.
            ssrc = int.from_bytes(data[4:8], "big")
            known = ssrc in self._ssrcs or ssrc in self._rtcp_ssrcs
            if not known and len(self._rtcp_ssrcs) >= MAX_SSRCS:
                self.counts["ssrc_refused"] += 1
                return False
            if not self._receive_rtcp(srtp, data, now):
                return False
            if not known:  # it authenticated: it may hold a place
                self._rtcp_ssrcs.add(ssrc)
            return True
        if len(data) < rtp.HEADER:
            self.counts["rtp_malformed"] += 1
            return False
        ssrc = int.from_bytes(data[8:12], "big")
        if ssrc not in self._ssrcs and len(self._ssrcs) >= MAX_SSRCS:
            self.counts["ssrc_refused"] += 1
            return False
        plain = srtp.unprotect_rtp(data)
        if plain is None:
            return False  # (counted by the SRTP context)
        self._ssrcs.add(ssrc)  # it authenticated: it may hold a place
        if self._packet_budget.take(now):
            self._receive_rtp(plain, ssrc, now)
        else:
            self.counts["media_rate_limited"] += 1
        return True

    def _receive_rtp(self, plain: bytes, ssrc: int, now: float) -> None:
        """An authenticated RTP packet's plaintext, of stream `ssrc`."""
        try:
            header = rtp.rtp_header(plain)
        except rtp.RtpError:
            self.counts["rtp_malformed"] += 1
            return
        if header.payload_type != self.params.payload_type:
            if header.payload_type == self.params.telephone_event:
                self._dtmf(plain[header.payload_start : header.payload_end], header.timestamp)
            else:
                self.counts["rtp_payload_type_unknown"] += 1
            return
        stream = self._stream
        if stream is None or stream.ssrc != ssrc:
            if stream is not None:  # a new stream (a track replaced): start it clean
                self.counts["ssrc_changed"] += 1
                self._late_before += self._jitter.late
                self._skipped_before += self._jitter.skipped
                self._concealed_before += self._jitter.concealed
                self._jitter = LowLatencyJitterBuffer(sink=self._on_frame)
            stream = self._stream = _Reception(ssrc, header.sequence_number, self._rate)
        stream.update(header.sequence_number, header.timestamp, now)
        self.counts["rtp_packets_in"] += 1
        payload = plain[header.payload_start : header.payload_end]
        self.counts["rtp_bytes_in"] += len(payload)
        self._jitter.add(
            _Packet(header.sequence_number, header.timestamp, header.payload_type, payload)
        )

    def _on_frame(self, frame: Frame) -> None:
        """One packet's frame(s) from the jitter buffer: decoded (a lost one repaired from
        the next packet's FEC, or concealed), so the agent hears every 20 ms."""
        codec = self.codec
        if frame.lost and not self._audio_started:
            return
        duration = codec.repair_duration() if frame.lost else codec.duration(frame.data)
        if not self._audio_budget.take(self._now, duration):
            self.counts["audio_over_budget"] += 1  # (neither decoded, nor heard, nor recorded)
            return
        recorder = self.recorder
        if recorder is not None:
            recorder.caller(None if frame.lost else frame.data, frame.timestamp, self._now)
        try:
            if frame.lost:
                pcm, from_fec = codec.recover(frame.data)
                self.counts["frames_repaired"] += 1
                self.counts["frames_repaired_fec"] += from_fec
                frames = [pcm]
                if self._coded:
                    self._event(CodedAudioReceived(codec.silence(1)))
            else:
                frames = codec.decode(frame.data)
                self.counts["frames_decoded"] += 1
                if self._coded:
                    self._event(CodedAudioReceived(frame.data))
        except CodecError:
            self.counts["opus_decode_error" if codec.name == "opus" else "decode_error"] += 1
            return
        if not frames:
            return
        if not self._audio_started:
            self._audio_started = True
            self._event(FirstAudioReceived())
        denoiser = self._denoiser
        for pcm in frames:
            if denoiser is not None:
                pcm = denoiser.process(pcm)
                self.counts["frames_denoised"] += 1
            self._event(AudioReceived(pcm))

    def record(self, now: float, comments: list[str] | None = None) -> bool:
        """Record both sides from now on (`recorder.py`: Ogg/Opus, or a G.711 call's WAVE
        file of its own law); False once the call is over."""
        if self._closed:
            return False
        if self.recorder is None:
            if self._coded:
                file: OggOpus | WavG711 = WavG711(self.params.codec)
            else:
                file = OggOpus(int.from_bytes(self._random(4), "big"), comments)
            self.recorder = CallRecorder(now, file)
        return True

    def set_noise_reduction(self, kind: str | None) -> bool:
        """RNNoise on what the agent hears from now on (`near_field` or `far_field`: one
        model serves both), or off (None). False, and off, when it cannot run here."""
        if kind is None:
            if self._denoiser is not None:
                self._denoiser.close()
                self._denoiser = None
            return True
        if self._denoiser is None and not self._closed:
            try:
                self._denoiser = Denoiser()
            except DenoiseError:
                self.counts["denoise_unavailable"] += 1
                return False
        return self._denoiser is not None

    def _dtmf(self, payload: bytes, timestamp: int) -> None:
        """RFC 4733: an event's packets share its timestamp (and its end is sent three
        times): each key is told once, when first heard."""
        try:
            event = dtmf.parse_event(payload)
        except dtmf.DtmfError:
            self.counts["dtmf_malformed"] += 1
            return
        if timestamp == self._dtmf_last or event.digit is None:
            return
        self._dtmf_last = timestamp
        if not self._dtmf_budget.take(self._now):
            self.counts["dtmf_rate_limited"] += 1
            return
        self.counts["dtmf_in"] += 1
        self._event(DtmfReceived(event.digit, event.duration / self._rate))

    def _receive_rtcp(self, srtp: SrtpContext | PlainRtp, data: bytes, now: float) -> bool:
        plain = srtp.unprotect_rtcp(data)
        if plain is None:
            return False
        if not self._packet_budget.take(now):
            self.counts["media_rate_limited"] += 1
            return True
        try:
            packets = rtcp.parse_rtcp(plain, RTCP_PACKETS)
        except rtcp.RtcpError:
            self.counts["rtcp_malformed"] += 1
            return True
        self.counts["rtcp_packets_in"] += 1
        for packet in packets:
            if isinstance(packet, rtcp.SenderReport):
                if self._stream is not None and packet.ssrc == self._stream.ssrc:
                    self._their_lsr, self._their_lsr_at = rtcp.middle_32(packet.ntp_timestamp), now
                self._reports(packet.reports, now)
            elif isinstance(packet, rtcp.ReceiverReport):
                self._reports(packet.reports, now)
            elif isinstance(packet, rtcp.Goodbye):
                self.counts["rtcp_bye_in"] += 1
        return True

    def _reports(self, blocks: tuple[rtcp.ReportBlock, ...], now: float) -> None:
        for block in blocks:
            if block.ssrc != self.params.ssrc:
                continue
            self.remote_loss, self.remote_jitter = block.cumulative_lost, block.jitter
            sent = self._sent_srs.get(block.lsr) if block.lsr else None
            if sent is not None:
                rtt = now - sent - block.dlsr / 65536
                if 0 <= rtt < 60:
                    self.rtt = rtt

    def _send_rtcp(self, now: float) -> None:
        params = self.params
        stream = self._stream
        blocks: tuple[rtcp.ReportBlock, ...] = ()
        if stream is not None and stream.received:
            dlsr = int((now - self._their_lsr_at) * 65536) if self._their_lsr else 0
            blocks = (stream.block(self._their_lsr, dlsr),)
        packet: rtcp.RtcpPacket
        if self.counts["rtp_packets_out"]:
            ntp = rtcp.ntp_timestamp(self._wall + now)
            ts = self._last_sent_ts + int((now - self._last_sent_at) * self._rate)
            packet = rtcp.SenderReport(
                params.ssrc,
                ntp,
                ts & 0xFFFFFFFF,
                self.counts["rtp_packets_out"] & 0xFFFFFFFF,
                self.counts["rtp_bytes_out"],
                blocks,
            )
            self._sent_srs[rtcp.middle_32(ntp)] = now
            while len(self._sent_srs) > SENT_SRS:
                del self._sent_srs[next(iter(self._sent_srs))]
        else:
            packet = rtcp.ReceiverReport(params.ssrc, blocks)
        sdes = rtcp.SourceDescription(((params.ssrc, ((rtcp.SDES_CNAME, params.cname.encode()),)),))
        assert self._srtp is not None
        self._outbox.append(self._srtp.protect_rtcp(rtcp.encode_rtcp([packet, sdes])))
        self.counts["rtcp_packets_out"] += 1

    # -- out to the I/O side ----------------------------------------------------------------------

    def datagrams_to_send(self) -> list[bytes]:
        out, self._outbox = self._outbox, []
        return out

    def next_event(self) -> MediaEvent | None:
        return self._events.popleft() if self._events else None

    def _event(self, event: MediaEvent) -> None:
        if len(self._events) >= EVENTS:  # nobody reads: the oldest goes
            self._events.popleft()
            self.counts["media_events_dropped"] += 1
        self._events.append(event)

    def stats(self) -> dict[str, int]:
        """The call's counters (summed into the transceiver's at its end)."""
        stats = dict(self.counts)
        srtp = self._srtp.counts if self._srtp is not None else self._srtp_counts
        if srtp is not None:
            stats["srtp_auth_fail"] = srtp.auth_failed
            stats["srtp_replay_fail"] = srtp.replayed
            stats["srtp_malformed"] = srtp.malformed
        stats["jitter_late"] = self._late_before + self._jitter.late
        stats["jitter_skipped"] = self._skipped_before + self._jitter.skipped
        # lost frames the buffer gave the decoder to repair (past 5 in a row: silence)
        stats["jitter_concealed"] = self._concealed_before + self._jitter.concealed
        stats["rtp_lost"] = max(0, self._stream.lost) if self._stream is not None else 0
        stats["output_dropped_full"] = self.out.dropped_full
        stats["output_dropped_quiet"] = self.out.dropped_quiet
        return stats

    def summary(self) -> dict[str, float]:
        """The call's quality, as both ends saw it (for its span and the histograms): RTT,
        the inbound jitter we measured, and what the caller's last report said of ours."""
        out: dict[str, float] = {}
        if self.rtt is not None:
            out["rtt_s"] = round(self.rtt, 6)
        if self._stream is not None:
            out["jitter_s"] = round(self._stream.jitter / self._rate, 6)
            expected = self._stream.extended_max - self._stream.base + 1
            out["loss_in"] = round(max(0, self._stream.lost) / expected, 4) if expected else 0.0
        if self.remote_jitter or self.remote_loss:
            out["remote_jitter_s"] = round(self.remote_jitter / self._rate, 6)
            out["remote_lost"] = float(self.remote_loss)
        return out

    def close(self) -> None:
        """The call is over: codecs freed, queue dropped; from now on the core is inert (what
        still arrives is dropped, its timer is None), its `stats()` still readable."""
        self.clear()
        self._slot = self._rtcp_at = None
        self._srtp_counts = self._srtp.counts if self._srtp is not None else None
        self._srtp = None
        self._closed = True
        self.codec.close()
        self.set_noise_reduction(None)


STATS = (
    "rtp_packets_in", "rtp_bytes_in", "rtp_packets_out", "rtp_bytes_out", "rtcp_packets_in",
    "rtcp_packets_out", "rtcp_malformed", "rtcp_bye_in", "rtp_malformed", "media_malformed",
    "rtp_payload_type_unknown", "ssrc_refused", "ssrc_changed", "frames_decoded",
    "frames_repaired", "frames_repaired_fec", "opus_decode_error", "decode_error",
    "agent_frames_played", "agent_frames_straight_through", "output_late_played", "output_gaps",
    "dtmf_in", "dtmf_malformed",
    "media_events_dropped", "srtp_before_keys", "srtp_after_close", "frames_denoised",
    "denoise_unavailable", "audio_over_budget", "media_rate_limited", "dtmf_rate_limited",
)  # fmt: skip
