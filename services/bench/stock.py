"""The reference for transceiver benchmarks: stock aiortc, one RTCPeerConnection and one UDP
socket per call, plain asyncio, doing the same echo work (decode, hand the frame back,
encode). Run as `python -m services.bench.stock PORT`: it answers `POST /offer` (body: SDP)
with the answer SDP on 127.0.0.1:PORT and prints "ready" once listening.
"""

from __future__ import annotations

import asyncio
import sys

from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from av.frame import Frame
from av.packet import Packet


class EchoTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.source: asyncio.Future[MediaStreamTrack] = asyncio.get_running_loop().create_future()

    async def recv(self) -> Frame | Packet:
        source = await self.source
        return await source.recv()


PEERS: set[RTCPeerConnection] = set()


async def answer(offer: str) -> str:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    PEERS.add(pc)
    echo = EchoTrack()

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        if track.kind == "audio" and not echo.source.done():
            echo.source.set_result(track)

    @pc.on("connectionstatechange")
    async def on_state() -> None:
        if pc.connectionState in ("failed", "closed"):
            PEERS.discard(pc)
            await pc.close()

    await pc.setRemoteDescription(RTCSessionDescription(offer, "offer"))
    pc.addTrack(echo)
    await pc.setLocalDescription(await pc.createAnswer())
    return str(pc.localDescription.sdp)


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await reader.readexactly(length)
        sdp = await answer(body.decode())
        data = sdp.encode()
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/sdp\r\nConnection: close\r\n"
            + f"Content-Length: {len(data)}\r\n\r\n".encode()
            + data
        )
        await writer.drain()
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
