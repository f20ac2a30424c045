"""`firsthop bench loss`: the loss and jitter matrix, firsthop beside stock aiortc.

Each cell is one call of an aiortc caller sending a steady tone through the userspace
impairment proxy (`impair.py`: the same loss, 10 ms delay and the cell's jitter, both ways),
to firsthop's echo through the relay, and to a stock aiortc echo, in the same run. Reported
per cell and target:

* `echo_silent`: the share of 20 ms slots, in the call's steady part, in which the caller
  got no tone back (lost on the downlink, or sent without it); the link's own downlink loss
  beside it (`down_lost`) is the floor: what the echo cannot help;
* `edge_gaps`: of those, the slots the far side sent without the tone (not lost on the
  way): the part the server itself is to blame for;
* firsthop only, `agent_slots`: the share of the caller's frames the agent got (decoded, or
  repaired from FEC or by concealment; the transceiver's counts).

The caller receives through the transceiver's own jitter buffer and decoder with no
concealment (`SlotCaller`), so a slot lost on the way stays visible: aiortc's stock receive
path turns one lost packet into a run of silent frames, which would measure the caller.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from firsthop.services.bench import caller_hooks
from firsthop.services.bench.impair import ImpairedPath, Impairment
from firsthop.services.bench.measure import report, settings
from firsthop.services.bench.procs import Stack
from firsthop.services.call.caller import Caller, ToneTrack, tone_power
from firsthop.services.transceiver.media.jitter import Frame
from firsthop.services.transceiver.media.opus import OpusDecoder

FREQ = 440.0
DELAY = 0.010
DEFAULTS = {"seconds": 10.0, "losses": "0,0.01,0.05,0.10", "jitters": "0,0.030"}
QUICK = {"seconds": 3.0, "losses": "0.05", "jitters": "0.030"}
CANDIDATE = re.compile(r"^a=candidate:\S+ 1 udp \d+ (\d+\.\d+\.\d+\.\d+) (\d+) typ host", re.M)


class SlotCaller(Caller):
    """Notes which 20 ms slots (by RTP timestamp) came back with the tone (and when), which
    came without it, and which were lost on the way. It receives through the transceiver's
    own jitter buffer and decoder, with no concealment, the buffer's window held at 60 ms at
    least (as a client that plays the audio waits for reordered packets: one given up on
    would count as lost on the link)."""

    def __init__(self) -> None:
        super().__init__(ToneTrack(FREQ))
        self.loud: set[int] = set()
        self.lost: set[int] = set()  # slots whose packet the downlink lost
        self.quiet: set[int] = set()  # slots that came, without the tone
        self.loud_at: list[float] = []  # when (monotonic) each slot with the tone arrived
        self._first: int | None = None
        self._decoder = OpusDecoder()
        for transceiver in self.pc.getTransceivers():
            caller_hooks.low_latency_receiver(transceiver.receiver, self._on_frame, min_depth=3)

    def _on_frame(self, frame: Frame) -> None:
        if self._first is None:
            self._first = frame.timestamp
        slot = ((frame.timestamp - self._first) & 0xFFFFFFFF) // 960
        if frame.lost:
            self.lost.add(slot)  # silent here, but the decoder is told (as any client's
            self._decoder.conceal()  # is), or the next frame decodes out of step, quiet
        elif tone_power(self._decoder.decode(frame.data), FREQ) > 0.002:
            self.loud.add(slot)
            self.loud_at.append(time.monotonic())
        else:
            self.quiet.add(slot)

    async def track_stopped(self) -> None:
        """Stop sending (the track ends; the call stays up)."""
        self.track.stop()
        await asyncio.sleep(0)

    @property
    def sent(self) -> int:
        track = self.track
        assert isinstance(track, ToneTrack)
        return track._pts // 960 + 1

    def steady(self) -> range:
        """The slots of the steady part: 1 s after the first tone heard, to 0.5 s before
        the last."""
        if not self.loud:
            return range(0)
        return range(min(self.loud) + 50, max(self.loud) - 25 + 1)


def silent_slots(caller: SlotCaller) -> tuple[list[int], list[int], int]:
    """(silent slots, those of them the far side sent without the tone, slots counted)."""
    slots = caller.steady()
    silent = [s for s in slots if s not in caller.loud]
    return silent, [s for s in silent if s not in caller.lost], len(slots)


def _strip_candidates(sdp: str) -> str:
    return "".join(
        line + "\r\n"
        for line in sdp.splitlines()
        if line and not line.startswith(("a=candidate:", "a=end-of-candidates"))
    )


def stock_answer_via(stack: Stack, offer: str, via: str) -> tuple[str, tuple[str, int]]:
    """The stock answerer's answer to `offer`, its candidate replaced by `via` (HOST:PORT, a
    proxy in front of it), and the stock's own address (the proxy's target)."""
    answer = stack.offer_to_stock(_strip_candidates(offer))  # it learns us from checks
    found = CANDIDATE.search(answer)
    if found is None:
        raise RuntimeError("the stock answer has no IPv4 host candidate")
    lines = _strip_candidates(answer).splitlines()
    first_media = next(i for i, line in enumerate(lines) if line.startswith("m="))
    lines.insert(
        first_media + 1, f"a=candidate:1 1 udp 2130706431 {via.replace(':', ' ')} typ host"
    )
    return "\r\n".join(lines) + "\r\n", (found.group(1), int(found.group(2)))


def signal_through(stack: Stack, target: str, path: ImpairedPath) -> Callable[[str], str]:
    """Signaling for a call to `target` ("firsthop": through the relay; else the stock
    answerer) whose media crosses the proxy `path`: the answer names the proxy, and the
    proxy is pointed at the target."""
    via = f"{path.listen[0]}:{path.listen[1]}"

    def signal(offer: str) -> str:
        if target == "firsthop":
            path.target = ("127.0.0.1", stack.relay_port)
            return stack.offer_to_firsthop(offer, ingress=via)
        answer, path.target = stock_answer_via(stack, offer, via)
        return answer

    return signal


def _events(stack: Stack) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{stack.tx_api}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for name in ("frames_decoded", "frames_repaired"):
        m = re.search(rf'events_total{{event="{name}"}} (\S+)', text)
        out[name] = float(m.group(1)) if m else 0.0
    return out


async def one_call(
    stack: Stack, target: str, link: Impairment, seconds: float, seed: int
) -> dict[str, Any]:
    path = ImpairedPath(("127.0.0.1", 0), up=link, down=link, seed=seed).start()
    signal = signal_through(stack, target, path)
    before = _events(stack) if target == "firsthop" else {}
    caller = SlotCaller()
    try:
        await caller.start(lambda offer: asyncio.to_thread(signal, offer))
        await asyncio.wait_for(caller.wait_connected(), 15)
        await asyncio.sleep(seconds)
        await caller.track_stopped()
        sent = caller.sent
        if target == "firsthop":  # its hangup: a lossy link may lose the DTLS close_notify
            await asyncio.sleep(0.2)  # what is on its way arrives
            await asyncio.to_thread(stack.end_session, stack.last_session)
        await caller.close()
        await asyncio.sleep(0.3)  # its DTLS close_notify crosses the proxy
    finally:
        path.stop()
    counts = path.counts
    down_lost = counts["down_lost"] / max(1, counts["down"] + counts["down_lost"])
    silent, edge_gaps, slots = silent_slots(caller)
    row: dict[str, Any] = {
        "target": target,
        "loss": link.loss,
        "jitter_ms": round(link.jitter * 1000),
        "slots": slots,
        "echo_silent": round(len(silent) / slots, 4) if slots else None,
        "edge_gaps": round(len(edge_gaps) / slots, 4) if slots else None,
        "down_lost": round(down_lost, 4),
        "up_lost": round(counts["up_lost"] / max(1, counts["up"] + counts["up_lost"]), 4),
    }
    if target == "firsthop":
        deadline = time.monotonic() + 10
        after = _events(stack)
        while after["frames_decoded"] == before["frames_decoded"] and time.monotonic() < deadline:
            await asyncio.sleep(0.2)  # the transceiver adds a call up once it is torn down
            after = _events(stack)
        got = sum(after[k] - before[k] for k in after)
        row["agent_slots"] = round(got / sent, 4)
        row["repaired"] = int(after["frames_repaired"] - before["frames_repaired"])
    return row


def _floats(text: str) -> list[float]:
    return [float(x) for x in str(text).split(",") if x.strip()]


def run(*, seconds: float, losses: list[float], jitters: list[float]) -> dict[str, Any]:
    stack = Stack().start(stock=True)
    rows: list[dict[str, Any]] = []
    try:
        seed = 1
        for loss in losses:
            for jitter in jitters:
                link = Impairment(loss=loss, delay=DELAY, jitter=jitter)
                for target in ("firsthop", "stock"):
                    rows.append(asyncio.run(one_call(stack, target, link, seconds, seed)))
                seed += 1
    finally:
        stack.stop()
    return {"seconds": seconds, "delay_ms": DELAY * 1000, "rows": rows}


def render(result: dict[str, Any]) -> str:
    lines = [
        f"loss x jitter, {result['seconds']:.0f} s calls, 10 ms delay + jitter both ways; "
        "slots of 20 ms in the echo's steady part",
        f"  {'loss':>5} {'jitter':>7} {'target':<9}{'echo silent':>12}{'edge gaps':>10}"
        f"{'down lost':>10}{'agent slots':>12}",
    ]
    for row in result["rows"]:
        agent = row.get("agent_slots")
        lines.append(
            f"  {row['loss']:>5.0%} {row['jitter_ms']:>5} ms {row['target']:<9}"
            f"{row['echo_silent']:>12.1%}{row['edge_gaps']:>10.1%}{row['down_lost']:>10.1%}"
            f"{'-' if agent is None else f'{agent:.1%}':>12}"
        )
    lines.append(
        "target: agent slots >= 99 %; echo silent <= the downlink's own loss (edge gaps ~ 0)"
    )
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    chosen = settings(args, QUICK if args.quick else DEFAULTS)
    return report(
        "loss",
        args,
        lambda: run(
            seconds=float(chosen["seconds"]),
            losses=_floats(chosen["losses"]),
            jitters=_floats(chosen["jitters"]),
        ),
        render,
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("loss", help="the loss x jitter matrix: firsthop vs stock aiortc")
    p.add_argument("--seconds", type=float, help="seconds per call")
    p.add_argument("--losses", help="loss rates, comma-separated (default 0,0.01,0.05,0.10)")
    p.add_argument("--jitters", help="jitters in seconds, comma-separated (default 0,0.030)")
    p.add_argument("--quick", action="store_true", help="one 3 s cell: 5 %% loss, 30 ms jitter")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_main)
