"""The I/O of one call's media core, whatever set the call up: `MediaIo`.

A WebRTC call (`session.py`: aiortc answers, DTLS keys the core) and a phone call
(`plain_rtp.py`: the trunk's SDP says it all, plain RTP) run the same sans-IO core
(`media/core.py`) the same way: datagrams of the call's media path go in as they arrive,
what the core sends goes to the path the session table selected, its events go to the
`SessionCallbacks`, and its timer is the process's one media clock (`media_clock.py`),
re-armed after every call into the core. Everything here runs on the loop thread.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

from firsthop.services.transceiver.media.core import (
    AudioReceived,
    CallMedia,
    CodedAudioReceived,
    DtmfReceived,
    FirstAudioReceived,
    FirstAudioSent,
    FramePlayed,
    FramesDropped,
    MediaParams,
)
from firsthop.services.transceiver.media.denoise import available as denoise_available
from firsthop.services.transceiver.recordings import RecordingFile
from firsthop.services.transceiver.rtc.media_clock import MediaClock
from firsthop.shared.address import Address


class Milestone(enum.StrEnum):
    """Facts of a call's setup, in the order they usually happen (span event names)."""

    ICE_CONNECTED = "ice_connected"
    DTLS_CONNECTED = "dtls_connected"
    DTLS_FAILED = "dtls_failed"
    DATACHANNEL_OPEN = "datachannel_open"
    FIRST_RTP_IN = "first_rtp_in"
    FIRST_AUDIO_OUT = "first_audio_out"


@dataclass
class SessionCallbacks:
    """What a session reports back (called on the loop thread, from asyncio context)."""

    audio: Callable[[bytes], None]  # a decoded 20 ms frame, PCM16 mono 48 kHz
    state: Callable[[str], None]  # the connection's state ("connected", "failed", ...)
    message: Callable[[str | bytes], None]  # from the caller's data channel
    selected: Callable[[], Address | None]  # the media path the session table chose
    milestone: Callable[[Milestone], None]
    count: Callable[[str], None]
    # something raised while handling the call's media: that call fails (`Session.fail`)
    failed: Callable[[str, BaseException], None] = lambda stage, exc: None
    dtmf: Callable[[str, float], None] = lambda digit, duration: None  # a key the caller pressed
    # a phone call's G.711 payload as it came (for an agent that takes the call's codec)
    coded_audio: Callable[[bytes], None] = lambda payload: None


@dataclass
class MediaIo:
    send: Callable[[bytes, Address], None]  # frames and sends one datagram to a client
    callbacks: SessionCallbacks
    media: CallMedia | None = field(init=False, default=None)  # from the answer on
    on_played: Callable[[Hashable], None] | None = field(init=False, default=None)
    on_dropped: Callable[[Hashable], None] | None = field(init=False, default=None)
    timer_at: float | None = field(init=False, default=None)  # (the media clock's entry)
    _clock: MediaClock | None = field(init=False, default=None)
    _counted: bool = field(init=False, default=False)  # its totals were handed over
    noise_reduction: str | None = field(init=False, default=None)  # what the session asked
    recording: RecordingFile | None = field(init=False, default=None)  # the call asked
    authenticated: int = field(init=False, default=0)  # SRTP/SRTCP datagrams that did
    authenticated_at: float = field(init=False, default=0.0)  # (monotonic) the last one's

    def new_media(self, params: MediaParams) -> CallMedia:
        """The call's media core, from its answer on (with the input's noise reduction and
        the recording, if the call asked before it existed)."""
        media = CallMedia(params)
        if self.noise_reduction is not None:
            media.set_noise_reduction(self.noise_reduction)
        if self.recording is not None:
            media.record(time.monotonic(), [f"CALL_ID={self.recording.call_id}"])
        return media

    def set_noise_reduction(self, kind: str | None) -> bool:
        """RNNoise on the caller's audio (`near_field`/`far_field`), or off (None); False when
        it cannot run here (not built, or pyrnnoise missing: counted `denoise_unavailable`)."""
        self.noise_reduction = kind
        if self.media is not None:
            return self.media.set_noise_reduction(kind)
        return kind is None or denoise_available()

    def media_datagram(self, data: bytes) -> None:
        """One RTP/RTCP datagram (RFC 7983: first byte 128-191) of the call's media path;
        `authenticated` counts those that did (`MediaCore.receive_datagram`)."""
        media = self.media
        if media is not None:
            try:
                now = time.monotonic()
                if media.receive_datagram(data, now):
                    self.authenticated += 1
                    self.authenticated_at = now
                self._pump(media)
            except Exception as exc:
                self.callbacks.failed("media", exc)

    # -- the agent's audio -----------------------------------------------------------------

    def push_audio(self, pcm: bytes, tag: Hashable | None = None) -> None:
        """Queue the agent's PCM16 mono 48 kHz (any length) to play into the call; frames
        dropped doing so are reported through `on_dropped`."""
        media = self.media
        if media is not None:
            media.push_audio(pcm, tag, time.monotonic())
            self._pump(media)

    def push_coded(self, payload: bytes, tag: Hashable | None = None) -> None:
        """Queue one 20 ms frame in the call's own codec (G.711 straight through)."""
        media = self.media
        if media is not None:
            media.push_coded(payload, tag, time.monotonic())
            self._pump(media)

    def clear_audio(self) -> None:
        media = self.media
        if media is not None:
            media.clear()
            if self.recording is not None and media.recorder is not None:
                self.recording.cut(round((time.monotonic() - media.recorder.start) * 1000))

    def configure_output(self, max_frames: int, drain_quiet: bool) -> None:
        if self.media is not None:
            self.media.configure_output(max_frames, drain_quiet)

    # -- the media core's I/O ------------------------------------------------------------------

    def on_timer(self, now: float) -> None:
        media = self.media
        if media is None:
            return
        try:
            media.handle_timer(now)
            self._pump(media)
        except Exception as exc:
            self.callbacks.failed("media", exc)

    def _pump(self, media: CallMedia) -> None:
        """Carry out what the core has for the world, then re-arm its timer."""
        if self.recording is not None and media.recorder is not None:
            self.recording.write(media.recorder.take())  # (a page a second; mostly nothing)
        datagrams = media.datagrams_to_send()
        if datagrams:
            addr = self.callbacks.selected()
            if addr is not None:
                for data in datagrams:
                    self.send(data, addr)
        while (event := media.next_event()) is not None:
            match event:
                case AudioReceived(pcm):
                    self.callbacks.audio(pcm)
                case CodedAudioReceived(payload):
                    self.callbacks.coded_audio(payload)
                case FramePlayed(tag):
                    if self.on_played is not None:
                        self.on_played(tag)
                case FramesDropped(tags):
                    for tag in tags:
                        if self.on_dropped is not None:
                            self.on_dropped(tag)
                case DtmfReceived(digit, duration):
                    self.callbacks.dtmf(digit, duration)
                case FirstAudioReceived():
                    self.callbacks.milestone(Milestone.FIRST_RTP_IN)
                case FirstAudioSent():
                    self.callbacks.milestone(Milestone.FIRST_AUDIO_OUT)
        if self._clock is not None:
            self._clock.arm(self, media.get_timer())

    # -- what it counted -----------------------------------------------------------------------

    def live_stats(self) -> dict[str, int]:
        """What this call has counted so far (for /metrics while it lasts)."""
        if self._counted or self.media is None:
            return {}
        return self.media.stats()

    def quality(self) -> dict[str, float]:
        """RTT, jitter and loss of the call (`CallMedia.summary`)."""
        return self.media.summary() if self.media is not None else {}

    def totals(self) -> dict[str, int]:
        """What this call counted, handed once to the transceiver's counters at its end."""
        stats = self.live_stats()
        self._counted = True
        return stats

    def close_media(self) -> None:
        media = self.media
        if media is not None:
            if self._clock is not None:
                self._clock.arm(self, None)
            media.close()  # (up to 30 s of a backend's audio: gone with the call)
        recording, self.recording = self.recording, None
        if recording is not None:  # its last pages, then the file is served
            recorder = media.recorder if media is not None else None
            if recorder is None:  # no media ever: nothing to keep
                recording.discard()
                return
            recording.write(recorder.close(time.monotonic()))
            recording.finish(
                recorder.seconds,
                recorder.file.suffix,
                {
                    "format": recorder.file.media_type,
                    "replaced": recorder.replaced,
                    "late": recorder.late,
                    "rebased": recorder.rebased,
                },
            )
