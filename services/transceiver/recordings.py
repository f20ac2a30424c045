"""Call recordings on disk (`--record-dir`): written while the call lasts, kept for a while.

A recording is `{call}.opus.part` while its call lasts (the media core's Ogg pages appended
as they are made, a second of audio at a time), then `{call}.opus` beside `{call}.json` (what
the file holds: start, length, the cuts) once it ended; only a finished one is served
(`GET /internal/v1/recordings/{call}`, which signaling's `GET /v1/calls/{id}/recording`
fetches for the call's owner). Retention: a finished recording goes after `keep` seconds, and
the oldest go while all of them take more than `max_bytes`; checked as each one finishes and at
start (when a `.part` a stopped process left is finished as it is: its pages are whole).

File names come from call ids the edge made (`safe_name`: anything else is refused), so no id
can name a path outside the directory.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger("firsthop.transceiver.recordings")

_SAFE = re.compile(r"[A-Za-z0-9_-]{1,128}")
PART, DONE, META = ".opus.part", ".opus", ".json"


class RecordingError(ValueError):
    pass


def safe_name(call_id: str) -> str:
    if not _SAFE.fullmatch(call_id):
        raise RecordingError("a recording's call id is letters, digits, _ and - only")
    return call_id


@dataclass
class RecordingFile:
    store: RecordingStore
    call_id: str
    file: BinaryIO
    started_at: float  # wall clock
    cuts_ms: list[int] = field(default_factory=list)  # where the agent's audio was cleared
    size: int = 0  # bytes written

    MAX_CUTS = 1000

    def write(self, data: bytes) -> None:
        if data:
            self.file.write(data)
            self.size += len(data)

    def cut(self, at_ms: int) -> None:
        if len(self.cuts_ms) < self.MAX_CUTS:
            self.cuts_ms.append(at_ms)

    def finish(self, seconds: float, extra: dict[str, Any]) -> None:
        self.file.close()
        meta = {
            "call_id": self.call_id,
            "started_at": round(self.started_at, 3),
            "seconds": round(seconds, 3),
            "bytes": self.size,
            "channels": ["caller", "agent"],
            "format": "audio/ogg; codecs=opus",
            "cuts_ms": self.cuts_ms,
            **extra,
        }
        self.store.finished(self.call_id, meta)


class RecordingStore:
    def __init__(self, directory: str, keep: float, max_bytes: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.keep = keep
        self.max_bytes = max_bytes
        self.live: set[str] = set()
        self.counters: dict[str, int] = {"recordings": 0, "recordings_pruned": 0}
        for part in self.directory.glob(f"*{PART}"):  # a stopped process's: kept as they are
            name = part.name.removesuffix(PART)
            part.rename(self.directory / f"{name}{DONE}")
            self._write_meta(name, {"call_id": name, "interrupted": True})
        self.prune()

    def open(self, call_id: str) -> RecordingFile:
        name = safe_name(call_id)
        if name in self.live or (self.directory / f"{name}{DONE}").exists():
            raise RecordingError(f"call {name} is already recorded")
        self.live.add(name)
        file = open(self.directory / f"{name}{PART}", "wb")  # noqa: SIM115 (closed by finish)
        self.counters["recordings"] += 1
        return RecordingFile(self, name, file, time.time())

    def finished(self, call_id: str, meta: dict[str, Any]) -> None:
        part = self.directory / f"{call_id}{PART}"
        self._write_meta(call_id, meta)
        os.replace(part, self.directory / f"{call_id}{DONE}")
        self.live.discard(call_id)
        self.prune()

    def _write_meta(self, call_id: str, meta: dict[str, Any]) -> None:
        (self.directory / f"{call_id}{META}").write_text(json.dumps(meta))

    def find(self, call_id: str) -> Path | None | str:
        """The finished file, None when there is none, or "live" while its call lasts."""
        try:
            name = safe_name(call_id)
        except RecordingError:
            return None
        if name in self.live:
            return "live"
        path = self.directory / f"{name}{DONE}"
        return path if path.is_file() else None

    def meta(self, call_id: str) -> dict[str, Any]:
        try:
            data = json.loads((self.directory / f"{safe_name(call_id)}{META}").read_text())
        except (OSError, ValueError, RecordingError):
            return {}
        return data if isinstance(data, dict) else {}

    def prune(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        done = []
        for path in self.directory.glob(f"*{DONE}"):
            try:
                stat = path.stat()
            except OSError:
                continue
            done.append((stat.st_mtime, stat.st_size, path))
        done.sort()
        total = sum(size for _, size, _ in done)
        for mtime, size, path in done:
            if now - mtime <= self.keep and total <= self.max_bytes:
                continue
            total -= size
            for doomed in (path, path.with_name(path.name.removesuffix(DONE) + META)):
                try:
                    doomed.unlink()
                except FileNotFoundError:
                    pass
            self.counters["recordings_pruned"] += 1
