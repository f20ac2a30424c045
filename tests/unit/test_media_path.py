"""`hooks.media_path`: SRTP handled in-line on a stock aiortc peer connection, DTLS queued for
aiortc's task, order kept; and `_run_in_line`, which runs aiortc's handlers to their end."""

from __future__ import annotations

import asyncio
import os

import aioice
import aioice.ice
import pylibsrtp
from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.rtcdtlstransport import State
from aiortc.rtcrtpparameters import (
    RTCRtpCodecParameters,
    RTCRtpDecodingParameters,
    RTCRtpReceiveParameters,
)
from aiortc.rtp import RtcpReceiverInfo, RtcpRrPacket, RtpPacket

from firsthop.services.transceiver.media.jitter import Frame
from firsthop.services.transceiver.rtc import hooks

KEY = os.urandom(30)  # SRTP_AES128_CM_SHA1_80: 16-byte key + 14-byte salt
OPUS = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48000, channels=2, payloadType=111)


def srtp(direction: int) -> pylibsrtp.Session:
    return pylibsrtp.Session(policy=pylibsrtp.Policy(key=KEY, ssrc_type=direction))


def rtp(seq: int) -> bytes:
    packet = RtpPacket(payload_type=111, sequence_number=seq, timestamp=seq * 960, ssrc=1234)
    packet.payload = b"\xf8\xff\xfe"
    return packet.serialize()


async def a_receiving_call() -> tuple[RTCPeerConnection, aioice.Connection, list[Frame], object]:
    """A stock peer connection whose audio receiver hands frames to a list, with a
    StunProtocol on its ICE connection, and SRTP keys as DTLS would leave them."""
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    receiver = pc.addTransceiver("audio").receiver
    frames: list[Frame] = []
    hooks.low_latency_receiver(receiver, frames.append)
    params = RTCRtpReceiveParameters(
        codecs=[OPUS], encodings=[RTCRtpDecodingParameters(ssrc=1234, payloadType=111)]
    )
    await receiver.receive(params)
    dtls = receiver.transport
    conn = dtls.transport._connection
    protocol = aioice.ice.StunProtocol(conn)
    protocol.local_candidate = aioice.Candidate(
        foundation="1",
        component=1,
        transport="udp",
        priority=1,
        host="127.0.0.1",
        port=1,
        type="host",
    )
    dtls._rx_srtp = srtp(pylibsrtp.Policy.SSRC_ANY_INBOUND)
    dtls._set_state(State.CONNECTED)  # (as DTLS would leave it; its task is not needed here)
    return pc, conn, frames, protocol


def test_srtp_is_handled_in_line_and_dtls_is_queued_in_order() -> None:
    async def main() -> None:
        pc, conn, frames, protocol = await a_receiving_call()
        deliver = hooks.media_path(pc, protocol)  # type: ignore[arg-type]
        tx = srtp(pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
        dtls = pc.getTransceivers()[0].receiver.transport

        deliver(tx.protect(rtp(1)))  # decoded by the time deliver returns: no task ran
        assert [f.data for f in frames] == [b"\xf8\xff\xfe"]
        assert conn._queue.qsize() == 0
        assert dtls._RTCDtlsTransport__rx_packets == 1  # type: ignore[attr-defined]

        report = RtcpRrPacket(ssrc=1234, reports=[RtcpReceiverInfo(1, 0, 0, 1, 0, 0, 0)])
        deliver(tx.protect_rtcp(bytes(report)))  # SRTCP too, to the sender's handler
        deliver(b"\x16" + os.urandom(40))  # a DTLS record: for aiortc's task
        assert conn._queue.qsize() == 1
        deliver(tx.protect(rtp(2)))  # behind it in the queue, not ahead of it
        assert conn._queue.qsize() == 2 and len(frames) == 1

        deliver(b"\x80" + os.urandom(40))  # forged SRTP: dropped like aiortc drops it
        await pc.close()

    asyncio.run(main())


def test_a_caller_gets_at_most_two_rtp_streams() -> None:
    """Every SSRC that authenticates costs a libsrtp stream and receiver state for the call's
    life: the third is dropped unread, and forged packets (any SSRC) take no place."""

    async def main() -> None:
        pc, conn, frames, protocol = await a_receiving_call()
        counted: list[str] = []
        deliver = hooks.media_path(pc, protocol, counted.append)  # type: ignore[arg-type]
        tx = srtp(pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
        for ssrc in range(100):  # forged: from the caller's address, not authenticated
            deliver(b"\x80\x6f\x00\x01" + bytes(4) + ssrc.to_bytes(4, "big") + os.urandom(30))
        assert counted == []
        for ssrc in (1234, 1235, 1236, 1237):
            packet = RtpPacket(payload_type=111, sequence_number=1, timestamp=960, ssrc=ssrc)
            packet.payload = b"\xf8\xff\xfe"
            deliver(tx.protect(packet.serialize()))
        assert counted == ["ssrc_refused", "ssrc_refused"]
        deliver(tx.protect(rtp(2)))  # the first stream goes on
        assert [f.data for f in frames][-1] == b"\xf8\xff\xfe" and len(counted) == 2
        await pc.close()

    asyncio.run(main())


def test_before_the_keys_srtp_waits_in_the_queue() -> None:
    async def main() -> None:
        pc, conn, frames, protocol = await a_receiving_call()
        pc.getTransceivers()[0].receiver.transport._rx_srtp = None  # type: ignore[assignment]
        deliver = hooks.media_path(pc, protocol)  # type: ignore[arg-type]
        deliver(srtp(pylibsrtp.Policy.SSRC_ANY_OUTBOUND).protect(rtp(1)))
        assert conn._queue.qsize() == 1 and frames == []
        await pc.close()

    asyncio.run(main())


def test_once_the_dtls_transport_is_closed_srtp_is_left_in_the_queue() -> None:
    """As aiortc's task, which ends there: a stopped transport, or one whose peer sent
    `close_notify`, hands no more media to its receivers."""

    async def main() -> None:
        pc, conn, frames, protocol = await a_receiving_call()
        deliver = hooks.media_path(pc, protocol)  # type: ignore[arg-type]
        tx = srtp(pylibsrtp.Policy.SSRC_ANY_OUTBOUND)
        deliver(tx.protect(rtp(1)))
        assert len(frames) == 1
        pc.getTransceivers()[0].receiver.transport._set_state(State.CLOSED)
        deliver(tx.protect(rtp(2)))
        assert len(frames) == 1 and conn._queue.qsize() == 1
        await pc.close()

    asyncio.run(main())


def test_a_handler_that_waits_is_finished_by_a_task() -> None:
    async def main() -> None:
        steps: list[str] = []
        gate: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        async def quick() -> None:
            steps.append("quick")

        async def waits() -> None:
            steps.append("before")
            steps.append(await gate)

        hooks._run_in_line(quick())
        assert steps == ["quick"]
        hooks._run_in_line(waits())
        assert steps == ["quick", "before"]
        gate.set_result("after")
        for _ in range(3):
            await asyncio.sleep(0)
        assert steps == ["quick", "before", "after"]

    asyncio.run(main())


def test_the_media_path_hook_points_are_where_expected() -> None:
    async def main() -> dict[str, bool]:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        dtls = pc.addTransceiver("audio").receiver.transport
        points = hooks._media_path_points(dtls.transport._connection, dtls)
        assert set(points) <= set(hooks.hook_points())  # (checked with the others)
        await pc.close()
        return points

    points = asyncio.run(main())
    assert len(points) >= 8 and all(points.values()), points
