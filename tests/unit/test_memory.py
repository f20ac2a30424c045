"""`shared/memory.py`: freed heap handed back to the OS (glibc's malloc_trim, for real)."""

from __future__ import annotations

import json
import subprocess
import sys

from firsthop.shared import memory


def test_release_hands_back_the_holes_a_freed_working_set_leaves() -> None:
    # 80 MB in 4 kB blocks (glibc's, not pymalloc's), one in 16 kept: the heap cannot shrink
    # from its top, every freed page sits between live blocks
    blocks = [bytearray(4000) for _ in range(20_000)]
    kept = blocks[::16]
    before = memory.rss_bytes()
    del blocks
    freed_in_place = before - memory.rss_bytes()
    released = memory.release()
    assert released > 40 * 1024 * 1024, (freed_in_place, released)
    assert len(kept) == 1250


def test_rss_is_this_process() -> None:
    with open("/proc/self/status") as f:
        rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    assert abs(memory.rss_bytes() - rss_kb * 1024) < 8 * 1024 * 1024


def test_what_a_process_loaded_to_start_is_frozen_and_each_collection_is_timed() -> None:
    """In a process of its own (a frozen object is never collected: not this one's)."""
    code = """
import gc, json
from firsthop.shared import memory
loaded = len(gc.get_objects())
frozen = memory.freeze_startup()
left = len(gc.get_objects())  # (the collector's generations: the frozen are in none)
class Node: ...
for _ in range(1000):
    a, b = Node(), Node()
    a.other, b.other = b, a
del a, b
gc.collect()
alive = sum(isinstance(o, Node) for o in gc.get_objects())
print(json.dumps([loaded, frozen, left, alive, memory.GC_PAUSES.count]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, frozen, left, alive, timed = json.loads(out.stdout)
    assert frozen >= loaded * 0.9 and left < 100, (loaded, frozen, left)
    assert alive == 0  # cycles made after are collected as before
    assert timed >= 1
    families = memory.gc_metrics()
    assert [getattr(f, "name", None) for f in families] == [
        "firsthop_gc_frozen_objects",
        "firsthop_gc_full_pause_seconds",
    ]
