"""An aiortc caller for the tests across network namespaces, run inside one
(`ip netns exec NS python tests/netns_caller.py`): it plays a steady tone and notes, per
20 ms slot of the echo (by RTP timestamp, `SlotCaller`), whether the tone came back, and
when (CLOCK_MONOTONIC, shared by every namespace of the host).

It talks to the test in JSON lines: it writes `{"offer": SDP}`, reads `{"answer": SDP}`,
writes `{"connected": T}`; then answers each command it reads: `{"status": true}` with
`{"loud": N, "last_loud": T}`, and `{"stop": true}` with its report
(`{"report": {"loud": [slot, ...], "lost": [...], "quiet": [...], "loud_times": [T, ...]}}`)
before it hangs up and exits.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from firsthop.services.bench.loss import SlotCaller


def say(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def read() -> dict[str, Any]:
    line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    if not line:
        raise SystemExit("netns_caller: the test closed stdin")
    message: dict[str, Any] = json.loads(line)
    return message


async def main() -> None:
    caller = SlotCaller()

    async def signal(offer: str) -> str:
        say({"offer": offer})
        return str((await read())["answer"])

    try:
        await caller.start(signal)
        await asyncio.wait_for(caller.wait_connected(), 15)
        say({"connected": time.monotonic()})
        while True:
            command = await read()
            if command.get("stop"):
                break
            last = caller.loud_at[-1] if caller.loud_at else None
            say({"loud": len(caller.loud), "last_loud": last})
        report = {
            "loud": sorted(caller.loud),
            "lost": sorted(caller.lost),
            "quiet": sorted(caller.quiet),
            "loud_times": caller.loud_at,
        }
        say({"report": report})
    finally:
        await caller.close()


if __name__ == "__main__":
    asyncio.run(main())
