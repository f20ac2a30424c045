"""`shared/memory.py`: freed heap handed back to the OS (glibc's malloc_trim, for real)."""

from __future__ import annotations

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
