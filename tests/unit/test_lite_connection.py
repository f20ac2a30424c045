"""The ICE connection aiortc's transports run on (rtc/lite_connection.py): it completes when
the table selects a path, carries DTLS both ways through a bounded queue, and closes as
aioice's does; a real aiortc ICE transport and gatherer run on it."""

from __future__ import annotations

import asyncio

import pytest
from aiortc import RTCIceParameters
from aiortc.rtcicetransport import RTCIceGatherer, RTCIceTransport

from firsthop.services.transceiver.rtc import hooks
from firsthop.services.transceiver.rtc.lite_connection import MAX_QUEUE, LiteConnection
from firsthop.shared.address import Address

INGRESS: list[Address] = [("198.51.100.1", 3478)]
TCP: list[Address] = [("198.51.100.1", 443)]
CALLER: Address = ("203.0.113.5", 5555)


def make(sent: list[tuple[bytes, Address]], path: list[Address | None]) -> LiteConnection:
    return LiteConnection(
        ("TOKEN", "p" * 24),
        candidates=INGRESS,
        tcp_candidates=TCP,
        send=lambda data, addr: sent.append((data, addr)),
        selected=lambda: path[0],
    )


def test_an_aiortc_transport_on_it_connects_when_a_path_is_selected_and_carries_dtls() -> None:
    async def main() -> None:
        sent: list[tuple[bytes, Address]] = []
        path: list[Address | None] = [None]
        gatherer = RTCIceGatherer(iceServers=[])
        transport = RTCIceTransport(gatherer)
        conn = make(sent, path)
        hooks.use_lite_connection(transport, conn)
        await gatherer.gather()
        params = gatherer.getLocalParameters()
        assert (params.usernameFragment, params.password) == ("TOKEN", "p" * 24)
        candidates = gatherer.getLocalCandidates()
        assert [(c.ip, c.port, c.protocol, c.tcpType) for c in candidates] == [
            ("198.51.100.1", 3478, "udp", None),
            ("198.51.100.1", 443, "tcp", "passive"),
        ]
        assert candidates[0].priority > candidates[1].priority  # UDP first (RFC 6544 §4.2)
        start = asyncio.ensure_future(transport.start(RTCIceParameters("clnt", "c" * 24)))
        await asyncio.sleep(0)
        assert not start.done() and transport.state == "checking"
        path[0] = CALLER
        conn.path_selected()
        await asyncio.wait_for(start, 1)
        assert transport.state == "completed"
        assert conn.remote_username == "clnt"
        await transport._send(b"\x16dtls-out")
        assert sent == [(b"\x16dtls-out", CALLER)]
        assert conn.deliver(b"\x16dtls-in")
        assert await asyncio.wait_for(transport._recv(), 1) == b"\x16dtls-in"
        waiting = asyncio.ensure_future(transport._recv())
        await asyncio.sleep(0)
        await transport.stop()  # close: the waiting recv learns it, as with aioice
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(waiting, 1)
        assert transport.state == "closed"

    asyncio.run(main())


def test_the_queue_is_bounded_and_a_close_before_a_path_fails_connect() -> None:
    async def main() -> None:
        conn = make([], [None])
        assert all(conn.deliver(b"\x16x") for _ in range(MAX_QUEUE))
        assert not conn.deliver(b"\x16x") and conn.dropped == 1
        connect = asyncio.ensure_future(conn.connect())
        await asyncio.sleep(0)
        await conn.close()
        with pytest.raises(ConnectionError):
            await asyncio.wait_for(connect, 1)
        assert conn.deliver(b"\x16late")  # after close: taken, and dropped quietly
        with pytest.raises(ConnectionError):
            await conn.recv()

    asyncio.run(main())


def test_nothing_is_sent_without_a_path_and_a_restart_changes_the_credentials() -> None:
    async def main() -> None:
        sent: list[tuple[bytes, Address]] = []
        conn = make(sent, [None])
        await conn.send(b"\x16early")
        assert sent == []
        conn.restart(("TOKEN2", "q" * 24), ("clnt2", "d" * 24))
        assert (conn.local_username, conn.remote_username) == ("TOKEN2", "clnt2")

    asyncio.run(main())
