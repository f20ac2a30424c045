"""Streaming sample-rate conversion of PCM16 mono for agent protocols.

A call's audio is 48 kHz; a Realtime backend speaks 24 kHz PCM16 (or G.711 at 8 kHz). The
conversion is libswresample's (through PyAV, which aiortc already brings): a real
anti-aliasing filter, in C, stateful across frames so a stream resampled 20 ms at a time has
no seams. It runs where the audio is, on the transceiver's loop thread.

* `Resampler(src, dst)`: `push(pcm) -> pcm` as the stream goes, `flush() -> pcm` for the
  filter's tail at the end of a stream (a few samples), `reset()` to start a new stream.
  Building a filter costs about 0.2-0.3 ms, 15-20 pushes of a 20 ms frame, and an agent can
  end a stream with every tiny delta (a 4-byte delta and its `done`, 64 to a read, held the
  loop 10-25 ms): so one is rebuilt only once it has had `REBUILD_AFTER` of audio. Before
  that, a flush leaves the tail in the filter and a reset keeps it: the next stream starts
  with those few samples (under 2 ms) of the last.
* `resample(pcm, src, dst)`: a whole buffer at once (a stream of one push, flushed).

The G.711 codecs are `shared/wire/g711.py`.

Invariants: input and output are PCM16 little-endian mono; an odd trailing byte is dropped.
"""

from __future__ import annotations

from av import AudioFrame, AudioResampler

REBUILD_AFTER = 0.1  # s of input audio a filter must have had before it is built anew


class Resampler:
    """PCM16 mono from `src` Hz to `dst` Hz, one stream (stateful across calls)."""

    def __init__(self, src: int, dst: int, rebuild_after: float = REBUILD_AFTER) -> None:
        self.src, self.dst = src, dst
        self._swr: AudioResampler | None = None
        self._pts = 0  # input samples through this filter
        self._young = int(src * rebuild_after)  # a filter with fewer is kept over a new stream
        self.builds = 0

    def push(self, pcm: bytes) -> bytes:
        samples = len(pcm) // 2
        if samples == 0:
            return b""
        if self.src == self.dst:
            return pcm[: samples * 2]
        if self._swr is None:
            self._swr = AudioResampler(format="s16", layout="mono", rate=self.dst)
            self.builds += 1
        frame = AudioFrame(format="s16", layout="mono", samples=samples)
        frame.planes[0].update(pcm[: samples * 2])
        frame.sample_rate = self.src
        frame.pts = self._pts
        self._pts += samples
        return _join(self._swr.resample(frame))

    def flush(self) -> bytes:
        """The filter's tail (what it still holds back); the stream then starts anew."""
        if self._swr is None or self._pts < self._young:
            return b""
        swr, self._swr, self._pts = self._swr, None, 0
        return _join(swr.resample(None))

    def reset(self) -> None:
        if self._pts >= self._young:
            self._swr, self._pts = None, 0


def _join(frames: list[AudioFrame]) -> bytes:
    return b"".join(bytes(f.planes[0])[: f.samples * 2] for f in frames)


def resample(pcm: bytes, src: int, dst: int) -> bytes:
    """PCM16 mono from `src` Hz to `dst` Hz, a whole buffer."""
    resampler = Resampler(src, dst, rebuild_after=0)  # (one stream, whole: all of its tail)
    return resampler.push(pcm) + resampler.flush()
