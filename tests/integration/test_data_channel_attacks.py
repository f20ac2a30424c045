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
from collections.abc import Iterator
from typing import Any

import pytest
from aiortc.rtcsctptransport import SCTP_DATA_FIRST_FRAG, SCTP_DATA_LAST_FRAG, DataChunk

from firsthop.services.call.caller import Caller
from firsthop.services.transceiver.rtc.sctp_hooks import MAX_MISORDERED, MAX_STREAMS
from tests.integration.test_transceiver import caller_events, event_count, signal_via
from tests.support import AgentProcess, TransceiverProcess, eventually, wait_until

PPID_STRING = 51  # RFC 8831 §8: WebRTC String


@pytest.fixture(scope="module")
def tx() -> Iterator[TransceiverProcess]:
    agent = AgentProcess("echo").start()
    process = TransceiverProcess("--accept-direct", agent_url=agent.url).start()
    yield process
    process.kill()
    agent.kill()


def chunk(tsn: int, stream_id: int = 0, data: bytes = b"x") -> DataChunk:
    c = DataChunk(flags=SCTP_DATA_FIRST_FRAG | SCTP_DATA_LAST_FRAG)
    c.tsn, c.stream_id, c.stream_seq, c.protocol, c.user_data = tsn, stream_id, 0, PPID_STRING, data
    return c


@pytest.mark.timeout(120)
def test_chunks_past_a_gap_and_on_many_streams_are_dropped(tx: TransceiverProcess) -> None:
    before = event_count(tx, "sctp_chunk_dropped")
    gaps, streams = 3000, 100

    async def main() -> list[Any]:
        c = Caller(data_channel=True)
        await c.start(signal_via(tx, [f"{tx.media[0]}:{tx.media[1]}"]))
        await asyncio.wait_for(c.wait_connected(), 10)
        channel = c.channel
        assert channel is not None
        await eventually(lambda: channel.readyState == "open", 5)
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
        channel.send(json.dumps({"type": "hello", "n": 1}))  # the channel still works
        await eventually(lambda: any(e["type"] == "echo" for e in caller_events(c)), 10)
        await c.close()
        return caller_events(c)

    events = asyncio.run(main())
    assert [e["event"] for e in events if e["type"] == "echo"] == [{"type": "hello", "n": 1}]
    dropped = event_count(tx, "sctp_chunk_dropped") - before
    # everything past the rooms: the one too far ahead, the gaps beyond MAX_MISORDERED, the
    # streams beyond MAX_STREAMS
    assert dropped >= 1 + gaps + streams - MAX_MISORDERED - MAX_STREAMS
    assert tx.proc is not None and tx.proc.poll() is None
