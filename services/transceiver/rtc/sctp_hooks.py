"""Bounds on what a caller's SCTP (its data channels) makes aiortc keep. Part of `hooks.py`'s
reach, under its version check (`hooks.check_pinned_versions`, aiortc 1.16): `hook_points`
here is merged into `hooks.hook_points`, asserted by a test.

aiortc's SCTP receive side keeps, per association and with no bound, every TSN received
beyond a gap (`_sack_misordered`, sorted and filtered again at every chunk: 2.6 ms a chunk
with 20,000 gaps, on the one thread every call on the transceiver shares), the fragments of
messages never completed (each stream's `reassembly`), and a stream, and a data channel, for
every stream id a DATA chunk names (65,535 of them). A caller with its own SCTP stack over the
DTLS it negotiated could fill any of them.

So every DATA chunk of a session passes `bound_sctp`'s check first (its `_receive_chunk`,
where aiortc takes each chunk of a packet), and one the association has no room for is
dropped before aiortc sees it (`sctp_chunk_dropped`): not marked received,
not acknowledged, as RFC 9260 §6.2 lets a receiver out of buffer do. An ordinary sender
meets them only after a loss with more than 256 chunks in flight behind it, and then sends the
dropped ones again as it would after any loss; one that never fills its gaps stalls only its
own channel. Rooms: TSNs at most `MAX_TSN_AHEAD` ahead, `MAX_MISORDERED` past a gap,
`MAX_FRAGMENTS` held per stream (a 64 KiB message, aiortc's a=max-message-size, is about 55
chunks), `MAX_STREAMS` streams (the Realtime API opens one channel). A FORWARD TSN chunk
(RFC 3758) makes a stream for every stream id it names, and aiortc then walked every stream
at each one: 226 packets made 65,536 streams, after which each such chunk, 8 bytes, cost
33 ms of the thread every call shares (a second call's echo took 3.2 s instead of 0.05 s
behind one datagram of them). It must fit the same `MAX_STREAMS` (else dropped,
`sctp_chunk_dropped`) and takes from the same chunk rate.

A message aiortc cannot read (text that is not UTF-8, a DCEP OPEN for a channel that is
open, an ACK for one never opened) raised out of its delivery into the DTLS transport's
receive task, and that ended the caller's call. The chunk that completed it (a DATA chunk,
or a FORWARD TSN that let a held message through) has been taken by then (marked received,
acknowledged: the sender does not send it again), so the message is dropped and counted
(`sctp_message_malformed`) and the association goes on.

Before any of that, a packet aiortc would misread, or one no real stack sends, is dropped
before aiortc parses it (`shared/wire/sctp_check.py`: `sctp_packet_malformed`,
`sctp_packet_refused`): a parameter of length 0 had aiortc's parser loop for good on the
thread every call shares, a SACK's gap blocks cost it seconds, short chunks and a bundled
INIT raised and ended the caller's call, and a packet of hundreds of HEARTBEATs had as
many answers sent. Duplicate DATA chunks take from the chunk rate too (125 to a packet
cost aiortc 1.65 ms).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from aiortc.rtcsctptransport import DataChunk, ForwardTsnChunk, RTCSctpTransport, tsn_plus_one
from aiortc.utils import uint16_gt, uint32_gt

from firsthop.shared.ratelimit import TokenBucket
from firsthop.shared.wire import sctp_check

log = logging.getLogger("firsthop.transceiver.sctp")

# How far past the cumulative TSN a chunk may be: a SACK reports gaps as 16-bit offsets
# (RFC 9260 §3.3.4), and aiortc's, asked for one past 65,535, raised and ended the caller's
# association (its whole DTLS receive task).
MAX_TSN_AHEAD = 8192
MAX_MISORDERED = 256  # TSNs received beyond the first gap
# Chunks held for reassembly, per stream: room for every chunk past a gap (MAX_MISORDERED)
# and then for a whole message of the TSNs the gap lost (a 64 KiB message is ~55 chunks).
# At 256 a stream full of ordered messages past one lost packet refused that packet's
# retransmission, the one chunk that could free it, for good (a helper's read, stop 50).
MAX_FRAGMENTS = MAX_MISORDERED + 64
MAX_STREAMS = 8  # inbound streams (data channels) per association
# New DATA chunks an association takes a second (burst): past them, dropped like a chunk
# with no room (`sctp_chunk_rate_limited`), so a sender's congestion control slows it. A
# caller's tiny messages, 59 to a packet, cost aiortc 0.5-0.65 ms a packet before any
# protocol looked at them: half a core at the session's datagram budget. (600 KB/s.)
CHUNK_RATE, CHUNK_BURST = 500.0, 1000.0


def room_for(sctp: Any, chunk: Any) -> bool:
    """Whether `sctp` has room for the new DATA `chunk` (`is_new`: a duplicate needs none,
    aiortc just notes it)."""
    tsn, last = chunk.tsn, sctp._last_received_tsn  # (not None: `bound_sctp` saw to it)
    if uint32_gt(tsn, (last + MAX_TSN_AHEAD) & 0xFFFFFFFF):
        return False
    if tsn != tsn_plus_one(last) and len(sctp._sack_misordered) >= MAX_MISORDERED:
        return False
    stream = sctp._inbound_streams.get(chunk.stream_id)
    if stream is None:
        return len(sctp._inbound_streams) < MAX_STREAMS
    return len(stream.reassembly) < MAX_FRAGMENTS


def is_new(sctp: Any, chunk: Any) -> bool:
    """Whether `chunk` is a DATA chunk `sctp` has not had (a duplicate costs aiortc a note)."""
    last = sctp._last_received_tsn  # (not None: `bound_sctp` saw to it)
    return uint32_gt(chunk.tsn, last) and chunk.tsn not in sctp._sack_misordered


def last_of_each(streams: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """A FORWARD TSN's (stream, sequence) pairs with each stream once, at its latest
    sequence (serial arithmetic, RFC 1982): aiortc moves a stream to its latest and
    delivers what that frees, once a pair. usrsctp names a stream once per abandoned chunk;
    one stream named 360 times had cost aiortc 8.8 ms a chunk."""
    latest: dict[int, int] = {}
    for stream, seq in streams:
        was = latest.get(stream)
        if was is None or uint16_gt(seq, was):
            latest[stream] = seq
    return list(latest.items())


def streams_room_for(sctp: Any, chunk: Any) -> bool:
    """Whether the streams a FORWARD TSN `chunk` names fit in `sctp`'s `MAX_STREAMS` (aiortc
    makes one for each it does not have)."""
    streams = sctp._inbound_streams
    new = {stream_id for stream_id, _ in chunk.streams if stream_id not in streams}
    return len(streams) + len(new) <= MAX_STREAMS


# What aiortc raises reading a message a caller's stack made: text or a label not UTF-8
# (UnicodeDecodeError), a DCEP OPEN for an open channel or an ACK for none (AssertionError;
# KeyError under `python -O`).
UNREADABLE = (UnicodeDecodeError, AssertionError, KeyError)


def bound_sctp(sctp: RTCSctpTransport, count: Callable[[str], None]) -> None:
    """Check every packet `sctp` receives before aiortc parses it (`shared/wire/sctp_check`),
    every DATA and FORWARD TSN chunk against its rooms and the association's chunk rate
    before aiortc takes it, and drop a message one completes that aiortc cannot read (see
    the module)."""
    handle, receive = sctp._handle_data, sctp._receive_chunk
    budget = TokenBucket(CHUNK_RATE, CHUNK_BURST, time.monotonic())
    up = False  # the association has been up: an INIT would start it again. Once it has
    # closed (the caller's ABORT, even before it was up), nothing more is taken: aiortc would
    # set it up again, its data channels no longer told to the session (past its bound)

    async def checked(packet: bytes) -> None:
        nonlocal up
        state = sctp.state
        up = up or state == "connected"
        verdict = sctp_check.REFUSED if state == "closed" else sctp_check.check(packet, up)
        if verdict is not None:
            count(f"sctp_packet_{verdict}")
            return
        await handle(packet)

    async def bounded(chunk: Any) -> None:
        if isinstance(chunk, (DataChunk, ForwardTsnChunk)):
            if sctp._last_received_tsn is None:  # before the peer's INIT: aiortc raised
                count("sctp_chunk_dropped")
                return
            if isinstance(chunk, DataChunk):  # (a duplicate needs no room, but its token)
                fits = not is_new(sctp, chunk) or room_for(sctp, chunk)
            else:
                chunk.streams = last_of_each(chunk.streams)
                fits = streams_room_for(sctp, chunk)
            if not fits:
                count("sctp_chunk_dropped")
                return
            if not budget.take(time.monotonic()):
                count("sctp_chunk_rate_limited")
                return
        try:
            await receive(chunk)
        except UNREADABLE:
            count("sctp_message_malformed")
            log.debug("a data-channel message aiortc could not read", exc_info=True)

    sctp._handle_data = checked  # type: ignore[method-assign,assignment]
    sctp._receive_chunk = bounded  # type: ignore[method-assign]


def hook_points(sctp: Any) -> dict[str, bool]:
    """Whether every aiortc internal this module relies on is where we expect it, on `sctp`
    (a fresh association)."""
    from aiortc.rtcsctptransport import InboundStream

    handle_data = RTCSctpTransport._handle_data.__code__
    return {
        "RTCSctpTransport._receive_chunk": hasattr(sctp, "_receive_chunk")
        and "_receive_chunk" in handle_data.co_names,
        "RTCSctpTransport._handle_data": callable(getattr(sctp, "_handle_data", None))
        and "parse_packet" in handle_data.co_names,
        "ForwardTsnChunk.streams": isinstance(getattr(ForwardTsnChunk(), "streams", 0), list),
        "RTCSctpTransport._last_received_tsn": hasattr(sctp, "_last_received_tsn"),
        "RTCSctpTransport._sack_misordered": isinstance(getattr(sctp, "_sack_misordered", 0), set),
        "RTCSctpTransport._inbound_streams": isinstance(getattr(sctp, "_inbound_streams", 0), dict),
        "InboundStream.reassembly": isinstance(getattr(InboundStream(), "reassembly", 0), list),
        "rtcsctptransport.tsn_plus_one": callable(tsn_plus_one),
    }
