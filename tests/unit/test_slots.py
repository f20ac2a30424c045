"""`Slots` (services/signaling/ratelimit.py): what is in progress, capped in all and per key;
`held_while` gives a streamed body's slot back once, however the stream ends."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator

import trio

from firsthop.services.signaling.ratelimit import Slots


async def three() -> AsyncIterator[bytes]:
    for chunk in (b"a", b"b", b"c"):
        yield chunk


def test_the_caps_in_all_and_per_key() -> None:
    slots = Slots(total=3, per_key=2)
    assert [slots.take("k"), slots.take("k"), slots.take("k")] == [None, None, "key"]
    assert slots.take("j") is None and slots.take("i") == "total"
    slots.give_back("k")
    assert slots.take("i") is None and slots.in_use == 3


async def test_a_streamed_body_gives_its_slot_back_once_however_it_ends() -> None:
    slots = Slots(total=4, per_key=4)

    async def read_all() -> None:
        slots.take("k")
        assert [c async for c in slots.held_while("k", three())] == [b"a", b"b", b"c"]

    await read_all()
    assert slots.in_use == 0
    slots.take("k")
    body = slots.held_while("k", three())
    assert await body.__anext__() == b"a"
    await body.aclose()  # (Quart closes a body whose client went away mid-stream)
    assert slots.in_use == 0
    # A client gone before the body's first step: an async generator never started runs no
    # `finally`, so the slot had been held for good; dropped, it is given back.
    slots.take("k")
    body = slots.held_while("k", three())
    del body
    gc.collect()
    assert slots.in_use == 0
    await trio.lowlevel.checkpoint()
    assert slots.take("k") is None and slots.in_use == 1  # (once each: nothing given twice)
