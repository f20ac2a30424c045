"""`rtc/sctp_hooks.py`'s rules on an association, in-process (the integration tests send the
attacks over a real caller's DTLS): a closed association takes nothing more, an INIT once up
is refused, and a stream full of messages past one lost packet still takes that packet."""

from __future__ import annotations

import asyncio
import struct
from collections import Counter
from types import SimpleNamespace
from typing import Any

from firsthop.services.transceiver.rtc import sctp_hooks
from firsthop.services.transceiver.rtc.sctp_hooks import (
    MAX_FRAGMENTS,
    MAX_MISORDERED,
    bound_sctp,
    room_for,
)
from tests.unit.test_sctp_check import packet

HEARTBEAT = packet((4, 0, b"\x00\x01\x00\x08abcd"))
INIT = packet((1, 0, struct.pack("!LLHHL", 1, 1 << 20, 65535, 65535, 7)))


def association(state: str) -> tuple[Any, list[bytes], Counter[str]]:
    """A stand-in association (aiortc's state, its two entry points) under `bound_sctp`."""
    taken: list[bytes] = []
    counts: Counter[str] = Counter()

    async def handle(data: bytes) -> None:
        taken.append(data)

    async def receive(chunk: Any) -> None:
        pass

    sctp = SimpleNamespace(state=state, _handle_data=handle, _receive_chunk=receive)
    bound_sctp(sctp, lambda name: counts.update([name]))  # type: ignore[arg-type]
    return sctp, taken, counts


def feed(sctp: Any, *packets: bytes) -> None:
    async def main() -> None:
        for data in packets:
            await sctp._handle_data(data)

    asyncio.run(main())


def test_an_association_that_closed_before_it_was_up_takes_nothing_more() -> None:
    """The caller's ABORT while we were still connecting: aiortc would take its INIT and
    COOKIE ECHO and set the association up again, its channels never told to the session."""
    sctp, taken, counts = association("connecting")
    feed(sctp, HEARTBEAT)
    sctp.state = "closed"
    feed(sctp, INIT, HEARTBEAT)
    assert taken == [HEARTBEAT]
    assert counts["sctp_packet_refused"] == 2


def test_an_init_once_up_is_refused_and_the_rest_goes_on() -> None:
    sctp, taken, counts = association("connected")
    feed(sctp, INIT, HEARTBEAT)
    assert taken == [HEARTBEAT]
    assert counts["sctp_packet_refused"] == 1


def test_a_stream_full_past_a_lost_packet_still_takes_that_packets_message() -> None:
    """256 ordered messages past one lost TSN fill what a gap may hold; the lost TSN's
    retransmission (a 64 KiB message is ~55 chunks) is the one thing that frees them. At
    MAX_FRAGMENTS 256 it was refused for good, and the browser aborted the association."""
    held = [SimpleNamespace(tsn=1002 + i) for i in range(MAX_MISORDERED)]
    stream = SimpleNamespace(reassembly=list(held))
    sctp = SimpleNamespace(
        _last_received_tsn=1000,
        _sack_misordered={c.tsn for c in held},
        _inbound_streams={1: stream},
    )
    for i in range(55):  # the lost message, chunk by chunk, as it comes again
        chunk = SimpleNamespace(tsn=1001, stream_id=1)
        assert room_for(sctp, chunk), i
        stream.reassembly.append(chunk)
    assert MAX_FRAGMENTS >= MAX_MISORDERED + 55
    assert sctp_hooks.MAX_STREAMS == 8
