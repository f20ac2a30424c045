"""RFC 4571 framing: RTP, RTCP, STUN and DTLS packets over a TCP connection (ICE-TCP).

RFC 4571 §2: every packet on the stream is preceded by a 16-bit unsigned big-endian LENGTH
(so a frame carries 0-65535 bytes); RFC 6544 §3 uses this framing for every packet of an
ICE-TCP connection. `frame` writes one; `Deframer` is the sans-IO reader: feed it whatever
`recv` returned, get back the complete frames, with a partial frame kept for the next feed.

Bounds: the deframer holds at most one partial frame of at most `max_frame` bytes (plus its
two length bytes), and, when a `feed` was given a `limit`, the whole frames of that feed it
did not read yet (`more`): the caller reads them with `feed(b"", limit)` before it feeds
more, so that is at most one read's bytes. A frame longer than `max_frame` (no WebRTC
packet on the wire exceeds ~1500 bytes, though the format allows 65535) raises
`OversizeFrame`, and the deframer refuses further input: the peer is not speaking this
protocol, so the connection should close. Parsing never raises anything but this module's errors.

Errors::

    FramingError
     └── OversizeFrame    a frame's LENGTH exceeds the deframer's bound
"""

from __future__ import annotations

LENGTH_PREFIX = 2  # RFC 4571 §2: 16-bit LENGTH field
MAX_FRAME = 0xFFFF  # the largest frame the LENGTH field can describe


class FramingError(Exception):
    reason = "framing_invalid"


class OversizeFrame(FramingError):
    reason = "oversize_frame"


def frame(payload: bytes | bytearray | memoryview) -> bytes:
    """`payload` with its RFC 4571 length prefix."""
    n = len(payload)
    if n > MAX_FRAME:
        raise OversizeFrame(f"{n} bytes do not fit a 16-bit RFC 4571 length")
    return n.to_bytes(LENGTH_PREFIX, "big") + bytes(payload)


def prefix(n: int) -> bytes:
    """The length prefix alone, for a caller that sends it and the payload by scatter-gather."""
    if not 0 <= n <= MAX_FRAME:
        raise OversizeFrame(f"{n} bytes do not fit a 16-bit RFC 4571 length")
    return n.to_bytes(LENGTH_PREFIX, "big")


class Deframer:
    """Splits a byte stream into RFC 4571 frames."""

    __slots__ = ("max_frame", "_buf", "_failed", "_more")

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        if not 0 < max_frame <= MAX_FRAME:
            raise ValueError(f"max_frame {max_frame} is outside 1..{MAX_FRAME}")
        self.max_frame = max_frame
        self._buf = bytearray()
        self._failed = False
        self._more = False

    @property
    def buffered(self) -> int:
        """Bytes held: of a frame not yet complete, and of frames a limited feed left."""
        return len(self._buf)

    @property
    def more(self) -> bool:
        """Whether a `feed` stopped at its `limit` with bytes left that may be whole frames."""
        return self._more

    def feed(self, data: bytes | bytearray | memoryview, limit: int | None = None) -> list[bytes]:
        """The frames `data` completes, in order (an empty frame is returned as b""); with
        `limit`, at most that many (empty ones count), the rest kept for the next feed."""
        if self._failed:
            raise OversizeFrame("the stream already carried an oversize frame")
        if limit is not None and limit < 1:
            raise ValueError(f"a frame limit must be 1 or more, not {limit}")
        buf = self._buf
        if data:
            buf += data
        out: list[bytes] = []
        pos = 0
        end = len(buf)
        left = -1 if limit is None else limit
        self._more = False
        while end - pos >= LENGTH_PREFIX:
            if not left:
                self._more = True
                break
            left -= 1
            n = (buf[pos] << 8) | buf[pos + 1]
            if n > self.max_frame:
                self._failed = True
                del buf[:]
                raise OversizeFrame(f"a {n}-byte frame exceeds the bound of {self.max_frame}")
            start = pos + LENGTH_PREFIX
            if end - start < n:
                break
            out.append(bytes(buf[start : start + n]))
            pos = start + n
        if pos:
            del buf[:pos]
        return out
