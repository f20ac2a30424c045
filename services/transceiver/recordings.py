"""Call recordings on disk (`--record-dir`): written while the call lasts, kept for a while.

A recording is `{call}.part` while its call lasts (what the media core's recorder made,
appended and flushed as it is made, a second of audio at a time), then `{call}.opus` (Ogg/Opus)
or `{call}.wav` (a G.711 phone call's) beside `{call}.json` (what the file holds: start,
length, the cuts) once it ended; only a finished one is served (`GET
/internal/v1/recordings/{call}`, which signaling's `GET /v1/calls/{id}/recording` streams to
the call's owner).

What could stall the media loop is not done on it: closing a file, writing its JSON, the
rename and the retention sweep run on one worker thread, in order. A file that cannot be
written (a full disk, an error) ends that recording (`recording_failed`, its `.part` removed),
never the call. A recording stops growing at `max_file_bytes` (`recording_truncated`: the
file keeps what it had). Retention: a finished recording goes after `keep` seconds, and the
oldest go while all of them and those being written take more than `max_bytes` (checked as
each one finishes, as those being written grow by a 64th of it, and at start); those being
written stop growing once they alone take it. At start, a `.part` a stopped process left is
kept as it is (its pages up to the last second written are whole; marked `interrupted`; a
WAVE file is given its sizes; an empty one, or one torn in its header, is removed).

One transceiver per directory (a lock file: a second one refuses to start), since a start
finishes the `.part` files it finds. File names come from call ids the edge made
(`safe_name`: anything else is refused), so no id can name a path outside the directory.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from firsthop.shared.wire import wav

log = logging.getLogger("firsthop.transceiver.recordings")

_SAFE = re.compile(r"[A-Za-z0-9_-]{1,128}")
PART, META, LOCK = ".part", ".json", ".lock"
OPUS, WAV = ".opus", ".wav"
DONE = (OPUS, WAV)  # a finished recording's file: Ogg/Opus, or a G.711 call's WAVE
MEDIA_TYPES = {OPUS: "audio/ogg", WAV: "audio/wav"}
MAX_CUTS = 1000


class RecordingError(ValueError):
    pass


def safe_name(call_id: str) -> str:
    if not _SAFE.fullmatch(call_id):
        raise RecordingError("a recording's call id is letters, digits, _ and - only")
    return call_id


@dataclass
class RecordingFile:
    """One call's file while it lasts. Nothing here raises into the call."""

    store: RecordingStore
    call_id: str
    file: BinaryIO | None
    started_at: float  # wall clock
    cuts_ms: list[int] = field(default_factory=list)  # where the agent's audio was cleared
    size: int = 0  # bytes written
    truncated: bool = False

    def write(self, data: bytes) -> None:
        if not data or self.file is None:
            return
        store = self.store
        if self.size + len(data) > store.max_file_bytes or store.live_bytes >= store.max_bytes:
            if not self.truncated:
                self.truncated = True
                self.store.counters["recording_truncated"] += 1
            return
        try:
            self.file.write(data)
            self.file.flush()  # whole pages on disk: a crash keeps what was written
            self.size += len(data)
            store.grew(len(data))
        except (OSError, ValueError) as exc:  # (a full disk; a file closed under us)
            log.error("recording of call %s failed: %s", self.call_id, exc)
            self.store.counters["recording_failed"] += 1
            self.discard()

    def cut(self, at_ms: int) -> None:
        if len(self.cuts_ms) < MAX_CUTS:
            self.cuts_ms.append(at_ms)

    def finish(self, seconds: float, suffix: str, extra: dict[str, Any]) -> None:
        """The call ended: the file is finished as `{call}{suffix}` (one of `DONE`) and
        served (on the store's worker)."""
        file, self.file = self.file, None
        self.store.forget(self.call_id)
        if file is None:
            return  # (it failed, or was discarded)
        meta = {
            "call_id": self.call_id,
            "started_at": round(self.started_at, 3),
            "seconds": round(seconds, 3),
            "bytes": self.size,
            "channels": ["caller", "agent"],
            "format": "audio/ogg; codecs=opus",
            "cuts_ms": self.cuts_ms,
            "truncated": self.truncated,
            **extra,
        }
        self.store.submit(self.store.finished, self.call_id, file, suffix, meta)

    def discard(self) -> None:
        """No recording after all (a call whose setup failed, a write that failed)."""
        file, self.file = self.file, None
        self.store.forget(self.call_id)
        if file is not None:
            self.store.submit(self.store.dropped, self.call_id, file)


class RecordingStore:
    def __init__(
        self,
        directory: str,
        keep: float,
        max_bytes: int,
        counters: Counter[str] | None = None,
        max_file_bytes: int = 1 << 30,
    ) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.max_bytes = max_bytes
        self.max_file_bytes = max_file_bytes
        self.counters: Counter[str] = counters if counters is not None else Counter()
        self._lock = open(self.directory / LOCK, "a")  # noqa: SIM115 (held while we live)
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self._lock.close()
            raise RecordingError(f"{directory} is another transceiver's --record-dir") from exc
        self.live: set[str] = set()
        self._writing: dict[str, RecordingFile] = {}  # (the loop's: their sizes count too)
        self.live_bytes = 0  # what those take: they count toward `max_bytes` (see `grew`)
        self._pruned_at = 0  # `live_bytes` when a prune was last asked for
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="recordings")
        for part in self.directory.glob(f"*{PART}"):  # a stopped process's: kept as they are
            name = part.name.removesuffix(PART).removesuffix(OPUS)  # (".opus.part": before 0.x)
            try:
                suffix = _finish_part(part)
                if suffix is None:
                    continue
                part.rename(self.directory / f"{name}{suffix}")
            except OSError as exc:
                log.error("recording %s left by a stopped process: %s", part.name, exc)
                continue
            meta = {"call_id": name, "interrupted": True, "format": MEDIA_TYPES[suffix]}
            self._write_meta(name, meta)
        self.prune()

    def submit(self, fn: Any, *args: Any) -> None:
        def run() -> None:
            try:
                fn(*args)
            except Exception:
                log.exception("recordings: %s failed", getattr(fn, "__name__", fn))

        self._worker.submit(run)

    def open(self, call_id: str) -> RecordingFile:
        name = safe_name(call_id)
        if name in self.live or any((self.directory / f"{name}{s}").exists() for s in DONE):
            raise RecordingError(f"call {name} is already recorded")
        file = open(self.directory / f"{name}{PART}", "wb")  # noqa: SIM115 (finish closes it)
        self.live.add(name)
        self.counters["recordings"] += 1
        recording = self._writing[name] = RecordingFile(self, name, file, time.time())
        return recording

    def forget(self, call_id: str) -> None:
        """`call_id`'s file is no longer written (the loop's; finished on the worker)."""
        recording = self._writing.pop(call_id, None)
        if recording is not None:
            self.live_bytes -= recording.size
            self._pruned_at = min(self._pruned_at, self.live_bytes)

    def grew(self, n: int) -> None:
        """A recording being written grew by `n` bytes: the oldest finished ones go to make
        room (a prune each time they grew by a 64th of the budget); past the budget on their
        own, recordings stop growing (`recording_truncated`)."""
        self.live_bytes += n
        if self.live_bytes - self._pruned_at >= self.max_bytes // 64:
            self._pruned_at = self.live_bytes
            self.submit(self.prune)

    # -- on the worker thread -------------------------------------------------------------------

    def finished(self, call_id: str, file: BinaryIO, suffix: str, meta: dict[str, Any]) -> None:
        try:
            file.close()
            part = self.directory / f"{call_id}{PART}"
            if suffix == WAV and _finish_part(part) != WAV:
                raise wav.WavError("the WAVE file lost its header")
            self._write_meta(call_id, meta)
            os.replace(part, self.directory / f"{call_id}{suffix}")
        except (OSError, wav.WavError) as exc:
            log.error("recording of call %s could not be finished: %s", call_id, exc)
            self.counters["recording_failed"] += 1
            self._remove(call_id, PART, META)
        finally:
            self.live.discard(call_id)
        self.prune()

    def dropped(self, call_id: str, file: BinaryIO) -> None:
        try:
            file.close()
        except OSError:
            pass
        self._remove(call_id, PART)
        self.live.discard(call_id)

    def _remove(self, call_id: str, *suffixes: str) -> None:
        for suffix in suffixes:
            try:
                (self.directory / f"{call_id}{suffix}").unlink()
            except OSError:
                pass

    def _write_meta(self, call_id: str, meta: dict[str, Any]) -> None:
        (self.directory / f"{call_id}{META}").write_text(json.dumps(meta))

    def prune(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        done = []
        for path in self.directory.iterdir():
            if path.suffix not in DONE:
                continue
            try:
                stat = path.stat()
            except OSError:
                continue
            done.append((stat.st_mtime, stat.st_size, path.stem))
        done.sort()
        total = sum(size for _, size, _ in done) + self.live_bytes
        for mtime, size, name in done:
            if now - mtime <= self.keep and total <= self.max_bytes:
                continue
            total -= size
            self._remove(name, *DONE, META)
            self.counters["recordings_pruned"] += 1
        kept = {name for _, _, name in done}
        for meta in self.directory.glob(f"*{META}"):  # a JSON whose recording is gone
            name = meta.name.removesuffix(META)
            if name not in kept and name not in self.live:
                self._remove(name, META)

    # -- reads (the API) ------------------------------------------------------------------------

    def find(self, call_id: str) -> Path | None | str:
        """The finished file, None when there is none, or "live" while its call lasts."""
        try:
            name = safe_name(call_id)
        except RecordingError:
            return None
        if name in self.live:
            return "live"
        for suffix in DONE:
            path = self.directory / f"{name}{suffix}"
            if path.is_file():
                return path
        return None

    def meta(self, call_id: str) -> dict[str, Any]:
        try:
            data = json.loads((self.directory / f"{safe_name(call_id)}{META}").read_text())
        except (OSError, ValueError, RecordingError):
            return {}
        return data if isinstance(data, dict) else {}

    def settle(self) -> None:
        """Until what was handed to the worker is done (tests, and a clean exit)."""
        self._worker.submit(lambda: None).result()

    def close(self, wait: bool = True) -> None:
        self._worker.shutdown(wait=wait)
        self._lock.close()


def _finish_part(path: Path) -> str | None:
    """The suffix a recording's `.part` is finished with, told by its first bytes; a WAVE
    file is given the sizes of the whole sample frames it holds (written while the call
    lasted, its header did not know them), a torn last one cut off. None: no recording in it
    (an empty one, or one torn inside its header: removed; one not of ours: left alone)."""
    with open(path, "r+b") as f:
        head = f.read(wav.HEADER)
        if head[:4] == b"OggS":
            return OPUS
        if head[:4] == b"RIFF":
            try:
                sized = wav.sized_header(head, os.fstat(f.fileno()).st_size - wav.HEADER)
            except wav.WavError:
                sized = None
            if sized is not None:
                f.seek(0)
                f.write(sized)
                f.truncate(wav.HEADER + wav.data_size(sized))
                return WAV
        ours = len(head) < wav.HEADER and wav.g711_header(wav.MULAW, 2, 8000).startswith(head[:4])
    if not head or ours:
        path.unlink()
    else:
        log.warning("%s in the recordings' directory is not a recording: left as it is", path)
    return None
