"""What the caller has really heard of a Realtime backend's answers: pure bookkeeping.

The backend sends an answer's audio faster than real time; the transceiver queues it and plays
it at real time. OpenAI's WebRTC API tells the client what was *played*
(`output_audio_buffer.started` / `stopped` / `cleared`), and a barge-in must truncate the
answer's item to what the caller heard (`conversation.item.truncate`'s `audio_end_ms`). So
every 20 ms frame queued is tagged (response_id, item_id), and the output queue reports each
tagged frame's fate back here: played, or dropped at its bound.

Rules:
* `started {response_id}` when the first frame of a response is played;
* `stopped {response_id}` when its last queued frame has left the queue *and* the backend has
  said its audio is done (`response.output_audio.done` or `response.done`): the queue drained;
* `clear()` (barge-in, the client's `output_audio_buffer.clear`, a lost backend): what was
  playing or queued is dropped; it says which response that was (for `cleared`) and how far
  into its item the caller got (for the truncate). A cleared response's late audio is
  refused (`wanted`), so a barge-in stays silent while the backend catches up.

Positions count frames that left the queue (played, or dropped at the bound: the caller got
past them), so `audio_end_ms` is a position in the item's audio, never beyond what was sent.
All state is bounded (the last `MAX_TRACKED` responses and items).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from firsthop.services.transceiver.agents.events import Tag

FRAME_MS = 20
MAX_TRACKED = 32


@dataclass(frozen=True, slots=True)
class Started:
    response_id: str


@dataclass(frozen=True, slots=True)
class Stopped:
    response_id: str


@dataclass(frozen=True, slots=True)
class Cleared:
    """What a clear cut short: `response_id` (None: nothing was playing or queued), and the
    item being played with the milliseconds of it the caller got past."""

    response_id: str | None
    item_id: str | None
    audio_end_ms: int


PlayoutEvent = Started | Stopped


class Playout:
    def __init__(self) -> None:
        self.pending: OrderedDict[str, int] = OrderedDict()  # response -> frames in the queue
        self.done: deque[str] = deque(maxlen=MAX_TRACKED)  # responses whose audio ended
        self.refused: deque[str] = deque(maxlen=MAX_TRACKED)  # cleared: late audio dropped
        self.item_ms: OrderedDict[str, int] = OrderedDict()  # item -> position (ms)
        self.current: dict[str, str] = {}  # response -> its item being played (or queued)
        self.playing: str | None = None  # started and not yet stopped

    def wanted(self, response_id: str) -> bool:
        """False for audio of a response that was cleared (a barge-in's late deltas)."""
        return response_id not in self.refused

    def queued(self, tag: Tag, frames: int = 1) -> None:
        response_id, item_id = tag
        self.pending[response_id] = self.pending.get(response_id, 0) + frames
        self.current.setdefault(response_id, item_id)
        self._bound()

    def played(self, tag: Tag) -> list[PlayoutEvent]:
        response_id, item_id = tag
        out: list[PlayoutEvent] = []
        if self.playing != response_id:
            if self.playing is not None:  # the next answer began before the last one ended
                out.append(Stopped(self.playing))
            self.playing = response_id
            out.append(Started(response_id))
        return out + self._left(response_id, item_id)

    def dropped(self, tag: Tag) -> list[PlayoutEvent]:
        return self._left(*tag)

    def audio_done(self, response_id: str) -> list[PlayoutEvent]:
        if response_id not in self.done:
            self.done.append(response_id)
        return self._maybe_stopped(response_id)

    def clear(self) -> Cleared:
        response_id = self.playing
        if response_id is None:
            response_id = next((r for r, n in self.pending.items() if n > 0), None)
        item_id = self.current.get(response_id) if response_id is not None else None
        for r in self.pending:
            if r not in self.refused:
                self.refused.append(r)
        if response_id is not None and response_id not in self.refused:
            self.refused.append(response_id)
        self.pending.clear()
        self.current.clear()
        self.playing = None
        ms = self.item_ms.get(item_id, 0) if item_id is not None else 0
        return Cleared(response_id, item_id, ms)

    def position_ms(self, item_id: str) -> int:
        return self.item_ms.get(item_id, 0)

    def _left(self, response_id: str, item_id: str) -> list[PlayoutEvent]:
        """One frame of `response_id`'s `item_id` left the queue."""
        n = self.pending.get(response_id, 0)
        if n <= 0:
            return []  # a frame from before a clear: its response is forgotten
        self.pending[response_id] = n - 1
        self.current[response_id] = item_id
        self.item_ms[item_id] = self.item_ms.get(item_id, 0) + FRAME_MS
        self.item_ms.move_to_end(item_id)
        self._bound()
        return self._maybe_stopped(response_id)

    def _maybe_stopped(self, response_id: str) -> list[PlayoutEvent]:
        if self.pending.get(response_id, 0) > 0 or response_id not in self.done:
            return []
        self.pending.pop(response_id, None)
        self.current.pop(response_id, None)
        if self.playing == response_id:
            self.playing = None
            return [Stopped(response_id)]
        return []

    def _bound(self) -> None:
        while len(self.item_ms) > MAX_TRACKED:
            self.item_ms.popitem(last=False)
        while len(self.pending) > MAX_TRACKED:
            gone, _ = self.pending.popitem(last=False)
            self.current.pop(gone, None)
