"""The reference for transceiver benchmarks: stock aiortc, one RTCPeerConnection and one UDP
socket per call, plain asyncio, doing the same echo work (decode, hand the frame back,
encode). Run as `python -m firsthop.services.bench.stock PORT`: it answers `POST /offer` (body: SDP)
with the answer SDP on 127.0.0.1:PORT and prints "ready" once listening; `GET /sessions`
answers `{"sessions": N}`, the peer connections still open (benches wait for it to drain).

`python -m firsthop.services.bench.stock PORT --mono` echoes each decoded frame as a fresh mono
frame (as the transceiver hands audio to its agent and plays it back) instead of the decoder's own
frame: aiortc's sender computes the RFC 6465 audio level in pure Python over the whole plane
buffer, and a frame from the Opus decoder is padded to 120 ms of stereo (23,040 bytes), so
echoing it as is costs about 8x the audio-level work of a 20 ms mono frame.
"""

from __future__ import annotations

import array
import asyncio
import json
import sys
from typing import Any

from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from av import AudioFrame
from av.frame import Frame
from av.packet import Packet

MONO = False  # set by `--mono`


def mono_copy(frame: AudioFrame) -> AudioFrame:
    """The same 20 ms as a fresh, unpadded PCM16 mono frame (left channel)."""
    channels = len(frame.layout.channels)
    samples = array.array("h")
    samples.frombytes(bytes(frame.planes[0])[: frame.samples * 2 * channels])
    out = AudioFrame(format="s16", layout="mono", samples=frame.samples)
    out.planes[0].update(samples[::channels].tobytes())
    out.pts, out.sample_rate, out.time_base = frame.pts, frame.sample_rate, frame.time_base
    return out


class EchoTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self.source: asyncio.Future[MediaStreamTrack] = asyncio.get_running_loop().create_future()

    async def recv(self) -> Frame | Packet[Any]:
        source = await self.source
        frame = await source.recv()
        if MONO and isinstance(frame, AudioFrame):
            return mono_copy(frame)
        return frame


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
        if head.startswith(b"GET "):
            data = json.dumps({"sessions": len(PEERS)}).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
                + f"Content-Length: {len(data)}\r\n\r\n".encode()
                + data
            )
            await writer.drain()
            return
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
    MONO = "--mono" in sys.argv[2:]
    asyncio.run(main(int(sys.argv[1])))
