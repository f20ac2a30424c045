"""A caller's SCTP against a real transceiver: what its data channel makes aiortc keep.

The caller is a real aiortc peer whose own SCTP association, after the data channel is open,
also sends DATA chunks no ordinary stack sends: one 100,000 TSNs ahead (aiortc's SACK for it
raised, and the caller's association died), thousands past a gap in the TSNs (aiortc kept
every one, and sorted them all again at every chunk, on the thread all calls share), and
chunks naming a hundred stream ids (a stream, and a channel, each). They are dropped and
counted (`sctp_chunk_dropped`, `rtc/sctp_hooks.py`); the caller's channel goes on working.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from aiortc.rtcsctptransport import (
    SCTP_DATA_FIRST_FRAG,
    SCTP_DATA_LAST_FRAG,
    SCTP_DATA_UNORDERED,
    DataChunk,
    ForwardTsnChunk,
    StreamResetOutgoingParam,
)

from firsthop.services.call.caller import Caller
from firsthop.services.transceiver.rtc.sctp_hooks import (
    CHUNK_BURST,
    CHUNK_RATE,
    MAX_MISORDERED,
    MAX_STREAMS,
)
from firsthop.services.transceiver.rtc.session import MAX_CHANNELS
from firsthop.services.transceiver.session import CLIENT_EVENT_BURST, CLIENT_EVENT_RATE
from tests.integration.test_transceiver import caller_events, event_count, signal_via
from tests.support import AgentProcess, TransceiverProcess, eventually, wait_until
from tests.unit.test_sctp_check import packet

PPID_DCEP, PPID_STRING = 50, 51  # RFC 8831 §8: WebRTC DCEP, WebRTC String
DCEP_ACK, DCEP_OPEN = 0x02, 0x03  # RFC 8832 §5


@pytest.fixture(scope="module")
def tx() -> Iterator[TransceiverProcess]:
    agent = AgentProcess("echo").start()
    process = TransceiverProcess("--accept-direct", agent_url=agent.url).start()
    yield process
    process.kill()
    agent.kill()


def chunk(
    tsn: int, stream_id: int = 0, data: bytes = b"x", ppid: int = PPID_STRING, flags: int = 0
) -> DataChunk:
    c = DataChunk(flags=SCTP_DATA_FIRST_FRAG | SCTP_DATA_LAST_FRAG | flags)
    c.tsn, c.stream_id, c.stream_seq, c.protocol, c.user_data = tsn, stream_id, 0, ppid, data
    return c


@pytest.mark.timeout(120)
def test_chunks_past_a_gap_and_on_many_streams_are_dropped(tx: TransceiverProcess) -> None:
    before = event_count(tx, "sctp_chunk_dropped")
    gaps, streams = 3000, 100

    async def main() -> list[Any]:
        c = await open_channel(tx)
        channel = c.channel
        assert channel is not None
        sctp = c.pc.sctp
        assert sctp is not None
        ahead = sctp._local_tsn + 1000  # past what the channel itself will use
        await sctp._send_chunk(chunk((ahead + 100_000) % 2**32))  # past what a SACK can say
        for i in range(gaps):  # each one past a gap: none can be delivered
            await sctp._send_chunk(chunk((ahead + 2 * i) % 2**32))
            if i % 200 == 0:  # 800 a second: under the session's datagram budget (1000/s)
                await asyncio.sleep(0.25)
        for i in range(streams):  # one chunk on each of many streams
            await sctp._send_chunk(chunk((ahead + 2 * gaps + 2 * i) % 2**32, stream_id=100 + i))
        await asyncio.to_thread(
            wait_until,
            lambda: event_count(tx, "sctp_chunk_dropped") >= before + gaps - MAX_MISORDERED,
            30,
        )
        return await goes_on(c, 1)

    events = asyncio.run(main())
    assert hellos(events) == [{"type": "hello", "n": 1}]
    dropped = event_count(tx, "sctp_chunk_dropped") - before
    # everything past the rooms: the one too far ahead, the gaps beyond MAX_MISORDERED, the
    # streams beyond MAX_STREAMS
    assert dropped >= 1 + gaps + streams - MAX_MISORDERED - MAX_STREAMS
    assert tx.proc is not None and tx.proc.poll() is None


async def open_channel(tx: TransceiverProcess) -> Caller:
    c = Caller(data_channel=True)
    await c.start(signal_via(tx, [f"{tx.media[0]}:{tx.media[1]}"]))
    await asyncio.wait_for(c.wait_connected(), 10)
    channel = c.channel
    assert channel is not None
    await eventually(lambda: channel.readyState == "open", 5)
    return c


async def goes_on(c: Caller, n: int) -> list[Any]:
    """After an attack: the call is still up and its channel still echoes an event (`n`);
    closes it, and returns what the caller got."""
    channel = c.channel
    assert channel is not None
    channel.send(json.dumps({"type": "hello", "n": n}))
    await eventually(lambda: any(e["type"] == "echo" for e in caller_events(c)), 10)
    state = c.pc.connectionState
    await c.close()
    assert state == "connected"
    return caller_events(c)


def hellos(events: list[Any]) -> list[Any]:
    return [e["event"] for e in events if e["type"] == "echo"]


def echoed(c: Caller, kind: str) -> int:
    return sum(1 for e in caller_events(c) if e["type"] == "echo" and e["event"]["type"] == kind)


@pytest.mark.timeout(120)
def test_a_flood_of_tiny_events_is_held_to_the_sessions_event_budget(
    tx: TransceiverProcess,
) -> None:
    """1,500 tiny events at once: the agent gets the burst and the rate, the rest are
    counted drops, unparsed and unanswered; once the budget refills the channel works."""
    before = event_count(tx, "client_events_rate_limited")
    sent = 1500

    async def main() -> tuple[int, float]:
        c = await open_channel(tx)
        channel = c.channel
        assert channel is not None
        start = time.monotonic()
        for i in range(sent):
            channel.send(json.dumps({"type": "x", "n": i}))
        await asyncio.to_thread(
            wait_until,
            lambda: event_count(tx, "client_events_rate_limited") - before + echoed(c, "x") >= sent,
            60,
        )
        elapsed = time.monotonic() - start
        for _ in range(40):  # the budget refills: a later event reaches the agent
            channel.send(json.dumps({"type": "hello"}))
            await asyncio.sleep(0.25)
            if echoed(c, "hello"):
                break
        flood = echoed(c, "x")
        await c.close()
        return flood, elapsed

    flood, elapsed = asyncio.run(main())
    assert flood <= CLIENT_EVENT_BURST + CLIENT_EVENT_RATE * elapsed + 1
    assert event_count(tx, "client_events_rate_limited") - before >= sent - flood
    assert tx.proc is not None and tx.proc.poll() is None


@pytest.mark.timeout(120)
def test_new_chunks_past_the_associations_rate_are_dropped(tx: TransceiverProcess) -> None:
    """A caller's own SCTP sending DATA chunks in order, faster than CHUNK_RATE (burst
    CHUNK_BURST): the rest are dropped before aiortc handles them, counted."""
    before = event_count(tx, "sctp_chunk_rate_limited")
    sent = int(CHUNK_BURST) * 3

    async def main() -> None:
        c = await open_channel(tx)
        sctp = c.pc.sctp
        assert sctp is not None
        first = sctp._local_tsn
        start = time.monotonic()
        for i in range(sent):  # (stream 1: none of them the open channel's messages)
            await sctp._send_chunk(chunk((first + i) % 2**32, stream_id=1))

        def held_to_the_rate() -> bool:  # by now at most the burst and the rate since passed
            dropped = event_count(tx, "sctp_chunk_rate_limited") - before
            allowed = CHUNK_BURST + CHUNK_RATE * (time.monotonic() - start)
            return dropped > 0 and dropped >= sent - allowed

        await asyncio.to_thread(wait_until, held_to_the_rate, 30)
        await c.close()

    asyncio.run(main())
    assert tx.proc is not None and tx.proc.poll() is None


@pytest.mark.timeout(120)
def test_messages_aiortc_cannot_read_are_dropped_and_the_call_goes_on(
    tx: TransceiverProcess,
) -> None:
    """Each of these raised out of aiortc's delivery into the DTLS transport's receive task,
    and the caller's call ended: text that is not UTF-8 on the open channel, a DCEP OPEN for
    the channel already open, an ACK for a channel never opened, an OPEN whose label is not
    UTF-8. Now each is a counted drop, and the channel goes on working."""
    before = event_count(tx, "sctp_message_malformed")

    def dcep_open(label: bytes) -> bytes:  # RFC 8832 §5.1: reliable, ordered, no protocol
        return (
            bytes([DCEP_OPEN, 0, 0, 0, 0, 0, 0, 0])
            + len(label).to_bytes(2, "big")
            + b"\0\0"
            + label
        )

    async def main() -> list[Any]:
        c = await open_channel(tx)
        channel, sctp = c.channel, c.pc.sctp
        assert channel is not None and sctp is not None and channel.id is not None
        bad = [
            (channel.id, PPID_STRING, b"\xff\xfe not utf-8"),
            (channel.id, PPID_DCEP, dcep_open(b"again")),
            (channel.id + 2, PPID_DCEP, bytes([DCEP_ACK])),
            (channel.id + 4, PPID_DCEP, dcep_open(b"\xc3\x28")),
        ]
        first = sctp._local_tsn
        for i, (stream_id, ppid, data) in enumerate(bad):  # the next TSNs, delivered at once
            tsn = (first + i) % 2**32
            await sctp._send_chunk(chunk(tsn, stream_id, data, ppid, SCTP_DATA_UNORDERED))
        sctp._local_tsn = (first + len(bad)) % 2**32  # (the channel's own messages follow)
        await asyncio.to_thread(
            wait_until, lambda: event_count(tx, "sctp_message_malformed") >= before + len(bad), 15
        )
        return await goes_on(c, 2)  # the call and its channel go on

    events = asyncio.run(main())
    assert hellos(events) == [{"type": "hello", "n": 2}]
    assert event_count(tx, "sctp_message_malformed") - before == 4
    assert tx.proc is not None and tx.proc.poll() is None


def forward_tsn(cumulative_tsn: int, streams: list[tuple[int, int]]) -> ForwardTsnChunk:
    f = ForwardTsnChunk()
    f.cumulative_tsn, f.streams = cumulative_tsn % 2**32, streams
    return f


@pytest.mark.timeout(120)
def test_forward_tsn_chunks_naming_new_streams_past_the_room_are_dropped(
    tx: TransceiverProcess,
) -> None:
    """A FORWARD TSN (RFC 3758) made aiortc a stream for every stream id it named, past
    MAX_STREAMS, and aiortc then walked all of them at every such chunk: 226 packets made
    65,536 streams, after which one datagram of empty FORWARD TSNs held every call on the
    transceiver up for seconds. Now one naming streams past the room is dropped, counted (one
    naming more than 8 streams never reaches aiortc: `sctp_check`)."""
    before = event_count(tx, "sctp_chunk_dropped")
    sent = 20

    async def main() -> list[Any]:
        c = await open_channel(tx)
        channel, sctp = c.channel, c.pc.sctp
        assert channel is not None and sctp is not None and channel.id is not None
        first = sctp._local_tsn
        sctp._local_tsn = (first + 1000) % 2**32  # (the channel's own messages after these)
        for i in range(sent):  # each moves the cumulative TSN on, naming 8 new streams
            streams = [(1000 + 8 * i + k, 0) for k in range(8)]
            await sctp._send_chunk(forward_tsn(first + i, streams))
        await asyncio.to_thread(
            wait_until, lambda: event_count(tx, "sctp_chunk_dropped") >= before + sent, 15
        )
        # one that names only the channel's own stream fits, and is taken
        await sctp._send_chunk(forward_tsn(first + 999, [(channel.id, 0)]))
        return await goes_on(c, 3)

    events = asyncio.run(main())
    assert hellos(events) == [{"type": "hello", "n": 3}]
    assert event_count(tx, "sctp_chunk_dropped") - before == sent
    assert tx.proc is not None and tx.proc.poll() is None


@pytest.mark.timeout(120)
def test_a_forward_tsn_that_releases_an_unreadable_message_drops_it_and_the_call_goes_on(
    tx: TransceiverProcess,
) -> None:
    """An ordered message aiortc cannot read, held behind sequence numbers that never come,
    then a FORWARD TSN that skips them: aiortc delivers it from the FORWARD TSN's handling
    (not a DATA chunk's), and it raised there into the DTLS receive task."""
    before = event_count(tx, "sctp_message_malformed")

    async def main() -> list[Any]:
        c = await open_channel(tx)
        channel, sctp = c.channel, c.pc.sctp
        assert channel is not None and sctp is not None and channel.id is not None
        first = sctp._local_tsn
        sctp._local_tsn = (first + 2) % 2**32
        held = chunk((first + 1) % 2**32, channel.id, b"\xff not utf-8")
        held.stream_seq = 1000  # ordered: waits for sequence numbers the caller never sends
        await sctp._send_chunk(held)
        await sctp._send_chunk(forward_tsn(first, [(channel.id, 999)]))
        await asyncio.to_thread(
            wait_until, lambda: event_count(tx, "sctp_message_malformed") >= before + 1, 15
        )
        return await goes_on(c, 4)  # the call and its channel go on

    events = asyncio.run(main())
    assert hellos(events) == [{"type": "hello", "n": 4}]
    assert event_count(tx, "sctp_message_malformed") - before == 1


def sctp_packet(sctp: Any, *chunks: tuple[int, int, bytes]) -> bytes:
    """A raw SCTP packet of the caller's association (its ports and the transceiver's
    verification tag)."""
    ports = (sctp._local_port, sctp._remote_port)
    return packet(*chunks, ports=ports, tag=sctp._remote_verification_tag)


@pytest.mark.timeout(120)
def test_packets_aiortc_would_misread_never_reach_it(tx: TransceiverProcess) -> None:
    """Over the caller's own DTLS: a HEARTBEAT with a parameter of length 0 (aiortc's parser
    looped for good on the thread every call shares, its memory growing), a SACK whose gap
    blocks span every TSN (1.65 s of that thread), a DATA chunk too short for its fields and
    a SACK whose gap block ends before it starts (each raised, ending the call), a packet of
    100 HEARTBEATs (100
    answers). Each is dropped before aiortc parses it, counted; the call goes on."""
    malformed = event_count(tx, "sctp_packet_malformed")
    refused = event_count(tx, "sctp_packet_refused")
    beat = (4, 0, b"\x00\x01\x00\x08abcd")

    async def main() -> list[Any]:
        c = await open_channel(tx)
        channel, sctp = c.channel, c.pc.sctp
        assert channel is not None and sctp is not None
        dtls = sctp.transport
        sack = struct.pack("!LLHH", sctp._last_sacked_tsn, 1 << 20, 300, 0)
        for data in (
            sctp_packet(sctp, (4, 0, b"\x00\x01\x00\x00")),
            sctp_packet(sctp, (0, 3, bytes(11))),
            sctp_packet(sctp, (3, 0, struct.pack("!LLHH", 1, 1 << 20, 1, 0) + b"\0\5\0\4")),
            sctp_packet(sctp, (3, 0, sack + struct.pack("!HH", 1, 65535) * 300)),
            sctp_packet(sctp, *[beat] * 100),  # (a datagram holds 1,500 bytes)
        ):
            await dtls._send_data(data)
        await asyncio.to_thread(
            wait_until,
            lambda: (
                event_count(tx, "sctp_packet_malformed") >= malformed + 3
                and event_count(tx, "sctp_packet_refused") >= refused + 2
            ),
            15,
        )
        return await goes_on(c, 5)

    events = asyncio.run(main())
    assert hellos(events) == [{"type": "hello", "n": 5}]
    assert event_count(tx, "sctp_packet_malformed") - malformed == 3
    assert event_count(tx, "sctp_packet_refused") - refused == 2
    assert tx.proc is not None and tx.proc.poll() is None


@pytest.mark.timeout(120)
def test_a_caller_that_never_lets_its_channels_close_ends_its_own_call_past_the_limit(
    tx: TransceiverProcess,
) -> None:
    """A caller that opens a channel, resets it, and never answers our reset of it leaves
    the channel in aiortc's table (a helper kept 1,113 of them over 2,000 cycles). Past
    MAX_CHANNELS such channels the call ends, counted; a caller that lets them close is not
    limited (the cycles before that one, closed both ways, are not counted)."""
    over = event_count(tx, "datachannels_over_limit")

    async def cycle(c: Caller, label: str, closes: bool = True) -> bool:
        """Open a channel and close it; False if the call ended instead."""
        channel = c.pc.createDataChannel(label)

        def ended() -> bool:
            return bool(c.pc.connectionState != "connected")

        await eventually(lambda: channel.readyState == "open" or ended(), 10)
        if ended():
            return False
        channel.close()  # (our answer, and our own reset: closed both ways, unless deaf)
        await eventually(lambda: channel.readyState == ("closed" if closes else "closing"), 5)
        return True

    async def main() -> int:
        c = await open_channel(tx)
        sctp = c.pc.sctp
        assert sctp is not None
        for i in range(MAX_CHANNELS + 4):  # closed both ways: nothing held, no limit
            assert await cycle(c, f"fine-{i}")
        receive = sctp._receive_reconfig_param

        async def deaf(param: Any) -> None:  # our resets of its channels: never answered
            if not isinstance(param, StreamResetOutgoingParam):
                await receive(param)

        sctp._receive_reconfig_param = deaf  # type: ignore[method-assign]
        held = 0  # (its first channel, still open, counts too)
        while held < MAX_CHANNELS + 1 and await cycle(c, f"held-{held}", closes=False):
            held += 1
        await eventually(lambda: c.pc.connectionState != "connected", 15)
        await c.close()
        return held

    assert asyncio.run(main()) == MAX_CHANNELS - 1
    assert event_count(tx, "datachannels_over_limit") - over == 1
    assert tx.proc is not None and tx.proc.poll() is None


@pytest.mark.timeout(120)
def test_an_association_is_never_started_again(tx: TransceiverProcess) -> None:
    """An INIT once the association is up would have aiortc start it again; after the
    caller's ABORT, an INIT and a COOKIE ECHO did, and the new association's data channels
    were no longer told to the session (past its channel bound, unseen). Both are refused;
    after an ABORT nothing more is taken. The call's media is not the association's."""
    refused = event_count(tx, "sctp_packet_refused")

    async def main() -> str:
        c = await open_channel(tx)
        sctp = c.pc.sctp
        assert sctp is not None
        dtls = sctp.transport
        init = struct.pack("!LLHHL", 0x1234, 1 << 20, 65535, 65535, 77)
        await dtls._send_data(sctp_packet(sctp, (1, 0, init)))  # up: refused
        await dtls._send_data(sctp_packet(sctp, (6, 0, b"")))  # the caller's ABORT: taken
        await asyncio.sleep(0.5)
        await dtls._send_data(sctp_packet(sctp, (1, 0, init)))  # closed: refused
        await dtls._send_data(sctp_packet(sctp, (4, 0, b"\x00\x01\x00\x08abcd")))  # refused
        await asyncio.to_thread(
            wait_until, lambda: event_count(tx, "sctp_packet_refused") >= refused + 3, 15
        )
        state = c.pc.connectionState
        await c.close()
        return str(state)

    assert asyncio.run(main()) == "connected"
    # (and whatever the caller's own stack sent after its ABORT)
    assert event_count(tx, "sctp_packet_refused") - refused >= 3
    assert tx.proc is not None and tx.proc.poll() is None
