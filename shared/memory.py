"""Giving a process's freed memory back to the OS once it goes idle.

A call's objects (aiortc's peer connection, its DTLS and SRTP contexts, codec states, queues)
are freed when it ends, but into glibc's heap, where the holes they leave between live
blocks stay part of the process's RSS: under churn a transceiver's RSS climbs with the most
calls it ever held and never comes down. `release()` collects the cyclic garbage aiortc
leaves to the collector (event emitters and their callbacks form cycles), then asks glibc to
return every free page (`malloc_trim(0)`, which also releases pages in the middle of the
heap). It costs milliseconds on a large heap, so it is for idle moments only: the transceiver
calls it when its last call has ended (and stopped lingering). Measured: a transceiver at
103 MB idle, 121 MB with 30 calls, came back to 115.6, 115.8 and 115.9 MB after each of three
rounds of 30 calls, handing back ~6 MB each time; the rest of the first round's growth is
one-off (libraries' lazily built tables, the interpreter's own arenas), not a creep.

`rss_bytes()` reads the resident set size from /proc/self/statm.

`freeze_startup()` keeps what a process loaded to start out of every later cyclic collection
(`gc.freeze`): a full collection walks every object the collector tracks and stops the
process while it does, and ~97,000 of a transceiver's ~100,000 at 40-60 calls were its
modules, classes and functions. Those full collections stopped every call's media for
48-185 ms each (measured at 40 and 60 calls, `bench sessions --knee`), late frames for every
call at once; frozen, none over 3 ms while calls ran. A service calls it once, when it
serves (`lifecycle.run_until_signal` does). `GC_PAUSES` times each full collection since.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import time
from typing import Any

from firsthop.shared.metrics import Histogram, MetricFamily

_PAGE = os.sysconf("SC_PAGE_SIZE")


def _malloc_trim() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_TRIM = _malloc_trim()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def release() -> int:
    """Collect garbage and hand free heap pages back; the bytes of RSS that went."""
    before = rss_bytes()
    gc.collect()
    if _TRIM is not None:
        _TRIM(0)
    return max(0, before - rss_bytes())


GC_PAUSES = Histogram(
    "firsthop_gc_full_pause_seconds",
    "Each full cyclic garbage collection's pause of the process (every call's media waits)",
    [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25],
)
_started: list[float] = []


def _timed(phase: str, info: dict[str, int]) -> None:
    if info["generation"] != 2:  # (the young ones: thousands, ~1 ms at most)
        return
    if phase == "start":
        _started[:] = [time.perf_counter()]
    elif _started:
        GC_PAUSES.observe(time.perf_counter() - _started.pop())


def freeze_startup() -> int:
    """Collect, then move every object alive now out of the collector's reach for good (they
    are the process's code and configuration: freed by reference counting if ever, never
    cyclic garbage); from then on time each full collection (`GC_PAUSES`). The count frozen."""
    gc.collect()
    gc.freeze()
    if _timed not in gc.callbacks:
        gc.callbacks.append(_timed)
    return gc.get_freeze_count()


def gc_metrics() -> list[MetricFamily | Histogram]:
    frozen = MetricFamily(
        "firsthop_gc_frozen_objects", "gauge", "Objects kept out of cyclic collections"
    )
    return [frozen.add(gc.get_freeze_count()), GC_PAUSES]
