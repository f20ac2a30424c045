"""Events held until the caller's data channel opens (held.py): order and bounds."""

from __future__ import annotations

from collections.abc import Callable

from firsthop.services.transceiver.held import HeldEvents


def test_held_in_order_and_flushed_while_the_channel_takes_them() -> None:
    held = HeldEvents(max_events=3, max_bytes=100)
    assert held.hold("a") and held.hold("b") and held.hold("c")
    assert not held.hold("d")  # the fourth: refused (the caller counts it)
    sent: list[str] = []

    def channel(room: int) -> Callable[[str], bool]:
        def send(text: str) -> bool:
            if len(sent) >= room:
                return False  # the channel is not open (any more)
            sent.append(text)
            return True

        return send

    held.flush(channel(2))
    assert sent == ["a", "b"] and [text for text, _ in held.events] == ["c"] and held
    held.flush(channel(10))
    assert sent == ["a", "b", "c"] and not held and held.size == 0


def test_bytes_are_bounded_too() -> None:
    held = HeldEvents(max_events=64, max_bytes=10)
    assert held.hold("x" * 6)
    assert not held.hold("y" * 5)
    assert held.hold("z" * 4) and held.size == 10


def test_bytes_are_counted_in_utf_8_not_characters() -> None:
    """A helper's read (stop 42): sizes had been counted in characters, so 64 events of
    four-byte characters passed a 256 KiB bound holding a megabyte."""
    held = HeldEvents(max_events=64, max_bytes=16)
    assert held.hold("\U0001f600" * 3) and held.size == 12  # 3 characters, 12 bytes
    assert not held.hold("é" * 3)  # 6 more bytes: over
    assert held.hold("é" * 2) and held.size == 16
    held.flush(lambda _: True)
    assert held.size == 0
