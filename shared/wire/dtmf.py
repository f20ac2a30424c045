"""RFC 4733 telephone-events (DTMF in RTP): parse and build one event payload, pure.

```
 0                   1                   2                   3
 |     event     |E|R|  volume   |          duration             |
```

Events 0-9 are the digits, 10 `*`, 11 `#`, 12-15 `A`-`D` (RFC 4733 §3.2); other events
(flash, tones) parse with `digit` None. `duration` is in the stream's RTP clock units. An
event's packets all carry the timestamp of its start; its end (E bit) is sent three times.

Errors::

    DtmfError    not a telephone-event payload (too short)
"""

from __future__ import annotations

from dataclasses import dataclass

DIGITS = "0123456789*#ABCD"


class DtmfError(Exception):
    reason = "dtmf_malformed"


@dataclass(frozen=True, slots=True)
class DtmfEvent:
    event: int
    end: bool
    volume: int  # -dBm0, 0-63
    duration: int  # RTP clock units

    @property
    def digit(self) -> str | None:
        return DIGITS[self.event] if self.event < len(DIGITS) else None


def parse_event(payload: bytes) -> DtmfEvent:
    """The first event of a payload (RFC 4733 §2.3: more may follow, redundant ones)."""
    if len(payload) < 4:
        raise DtmfError("telephone-event payload under 4 bytes")
    return DtmfEvent(
        payload[0], bool(payload[1] & 0x80), payload[1] & 0x3F, int.from_bytes(payload[2:4], "big")
    )


def build_event(digit: str, *, end: bool = False, volume: int = 10, duration: int = 160) -> bytes:
    event = DIGITS.index(digit)
    flags = (0x80 if end else 0) | (volume & 0x3F)
    return bytes((event, flags)) + (duration & 0xFFFF).to_bytes(2, "big")
