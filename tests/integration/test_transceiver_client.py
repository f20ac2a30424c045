"""Signaling's client of the transceivers' internal API (`signaling/transceivers.py`) against
a real HTTP server on loopback: recordings stream on a pool of their own, and one API key
streams at most its share of it."""

from __future__ import annotations

from contextlib import AsyncExitStack
from functools import partial

import httpx
import redis as redis_lib
import trio

from firsthop.services.signaling.auth import fingerprint
from firsthop.services.signaling.transceivers import (
    DOWNLOADS_PER_KEY,
    RECORDING_DOWNLOADS,
    TransceiverClient,
)
from firsthop.shared.redis_store import recording_key
from tests.support import SignalingProcess, redis_server


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


async def test_one_key_streams_at_most_its_share_of_the_recordings() -> None:
    """A real signaling, its recordings' index in a real Redis, each pointing at a server
    whose recordings never end. One key's downloads that are never read held the download
    pool's 32 connections, and every other key's waited (a helper's read, stop 41): a key
    now streams at most `DOWNLOADS_PER_KEY` at once (429 past it), all keys together at most
    the pool (503), and a download that ends gives its slot back."""
    keys = [f"key-{i}" for i in range(RECORDING_DOWNLOADS // DOWNLOADS_PER_KEY + 1)]
    with redis_server() as redis:
        sig = SignalingProcess("--redis", redis.url, "--ip-rate", "0", api_keys=",".join(keys))
        sig.start()
        try:
            async with trio.open_nursery() as nursery:
                listeners = await nursery.start(
                    partial(trio.serve_tcp, endless_recordings, 0, host="127.0.0.1")
                )
                api_url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
                index = redis_lib.Redis.from_url(redis.url)
                for key in keys:
                    for n in range(DOWNLOADS_PER_KEY + 1):
                        index.hset(
                            recording_key(f"{key}-{n}"),
                            mapping={"owner": f"key:{fingerprint(key)}", "api_url": api_url,
                                     "transceiver_id": "tx-endless"},
                        )  # fmt: skip
                async with (
                    httpx.AsyncClient(base_url=sig.url, timeout=5) as http,
                    AsyncExitStack() as held,
                ):

                    async def download(key: str, n: int) -> httpx.Response:
                        return await held.enter_async_context(
                            http.stream(
                                "GET",
                                f"/v1/calls/{key}-{n}/recording",
                                headers={"Authorization": f"Bearer {key}"},
                            )
                        )

                    with trio.fail_after(30):
                        first = [await download(keys[0], n) for n in range(DOWNLOADS_PER_KEY)]
                        assert [r.status_code for r in first] == [200] * DOWNLOADS_PER_KEY
                        more = await download(keys[0], DOWNLOADS_PER_KEY)  # read nothing yet
                        assert more.status_code == 429, more.headers
                        assert "streams its most recordings" in (await more.aread()).decode()
                        assert int(more.headers["retry-after"]) >= 1
                        # the other keys fill the pool; then no key gets one
                        for key in keys[1:-1]:
                            for n in range(DOWNLOADS_PER_KEY):
                                assert (await download(key, n)).status_code == 200
                        last = await download(keys[-1], 0)
                        assert last.status_code == 503, last.headers
                        # one of the first key's ends: its slot is back, for anyone
                        await first[0].aclose()
                        assert (await download(keys[-1], 0)).status_code == 200
                        assert (await download(keys[0], DOWNLOADS_PER_KEY)).status_code == 503
                        metrics = (await http.get("/metrics")).text
                for event, n in (("key", 1), ("total", 2)):
                    name = f"recording_downloads_refused_{event}"
                    assert f'_events_total{{event="{name}"}} {n}' in metrics, metrics
                nursery.cancel_scope.cancel()
        finally:
            sig.kill()
