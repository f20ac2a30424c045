"""Signaling's client of the transceivers' internal API (`signaling/transceivers.py`) against
a real HTTP server on loopback: recordings stream on a pool of their own."""

from __future__ import annotations

from functools import partial

import httpx
import trio

from firsthop.services.signaling.transceivers import TransceiverClient


async def endless_recordings(stream: trio.SocketStream) -> None:
    """One connection: a recording's answer is a body that never ends (a reader that reads
    nothing holds it); any other request gets 204 at once."""
    data = b""
    while True:
        while b"\r\n\r\n" not in data:
            chunk = await stream.receive_some(65536)
            if not chunk:
                return
            data += chunk
        head, _, data = data.partition(b"\r\n\r\n")
        if b"/recordings/" in head.split(b"\r\n", 1)[0]:
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: audio/ogg\r\nContent-Length: 1000000000\r\n\r\n"
                + bytes(65536)
            )
            await trio.sleep_forever()
        await stream.send_all(b"HTTP/1.1 204 No Content\r\n\r\n")


async def test_slow_recording_downloads_do_not_hold_what_placement_needs() -> None:
    """Downloads read slowly (or not at all) held connections of the pool every create,
    restart and hangup goes through: with 8 of them in a pool of 8, placing a call failed
    after the pool's 10 s (a helper's measurement, stop 41). On their own pool they hold
    only it: the control requests still go at once."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, endless_recordings, 0, host="127.0.0.1")
        )
        url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        pool = httpx.Limits(max_connections=2)
        async with (
            httpx.AsyncClient(limits=pool, trust_env=False) as http,
            httpx.AsyncClient(limits=pool, trust_env=False) as downloads,
        ):
            client = TransceiverClient(http, None, downloads)
            held = [await client.recording(url, f"call-{i}") for i in range(2)]
            assert [status for status, _ in held] == [200, 200]  # both open, neither read
            with trio.fail_after(5):
                for i in range(4):  # more than the control pool holds, one after another
                    assert await client.delete_session(url, f"s{i}") == 204
        nursery.cancel_scope.cancel()
