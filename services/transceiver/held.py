"""Events held for a caller whose data channel is not open yet: bounded, in order, pure.

A Realtime backend says `session.created` as soon as the transceiver connects to it, which is
usually before the caller's data channel has opened; the caller must still see it first. So
events wait here (at most `max_events` and `max_bytes`; beyond, each one is refused and the
caller counts it) and `flush` sends them, oldest first, through whatever sends them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

HOLD_EVENTS = 64
HOLD_BYTES = 256 * 1024


def utf8_len(text: str) -> int:
    """Bytes of `text` in UTF-8: what it costs on the wire, and at least what CPython holds
    for its characters (1, 2 or 4 bytes each). O(1) for ASCII (`isascii` reads a flag)."""
    return len(text) if text.isascii() else len(text.encode())


class HeldEvents:
    def __init__(self, max_events: int = HOLD_EVENTS, max_bytes: int = HOLD_BYTES) -> None:
        self.max_events, self.max_bytes = max_events, max_bytes
        self.events: deque[tuple[str, int]] = deque()  # (text, its UTF-8 bytes)
        self.size = 0

    def __bool__(self) -> bool:
        return bool(self.events)

    def hold(self, text: str, size: int | None = None) -> bool:
        """Keep `text` (of `size` bytes in UTF-8, if the caller knows) for later; False if
        that would break a bound (it is not kept)."""
        size = utf8_len(text) if size is None else size
        if len(self.events) >= self.max_events or self.size + size > self.max_bytes:
            return False
        self.events.append((text, size))
        self.size += size
        return True

    def flush(self, send: Callable[[str], bool]) -> None:
        """Send what is held, oldest first, until `send` says it cannot (False)."""
        while self.events and send(self.events[0][0]):
            self.size -= self.events.popleft()[1]
