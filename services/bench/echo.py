"""`firsthop bench echo`: the delay the server side adds, and mouth-to-ear on loopback.

Two numbers, firsthop next to stock aiortc in the same run, targets printed, never asserted:

* residence: how long the transceiver holds a packet it echoes — the echoed packet leaving
  its media socket minus the packet it echoes arriving there. Measured without touching the
  transceiver by a tap, a tiny UDP forwarder in its own process (`procs.tap`, run as
  `python -m firsthop.services.bench.procs tap TX_PORT`) in front of the media socket: the
  transceiver runs with `--advertise-media <tap>` so route tokens send the relay's traffic
  through the tap, and direct callers get the tap's other port as their ingress. The tap
  stamps every datagram with the kernel's receive time (SO_TIMESTAMPNS) both ways and keeps
  (time, direction, client, size) of RTP packets;
* mouth-to-ear: caller -> (relay) -> transceiver -> echo agent -> caller, from the caller's
  side: the first frame of a tone burst leaving the caller's track, to the burst's first
  sample played back (aiortc has no playout clock: a frame plays from its arrival). The first
  frame whose tone power crosses a threshold is reported too; it is up to a frame later.

Strategy: the caller sends short tone bursts separated by silence. Opus codes digital
silence in 3 bytes and a tone in ~290, so the tap matches per burst the first large packet
in with the first large packet out (the sizes are in the report, to check that this holds).
Targets, one call at a time, interleaved round by round: firsthop through the relay, firsthop
direct (`--accept-direct`), both through the tap so that their difference is the relay's
alone, direct without the tap (what the tap itself costs), stock aiortc (reference), and
`twilio`: through the relay like `relay`, but the call's agent is a Twilio Media Streams echo
bot (`firsthop agent --kind twilio-echo`, dialled as `twilio+ws://`): its difference from
`relay` is what the Media Streams bridge adds (8 kHz resampling both ways, μ-law, base64 JSON).

Invariants: every process started here is stopped before `run` returns; nothing is pinned
(this is about latency, and the scheduler places it best on a shared machine).
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from aiortc import MediaStreamTrack

from firsthop.services.bench.measure import BenchError, LineTool, report, settings
from firsthop.services.bench.procs import Stack
from firsthop.services.call.caller import FRAME_SAMPLES, SAMPLE_RATE, Caller, ToneTrack, tone_power
from firsthop.services.launch import HOST

BIG = 120  # bytes of SRTP: a tone packet is ~320, a silence packet ~40
DECIMATE = 4  # Goertzel on every 4th sample: 12 kHz is plenty for tones below 5.5 kHz
HEARD = 0.002  # tone power of a frame that carries the tone (a full 0.3 tone is ~0.0225)
LOUD_SAMPLE = 1000  # |PCM16| above this is the tone (amplitude ~9800); silence decodes to ~0
FREQ = 600.0
TARGET_RESIDENCE_P50_MS = 30.0
TARGET_M2E_MS = 120.0
TARGET_RELAY_OVER_DIRECT_MS = 2.0
TARGETS = ("relay", "direct", "direct-notap", "stock", "twilio")
TAPPED = ("relay", "direct", "twilio")  # targets whose residence the tap measures
DEFAULTS: dict[str, Any] = {"bursts": 8, "rounds": 3, "period": 0.8, "burst": 0.2}
QUICK: dict[str, Any] = {"bursts": 4, "rounds": 1, "period": 0.6, "burst": 0.2}
SETTLE = 1.0  # seconds between connected and the first burst


# -- audio probes (`bench sessions` uses them too) --------------------------------------------


def decimated(pcm: bytes) -> bytes:
    samples = array.array("h")
    samples.frombytes(pcm[: len(pcm) // 2 * 2])
    return samples[::DECIMATE].tobytes()


def frame_power(pcm: bytes, freq: float) -> float:
    """Tone power of `freq` in PCM16 mono 48 kHz, on every DECIMATE-th sample (cheap)."""
    return tone_power(decimated(pcm), freq, SAMPLE_RATE // DECIMATE)


class RecordingCaller(Caller):
    """A Caller that keeps (arrival time, PCM16 mono) of each frame while `recording`."""

    def __init__(self, track: MediaStreamTrack | None = None) -> None:
        super().__init__(track)
        self.recording = False
        self.frames: list[tuple[float, bytes]] = []

    def on_frame(self, arrived: float, pcm: bytes) -> None:
        if self.recording:
            self.frames.append((arrived, pcm))


# -- the caller: tone bursts out, frames in -------------------------------------------------


class BurstTrack(ToneTrack):
    """Silence until `arm()`, then `bursts` tone bursts of `burst_frames` every
    `period_frames` 20 ms frames; `onsets` are the times each burst's first frame left.

    Before each burst the track's clock slips by a fraction of a frame (0-20 ms, evenly
    spread): the transceiver plays out on its own 20 ms clock, and where a caller's packets
    land between its ticks decides how long they wait. aiortc starts both clocks at the end
    of the DTLS handshake, so without the slip every burst of every call would see the same
    phase; a real microphone's clock has no relation to the server's.
    """

    def __init__(self, freq: float, *, bursts: int, burst_frames: int, period_frames: int):
        super().__init__(freq)
        self.bursts, self.burst_frames, self.period_frames = bursts, burst_frames, period_frames
        self.origin: int | None = None
        self.onsets: list[float] = []
        self.slips: list[float] = []
        self._offset = 0.0  # the clock's total slip, modulo a frame
        self._onset = False

    def arm(self) -> None:
        self.origin = self._pts // FRAME_SAMPLES + 2

    def _burst_phase(self, index: int) -> tuple[int, int] | None:
        if self.origin is None or index < self.origin:
            return None
        burst, phase = divmod(index - self.origin, self.period_frames)
        return (burst, phase) if burst < self.bursts and phase < self.burst_frames else None

    def _samples(self, start: int) -> bytes:
        where = self._burst_phase(start // FRAME_SAMPLES)
        if where is None:
            return bytes(FRAME_SAMPLES * 2)
        self._onset = where[1] == 0
        return super()._samples(start)

    async def recv(self) -> Any:
        if self._start is not None:
            where = self._burst_phase(self._pts // FRAME_SAMPLES + 1)
            if where is not None and where[1] == 0:
                # burst k meets the server's ticks at phase frac(k / golden ratio) of a frame
                phase = 0.02 * ((where[0] * 0.618034) % 1.0)
                slip = (phase - self._offset) % 0.02
                self._offset = phase
                self._start += slip
                self.slips.append(round(slip * 1000, 2))
        frame = await super().recv()
        if self._onset:
            self._onset = False
            self.onsets.append(time.monotonic())
        return frame


async def one_call(
    answer: Callable[[str], str], *, bursts: int, burst_s: float, period_s: float
) -> tuple[list[float], list[tuple[float, bytes]], float, list[float]]:
    """One call: connect, settle, play the bursts; (onsets, frames heard, setup seconds,
    clock slips in ms)."""
    track = BurstTrack(
        FREQ,
        bursts=bursts,
        burst_frames=round(burst_s / 0.02),
        period_frames=round(period_s / 0.02),
    )
    caller = RecordingCaller(track)

    async def signal(offer: str) -> str:
        return await asyncio.to_thread(answer, offer)

    try:
        await caller.start(signal)
        setup = await asyncio.wait_for(caller.wait_connected(), 15)
        await asyncio.sleep(SETTLE)
        caller.recording = True
        track.arm()
        await asyncio.sleep(bursts * period_s + 0.3)
        caller.recording = False
    finally:
        await caller.close()
    return track.onsets, caller.frames, setup, track.slips


# -- analysis ----------------------------------------------------------------------------


def _first_loud_sample(pcm: bytes) -> int | None:
    samples = array.array("h")
    samples.frombytes(pcm)
    return next((i for i, x in enumerate(samples) if abs(x) > LOUD_SAMPLE), None)


def mouth_to_ear(
    onsets: list[float], frames: list[tuple[float, bytes]], period_s: float
) -> tuple[list[float | None], list[float | None]]:
    """Per burst, ms from its first frame leaving the track to (a) the tone's first sample
    being played back, taking a frame to play from its arrival, and (b) the arrival of the
    first frame whose tone power crosses HEARD. (b) is coarser: two Opus passes delay the
    onset by 2 x 6.5 ms into a frame, and that frame's power may fall short of HEARD."""
    onset_ms: list[float | None] = []
    frame_ms: list[float | None] = []
    for onset in onsets:
        hit = next(
            (
                i
                for i, (at, pcm) in enumerate(frames)
                if onset <= at < onset + 0.9 * period_s and frame_power(pcm, FREQ) > HEARD
            ),
            None,
        )
        if hit is None:
            onset_ms.append(None)
            frame_ms.append(None)
            continue
        frame_ms.append(round((frames[hit][0] - onset) * 1000, 2))
        ear = frames[hit][0]
        for at, pcm in frames[max(0, hit - 1) : hit + 1]:
            first = _first_loud_sample(pcm) if at >= onset else None
            if first is not None:
                ear = at + first / SAMPLE_RATE
                break
        onset_ms.append(round((ear - onset) * 1000, 2))
    return onset_ms, frame_ms


def _starts(packets: list[tuple[int, int]]) -> list[int]:
    """Times of the first large packet after a small one: a burst beginning."""
    return [
        t
        for (t, size), (_, before) in zip(packets[1:], packets, strict=False)
        if size >= BIG and before < BIG
    ]


def residence(records: list[Any], period_s: float) -> dict[str, Any]:
    """Match each burst's first large packet in with the first large packet out."""
    flows: dict[str, dict[str, list[tuple[int, int]]]] = {}
    for stamp, way, client, size in records:
        flows.setdefault(client, {"up": [], "down": []})[way].append((stamp, size))
    found: list[tuple[int, float]] = []
    sizes: dict[str, list[int]] = {"up_small": [], "up_big": [], "down_small": [], "down_big": []}
    for ways in flows.values():
        outs = _starts(ways["down"])
        for t_in in _starts(ways["up"]):
            t_out = next((t for t in outs if t_in < t < t_in + period_s * 5e8), None)
            if t_out is not None:
                found.append((t_in, round((t_out - t_in) / 1e6, 3)))
        for way, packets in ways.items():
            for _, size in packets:
                sizes[f"{way}_{'big' if size >= BIG else 'small'}"].append(size)
    return {
        "matched": found,  # (arrival ns, residence ms) per burst the tap saw both ways
        "packet_bytes_median": {k: statistics.median(v) if v else None for k, v in sizes.items()},
        "packets": {k: len(v) for k, v in sizes.items()},
    }


def burst_of(matched: list[tuple[int, float]], at: int, period_s: float) -> float | None:
    """The residence of the tap's burst nearest the caller's onset `at` (ns, the tap's
    clock), if one is within half a period. The onset is converted from the caller's
    monotonic clock through the wall clock once, after the call; nearest-within-half-a-period
    rather than "just after" keeps the match when that conversion is off by a few ms (a wall
    clock stepped mid-call), in either direction."""
    best = min(matched, key=lambda m: abs(m[0] - at), default=None)
    if best is None or abs(best[0] - at) >= period_s * 5e8:
        return None
    return best[1]


def residences(
    matched: list[tuple[int, float]], onsets: list[int], period_s: float
) -> list[float | None]:
    """Each burst's residence, in the caller's order. When the tap saw as many bursts as the
    caller sent, the n-th is the n-th (no clock between them to trust: the tap stamps in
    CLOCK_REALTIME, which a time step mid-call moves); else each onset's nearest
    (`burst_of`)."""
    if matched and len(matched) == len(onsets):
        return [r for _, r in sorted(matched)]
    return [burst_of(matched, at, period_s) for at in onsets]


def _pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _stats(values: list[float]) -> dict[str, Any]:
    return {
        "p50": _pct(values, 0.5),
        "p95": _pct(values, 0.95),
        "min": min(values) if values else None,
        "max": max(values) if values else None,
        "n": len(values),
    }


# -- the run -----------------------------------------------------------------------------


def run(*, bursts: int, rounds: int, period_s: float, burst_s: float) -> dict[str, Any]:
    stack = Stack()
    log = tempfile.TemporaryFile()  # the tap's stderr
    argv = [sys.executable, "-m", "firsthop.services.bench.procs", "tap"]
    tap_proc = LineTool("tap", argv, log)
    rows: list[dict[str, Any]] = []
    try:
        ready = tap_proc.line(timeout=20).split()
        if ready[0] != "ready":
            raise BenchError(f"tap: {ready}")
        tap_relay, tap_direct = int(ready[1]), int(ready[2])
        stack.start(
            stock=True, tx_args=("--accept-direct", "--advertise-media", f"{HOST}:{tap_relay}")
        )
        if tap_proc.ask(f"to {stack.tx_media}") != "ok":
            raise BenchError("tap: no answer to 'to'")
        bot = f"twilio+ws://{HOST}:{stack.spawn_agent('twilio-echo')}/"
        answers: dict[str, Callable[[str], str]] = {
            "relay": stack.offer_to_firsthop,
            "direct": lambda o: stack.offer_to_firsthop(o, ingress=f"{HOST}:{tap_direct}"),
            "direct-notap": lambda o: stack.offer_to_firsthop(o, direct=True),
            "stock": stack.offer_to_stock,
            "twilio": lambda o: stack.offer_to_firsthop(o, agent_url=bot),
        }
        for rnd in range(1, rounds + 1):
            for target in TARGETS:
                tap_proc.ask("dump", timeout=10)  # forget what came before
                onsets, frames, setup, slips = asyncio.run(
                    one_call(answers[target], bursts=bursts, burst_s=burst_s, period_s=period_s)
                )
                records = json.loads(tap_proc.ask("dump", timeout=10))
                clock = time.time_ns() - time.monotonic_ns()  # the tap stamps in CLOCK_REALTIME
                m2e, m2e_frame = mouth_to_ear(onsets, frames, period_s)
                row: dict[str, Any] = {
                    "target": target,
                    "round": rnd,
                    "setup_ms": round(setup * 1000, 1),
                    "bursts_sent": len(onsets),
                    "bursts_heard": sum(v is not None for v in m2e),
                    "mouth_to_ear_ms": m2e,
                    "first_loud_frame_ms": m2e_frame,
                    "slips_ms": slips,
                }
                if target in TAPPED:
                    row.update(residence(records, period_s))
                    # Per burst, the time outside the server: mouth-to-ear less residence. It
                    # leaves out the 0-20 ms wait for the server's next output tick.
                    matched = row.pop("matched")
                    row["tap_bursts"] = len(matched)
                    res = residences(matched, [round(o * 1e9) + clock for o in onsets], period_s)
                    row["burst_residence_ms"] = res
                    row["outside_ms"] = [
                        round(m - r, 2) if m is not None and r is not None else None
                        for m, r in zip(m2e, res, strict=True)
                    ]
                rows.append(row)
    except BenchError as exc:
        log.seek(0)
        tail = log.read().decode(errors="replace")[-2000:]
        raise BenchError(f"{exc}\n--- the tap's stderr ---\n{tail}") from exc
    finally:
        tap_proc.stop()
        stack.stop()
        log.close()
    config = {
        "bursts": bursts,
        "rounds": rounds,
        "period_s": period_s,
        "burst_s": burst_s,
        "freq": FREQ,
        "big_packet_bytes": BIG,
    }
    return {"config": config, "rows": rows, "summary": summarize(rows)}


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def gather(target: str, key: str) -> list[float]:
        return [v for r in rows if r["target"] == target for v in r.get(key, []) if v is not None]

    out: dict[str, Any] = {}
    for target in TARGETS:
        mine = [r for r in rows if r["target"] == target]
        out[target] = {
            "mouth_to_ear_ms": _stats(gather(target, "mouth_to_ear_ms")),
            "first_loud_frame_ms": _stats(gather(target, "first_loud_frame_ms")),
            "bursts_sent": sum(r["bursts_sent"] for r in mine),
            "bursts_heard": sum(r["bursts_heard"] for r in mine),
        }
        if target in TAPPED:
            out[target]["residence_ms"] = _stats(gather(target, "burst_residence_ms"))
            out[target]["outside_ms"] = _stats(gather(target, "outside_ms"))
    relay, direct, stock = out["relay"], out["direct"], out["stock"]

    def diff(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(a - b, 2)

    res_p50 = relay["residence_ms"]["p50"]
    m2e_p50 = relay["mouth_to_ear_ms"]["p50"]
    over_m2e = diff(m2e_p50, direct["mouth_to_ear_ms"]["p50"])
    over_outside = diff(relay["outside_ms"]["p50"], direct["outside_ms"]["p50"])
    out["targets"] = {
        "residence_p50_ms": {
            "value": res_p50,
            "target": TARGET_RESIDENCE_P50_MS,
            "met": res_p50 is not None and res_p50 <= TARGET_RESIDENCE_P50_MS,
        },
        "mouth_to_ear_p50_ms": {
            "value": m2e_p50,
            "stock": stock["mouth_to_ear_ms"]["p50"],
            "target": TARGET_M2E_MS,
            "met": m2e_p50 is not None and m2e_p50 <= TARGET_M2E_MS,
        },
        "relay_over_direct_ms": {
            "mouth_to_ear_p50": over_m2e,
            "outside_p50": over_outside,
            "target": TARGET_RELAY_OVER_DIRECT_MS,
            "met": over_outside is not None and over_outside <= TARGET_RELAY_OVER_DIRECT_MS,
        },
        "tap_cost_ms": diff(
            direct["mouth_to_ear_ms"]["p50"], out["direct-notap"]["mouth_to_ear_ms"]["p50"]
        ),
        # What a Media Streams bot costs next to a native agent, same relay path, same run.
        "twilio_over_native_ms": {
            "mouth_to_ear_p50": diff(
                out["twilio"]["mouth_to_ear_ms"]["p50"], relay["mouth_to_ear_ms"]["p50"]
            ),
            "residence_p50": diff(out["twilio"]["residence_ms"]["p50"], res_p50),
        },
    }
    return out


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def render(result: dict[str, Any]) -> str:
    cfg, summary = result["config"], result["summary"]
    lines = [
        f"firsthop bench echo: {cfg['bursts']} bursts of {cfg['burst_s'] * 1000:.0f} ms tone "
        f"every {cfg['period_s'] * 1000:.0f} ms per call, {cfg['rounds']} interleaved round(s), "
        "one call at a time, aiortc caller, echo agent",
        "mouth-to-ear: burst's first frame leaving the caller's track -> its first sample played "
        "back (a frame plays from its arrival); frame: -> first frame back over the power "
        "threshold",
        "residence (tap): first tone packet into the transceiver -> first tone packet out; "
        "outside: mouth-to-ear - residence, per burst; the caller's clock slips 0-20 ms before "
        "each burst so bursts meet the server's 20 ms output tick at spread phases",
        "",
        f"{'path':<14}{'bursts':>8}  {'mouth-to-ear ms p50':>20}{'p95':>7}{'min':>7}{'max':>7}"
        f"{'(frame p50)':>12}  {'residence p50':>14}{'p95':>7}{'min':>7}"
        f"  {'outside p50':>12}{'p95':>7}",
    ]
    for target in TARGETS:
        s = summary[target]
        m, r, o = s["mouth_to_ear_ms"], s.get("residence_ms"), s.get("outside_ms")
        frame = s["first_loud_frame_ms"]["p50"]
        lines.append(
            f"{target:<14}{s['bursts_heard']:>4}/{s['bursts_sent']:<3}  {_fmt(m['p50']):>20}"
            f"{_fmt(m['p95']):>7}{_fmt(m['min']):>7}{_fmt(m['max']):>7}{_fmt(frame):>12}"
            f"  {_fmt(r['p50'] if r else None):>14}{_fmt(r['p95'] if r else None):>7}"
            f"{_fmt(r['min'] if r else None):>7}"
            f"  {_fmt(o['p50'] if o else None):>12}{_fmt(o['p95'] if o else None):>7}"
        )
    sizes = [r["packet_bytes_median"] for r in result["rows"] if "packet_bytes_median" in r]
    if sizes:
        first = sizes[0]
        lines.append(
            f"SRTP sizes (median bytes, first tapped call): in {first['up_small']} silent / "
            f"{first['up_big']} tone, out {first['down_small']} silent / {first['down_big']} "
            f"tone (split at {cfg['big_packet_bytes']})"
        )
    t = summary["targets"]
    verdict = {True: "met", False: "MISSED"}
    res, m2e, over = t["residence_p50_ms"], t["mouth_to_ear_p50_ms"], t["relay_over_direct_ms"]
    lines += [
        "",
        f"residence p50 {_fmt(res['value'])} ms (target <= {res['target']:.0f}): "
        f"{verdict[res['met']]}",
        f"mouth-to-ear p50 via relay {_fmt(m2e['value'])} ms, stock {_fmt(m2e['stock'])} ms "
        f"(target <= {m2e['target']:.0f}): {verdict[m2e['met']]}",
        f"relay over direct: {_fmt(over['outside_p50'], '.2f')} ms outside the server "
        f"({_fmt(over['mouth_to_ear_p50'], '.1f')} ms in mouth-to-ear p50, which carries the "
        f"0-20 ms output tick phase) (target <= {over['target']:.0f}): {verdict[over['met']]}",
        f"the tap itself: direct through it - direct without it = "
        f"{_fmt(t['tap_cost_ms'], '.1f')} ms (mouth-to-ear p50)",
        f"Media Streams bot (twilio+ws://) over the native agent, both via the relay: "
        f"{_fmt(t['twilio_over_native_ms']['mouth_to_ear_p50'])} ms mouth-to-ear p50, "
        f"{_fmt(t['twilio_over_native_ms']['residence_p50'])} ms residence p50",
    ]
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    chosen = settings(args, QUICK if args.quick else DEFAULTS)
    return report(
        "echo",
        args,
        lambda: run(
            bursts=int(chosen["bursts"]),
            rounds=int(chosen["rounds"]),
            period_s=float(chosen["period"]),
            burst_s=float(chosen["burst"]),
        ),
        render,
    )


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "echo",
        help="server residence and mouth-to-ear vs stock aiortc; a Media Streams bot vs native",
    )
    p.add_argument("--bursts", type=int, help="tone bursts per call")
    p.add_argument("--rounds", type=int, help="interleaved rounds of the paths")
    p.add_argument("--period", type=float, help="seconds from one burst to the next")
    p.add_argument("--burst", type=float, help="seconds of tone per burst")
    p.add_argument("--quick", action="store_true", help="4 bursts per call, 1 round")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_main)
