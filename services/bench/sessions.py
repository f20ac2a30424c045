"""`firsthop bench sessions`: server CPU per echoed call and audio loss, firsthop next to stock.

N aiortc callers, each sending a tone at its own frequency, call the same echo service
three ways in the same run: firsthop (caller -> relay -> transceiver -> echo agent over
WebSocket); the reference, stock aiortc (`services/bench/stock.py`: one RTCPeerConnection
and UDP socket per call, plain asyncio, echoing the decoded frames back through aiortc's
encoder); and `stock-mono`, the same answerer echoing each frame as a fresh mono frame, as the
transceiver does (`stock.py --mono` says why that halves stock's cost). Rounds alternate
between the three so machine noise hits all alike; medians over rounds are reported, and
firsthop's cost with and without its echo agent and relay processes.

Strategy:

* callers run in separate worker processes (`python -m firsthop.services.bench.sessions
  worker`, each many callers on one asyncio loop), spoken to in JSON lines on stdin/stdout;
* on two or more CPUs the services are pinned to the first allowed CPU and the bench with its
  callers to the last (children inherit the affinity they are started with), so the callers'
  own encode/decode does not run on the core being measured;
* CPU is every thread's run time from /proc/PID/task/*/schedstat (`bench.relay.cpu_sample`)
  over the steady window that starts `warmup` seconds after the last call connected; cost per
  session = CPU % of one core / calls, "sessions per core" = 100 / that;
* the codec floor (`codec_floor`: decode + encode of a call's frames in a tight loop) and the
  media core alone (`media_core_cost`: the same frames through `media/core.py`, SRTP to SRTP,
  no I/O), on the services' core before and after the rounds: what the transceiver costs
  over the core is its I/O (sockets, the loop, the agent link);
* loss per call: of the 20 ms frames the window holds, the share that did not come back
  carrying the caller's own tone (the transceiver plays silence when the echo does not arrive
  in time, so counting frames alone would miss loss), judged per frame by a Goertzel power on
  a 4x decimated frame; and whether the caller's own frequency dominates what it heard.

`--knee` (`knee.py`) asks another question: the most concurrent calls one transceiver holds
on one pinned core (the transceiver alone on the first CPU, relay, agent and callers on the
last), doubling the calls from `--calls` until loss passes 0.5 % or the transceiver's
residence p99 passes 40 ms, then bisecting; with cheaper callers (`knee_caller.py`), a
kernel-stamped capture for residence (`capture.py`) and the transceiver's RSS per session.

Invariants: every process started here is stopped before `run` returns; the server side is
idle (no live sessions) before each round starts, or the round says how many were left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from typing import IO, Any

from firsthop.services.bench.echo import HEARD, RecordingCaller, frame_power
from firsthop.services.bench.measure import (
    BenchError,
    LineTool,
    children_of,
    cpu_sample,
    report,
    settings,
)
from firsthop.services.bench.procs import Stack
from firsthop.services.call.caller import Caller, ToneTrack

FRAME_S = 0.02
SETUP_CONCURRENCY = 8  # offers in flight per worker (the relay limits pending flows per IP)
# The media core's targets (issue #21), x stock aiortc with no loss: the transceiver alone,
# and the whole path; and the transceiver's CPU per call at most this many times the floor.
TARGET_RATIOS = {"transceiver": 6.0, "transceiver+agent+relay": 4.0}
FLOOR_TARGET = 2.5
MAX_LOSS_PCT = 0.5  # of a call's frames: past it a step of the knee fails (knee.py)
# A reference whose calls lost more than the knee's bound, or whose CPU filled its core, did
# not keep up: its sessions a core (calls over the CPU it could get) overstates what it holds,
# so a ratio over it is a lower bound, and the target's verdict is no verdict.
SATURATED_LOSS_PCT = MAX_LOSS_PCT  # (the knee's bound)
SATURATED_CPU_PCT = 95.0
FLOOR_SECONDS = 1.5  # CPU time the codec floor is measured over, each time
DEFAULTS: dict[str, Any] = {"calls": "10", "seconds": 10.0, "rounds": 2, "warmup": 2.0}
QUICK: dict[str, Any] = {"calls": "3", "seconds": 2.0, "rounds": 1, "warmup": 0.5}
TARGETS = ("firsthop", "stock", "stock-mono")
REFERENCES = ("stock", "stock-mono")
COSTS: dict[str, dict[str, tuple[str, ...]]] = {  # the server's cost, by target
    "firsthop": {
        "transceiver": ("transceiver",),
        "transceiver+agent": ("transceiver", "agent"),
        "transceiver+agent+relay": ("transceiver", "agent", "relay"),
    },
    "stock": {"stock": ("stock",)},
    "stock-mono": {"stock-mono": ("stock-mono",)},
}


def frequencies(n: int) -> list[float]:
    """n distinct tone frequencies, 300 Hz up to at most ~5.5 kHz."""
    step = min(60.0, 5200.0 / max(1, n))
    return [round(300.0 + step * i, 1) for i in range(n)]


def analyze(
    frames: list[tuple[float, bytes]],
    freq: float,
    started: float,
    window_s: float,
    freqs: list[float],
) -> dict[str, Any]:
    """Loss and hearing of one call over the window [started, started + window_s]."""
    heard_flags = [frame_power(pcm, freq) > HEARD for _, pcm in frames]
    heard = sum(heard_flags)
    # Lost: frames that came without the tone (the transceiver plays silence when the echo
    # misses its tick), and frames that never came: whole 20 ms slots in the window, less one
    # for the frames cut at its two edges, that no frame filled.
    expected = max(1, int(window_s / FRAME_S) - 1)
    lost = len(frames) - heard + max(0, expected - len(frames))
    # Where it went missing: runs of frames without the tone, and arrival gaps (> 3 frames).
    silent: list[list[float]] = []
    previous = True
    for (at, _), ok in zip(frames, heard_flags, strict=True):
        if not ok:
            if previous:
                silent.append([round(at - started, 3), 0])
            silent[-1][1] += 1
        previous = ok
    gaps = [
        [round(a - started, 3), round(b - a, 3)]
        for (a, _), (b, _) in zip(frames, frames[1:], strict=False)
        if b - a > 3 * FRAME_S
    ]
    middle = len(frames) // 2
    excerpt = b"".join(pcm for _, pcm in frames[middle : middle + 10])
    powers = {f: frame_power(excerpt, f) for f in freqs} if excerpt else {}
    dominant = max(powers, key=lambda f: powers[f]) if powers else None
    return {
        "freq": freq,
        "frames": len(frames),
        "heard_frames": heard,
        "expected_frames": expected,
        "loss_pct": round(100.0 * lost / max(expected, len(frames)), 2),
        "dominant": dominant,
        "heard_own": dominant == freq and powers[freq] > HEARD,
        "silent_runs": silent[:10],  # [seconds into window, frames]
        "arrival_gaps": gaps[:10],  # [seconds into window, gap s]
    }


# -- the caller worker process ----------------------------------------------------------------


def emit(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def connect_all(
    callers: Sequence[Caller], answer: Callable[[str], str], connect_timeout: float
) -> list[BaseException | None]:
    """Set every caller up, SETUP_CONCURRENCY at a time, and tell the bench how many
    connected; each one's outcome (what it failed with, or None)."""
    gate = asyncio.Semaphore(SETUP_CONCURRENCY)

    async def signal(offer: str) -> str:
        return await asyncio.to_thread(answer, offer)

    async def setup(caller: Caller) -> None:
        async with gate:
            await caller.start(signal)
            await asyncio.wait_for(caller.wait_connected(), connect_timeout)

    done = await asyncio.gather(*(setup(c) for c in callers), return_exceptions=True)
    errors = [repr(e) for e in done if isinstance(e, BaseException)]
    emit({"type": "connected", "connected": len(callers) - len(errors), "errors": errors})
    return [e if isinstance(e, BaseException) else None for e in done]


async def _worker(config: dict[str, Any], lines: asyncio.StreamReader) -> None:
    stack = Stack(**config["ports"])
    answer = stack.answerer(config["target"], config["stock_port"])
    freqs: list[float] = config["freqs"]
    callers = [RecordingCaller(ToneTrack(f)) for f in freqs]
    done = await connect_all(callers, answer, config["connect_timeout"])
    try:
        await lines.readline()  # "go"
        started = time.monotonic()
        for caller in callers:
            caller.recording = True
        await lines.readline()  # "stop"
        window = time.monotonic() - started
        for caller in callers:
            caller.recording = False
        calls = [
            {**analyze(c.frames, f, started, window, config["all_freqs"]), "connected": not e}
            for c, f, e in zip(callers, freqs, done, strict=True)
        ]
        emit({"type": "result", "window_s": round(window, 3), "calls": calls})
    finally:
        await asyncio.gather(*(c.close() for c in callers), return_exceptions=True)
    emit({"type": "closed"})


Worker = Callable[[dict[str, Any], asyncio.StreamReader], Awaitable[None]]


async def worker_main(worker: Worker = _worker) -> None:
    """A caller worker process: its config is the first line on stdin, then `worker` runs."""
    loop = asyncio.get_running_loop()
    lines = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(lines), sys.stdin)
    config = json.loads(await lines.readline())
    await worker(config, lines)


# -- one round ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Ref:
    """A stock answerer process: where to send offers, and whose CPU to count."""

    port: int
    pid: int


def _server_pids(stack: Stack, target: str, refs: dict[str, Ref]) -> dict[str, list[int]]:
    if target in refs:
        return {target: [refs[target].pid]}
    return {
        "transceiver": [stack.tx_pid],
        "agent": [stack.agent_pid],
        "relay": [stack.relay_pid, *children_of(stack.relay_pid)],
    }


def _sample(groups: dict[str, list[int]]) -> dict[str, tuple[int, int]] | None:
    flat = {f"{name}:{pid}": pid for name, pids in groups.items() for pid in pids}
    got = cpu_sample(flat)
    if got is None:
        return None
    out: dict[str, tuple[int, int]] = {}
    for key, (run_ns, wait_ns, _, _) in got.items():
        name = key.split(":", 1)[0]
        prev = out.get(name, (0, 0))
        out[name] = (prev[0] + run_ns, prev[1] + wait_ns)
    return out


def _wait_idle(stack: Stack, refs: dict[str, Ref], timeout: float = 40.0) -> dict[str, int]:
    deadline = time.monotonic() + timeout
    while True:
        left = {"firsthop": stack.firsthop_sessions()}
        left.update({name: stack.stock_sessions(ref.port) for name, ref in refs.items()})
        if not any(left.values()) or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def measure(
    stack: Stack,
    refs: dict[str, Ref],
    target: str,
    calls: int,
    *,
    rnd: int,
    seconds: float,
    warmup: float,
    workers: int,
    log: IO[bytes],
) -> dict[str, Any]:
    leftover = _wait_idle(stack, refs)
    freqs = frequencies(calls)
    shares = [freqs[i::workers] for i in range(min(workers, calls))]
    # what a worker's Stack needs to reach the services (the token: the transceiver's API)
    ports = {
        k: getattr(stack, k) for k in ("relay_port", "tx_media", "tx_api", "stock_port", "token")
    }
    argv = [sys.executable, "-m", "firsthop.services.bench.sessions", "worker"]
    children = [LineTool(f"caller worker {i}", argv, log) for i in range(len(shares))]
    try:
        for child, mine in zip(children, shares, strict=True):
            config = {
                "target": target,
                "stock_port": refs[target].port if target in refs else None,
                "ports": ports,
                "freqs": mine,
                "all_freqs": freqs,
                "connect_timeout": 30.0,
            }
            child.send(json.dumps(config))
        ready = [json.loads(child.line(timeout=90)) for child in children]
        time.sleep(warmup)
        servers = _server_pids(stack, target, refs)
        callers = {"callers": [child.pid for child in children]}
        cpu0, load0 = _sample(servers), _sample(callers)
        t0 = time.monotonic()
        for child in children:
            child.send("go")
        time.sleep(seconds)
        for child in children:
            child.send("stop")
        window = time.monotonic() - t0
        cpu1, load1 = _sample(servers), _sample(callers)
        results = [json.loads(child.line(timeout=120)) for child in children]
        for child in children:
            child.line(timeout=30)  # "closed"
    finally:
        for child in children:
            child.stop()
    if cpu0 is None or cpu1 is None or load0 is None or load1 is None:
        raise BenchError(f"a process under test exited during the {target} round")
    per_call = [call for r in results for call in r["calls"]]
    connected = sum(r["connected"] for r in ready)
    cpu_pct = {n: 100.0 * (cpu1[n][0] - cpu0[n][0]) / 1e9 / window for n in cpu1}
    caller_pct = 100.0 * (load1["callers"][0] - load0["callers"][0]) / 1e9 / window
    wait_ms = {n: (cpu1[n][1] - cpu0[n][1]) / 1e6 for n in cpu1}
    costs: dict[str, Any] = {}
    for label, parts in COSTS[target].items():
        pct = sum(cpu_pct[p] for p in parts)
        per_session = pct / connected if connected else None
        costs[label] = {
            "cpu_pct_of_core": round(pct, 2),
            "cpu_pct_per_session": round(per_session, 3) if per_session else None,
            "sessions_per_core": round(100.0 / per_session, 1) if per_session else None,
        }
    losses = [c["loss_pct"] for c in per_call]
    return {
        "target": target,
        "round": rnd,
        "calls": calls,
        "connected": connected,
        "setup_errors": [e for r in ready for e in r["errors"]],
        "leftover_sessions_at_start": leftover,
        "window_s": round(window, 3),
        "cpu_pct_of_core": {n: round(v, 2) for n, v in cpu_pct.items()},
        "runqueue_wait_ms": {n: round(v, 1) for n, v in wait_ms.items()},
        "caller_cpu_pct_of_core": round(caller_pct, 1),
        "costs": costs,
        "loss_pct_median": round(statistics.median(losses), 2) if losses else None,
        "loss_pct_max": max(losses) if losses else None,
        "all_heard_own": bool(per_call) and all(c["heard_own"] for c in per_call),
        "per_call": per_call,
    }


# -- the run and its report ------------------------------------------------------------------


def run(
    calls: list[int], *, seconds: float, rounds: int, warmup: float, workers: int
) -> dict[str, Any]:
    mask = sorted(os.sched_getaffinity(0))
    server_cpu = mask[0] if len(mask) >= 2 else None
    caller_cpu = mask[-1] if len(mask) >= 2 else None
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack_exit:
        stack_exit.callback(os.sched_setaffinity, 0, set(mask))
        log_file = tempfile.TemporaryFile()
        stack_exit.enter_context(log_file)
        os.sched_setaffinity(0, {server_cpu} if server_cpu is not None else set(mask))
        # on the services' core, before and after the rounds
        floors, cores = [codec_floor()], [media_core_cost()]
        stack = Stack()
        stack_exit.callback(stack.stop)  # also what a failed start left running
        stack.start(stock=True)
        refs = {
            "stock": Ref(stack.stock_port, stack.stock_pid),
            "stock-mono": Ref(*stack.spawn_stock("--mono")),
        }
        # The services inherited the first CPU; the caller workers inherit this one.
        os.sched_setaffinity(0, {caller_cpu} if caller_cpu is not None else set(mask))
        one = partial(
            measure, stack, refs, seconds=seconds, warmup=warmup, workers=workers, log=log_file
        )
        try:
            for n in calls:
                for rnd in range(1, rounds + 1):
                    rows += [one(target, n, rnd=rnd) for target in TARGETS]
        except BenchError as exc:
            log_file.seek(0)
            tail = "\n".join(log_file.read().decode(errors="replace").splitlines()[-20:])
            raise BenchError(f"{exc}\n--- the workers' last stderr lines ---\n{tail}") from exc
        stack.stop()
        os.sched_setaffinity(0, {server_cpu} if server_cpu is not None else set(mask))
        floors.append(codec_floor())
        cores.append(media_core_cost())
    config = {
        "calls": calls,
        "seconds": seconds,
        "rounds": rounds,
        "warmup": warmup,
        "workers": workers,
        "server_cpu": server_cpu,
        "caller_cpu": caller_cpu,
    }
    floor = round(statistics.median(floors), 3)
    return {
        "config": config,
        "rows": rows,
        "summary": summarize(rows, calls, floor),
        "floor": floor,
        "media_core": round(statistics.median(cores), 3),
    }


def codec_floor(
    seconds: float = FLOOR_SECONDS, frames: tuple[list[bytes], list[bytes]] | None = None
) -> float:
    """What transcoding alone costs, % of one core per call: a call's 50 frames a second of
    a caller's Opus decoded and 50 of the answer encoded (the transceiver's decoder and
    encoder), in a tight loop on this thread's core. `frames`: the caller's packets and the
    answer's PCM, one each per 20 ms (`tone_frames()` unless given)."""
    from firsthop.services.transceiver.media.codecs import OPUS_BITRATE
    from firsthop.services.transceiver.media.opus import OpusDecoder, OpusEncoder

    packets, pcm = frames if frames is not None else tone_frames()
    decoder, encoder = OpusDecoder(), OpusEncoder(OPUS_BITRATE)
    count, start = 0, time.thread_time()
    while (spent := time.thread_time() - start) < seconds:
        for packet, chunk in zip(packets, pcm, strict=True):
            decoder.decode(packet)
            encoder.encode(chunk)
        count += len(packets)
    return 100 * spent / (count * FRAME_S)  # % of a core for 1 s of one call


def media_core_cost(
    seconds: float = FLOOR_SECONDS, frames: tuple[list[bytes], list[bytes]] | None = None
) -> float:
    """What the transceiver's per-call media core alone costs (`media/core.py`, sans I/O),
    % of one core per call, in a tight loop on this thread's core like `codec_floor` and
    with the same frames: each 20 ms, the caller's packet in as SRTP (unprotect, RTP and
    its checks, jitter buffer, decode), the decoded frame pushed back as the answer (frame
    cutter, output queue) and played on its tick (encode, RTP, SRTP), RTCP as it falls due.
    The transceiver's cost over it is its I/O: the sockets, the loop, the agent link."""
    from firsthop.services.transceiver.media.core import AudioReceived, CallMedia, MediaParams
    from firsthop.services.transceiver.media.srtp import SrtpContext
    from firsthop.shared.wire import rtp

    packets, _ = frames if frames is not None else tone_frames()
    keying, profile = bytes(range(60)), "SRTP_AES128_CM_SHA1_80"
    caller = SrtpContext.from_keying_material(keying, profile, client=True)
    server = SrtpContext.from_keying_material(keying, profile, client=False)
    media = CallMedia(MediaParams(ssrc=0x5EED, cname="bench", mid="0", mid_extension=1))
    media.start(server, 0.0, time.time())
    seq, now, spent, count = 0, 0.0, 0.0, 0
    while spent < seconds:  # (protecting the caller's packets is the caller's cost: not timed)
        datagrams = [
            caller.protect_rtp(
                rtp.RtpPacket(111, (seq + i) & 0xFFFF, (seq + i) * 960 & 0xFFFFFFFF, 1, p).encode()
            )
            for i, p in enumerate(packets)
        ]
        seq += len(packets)
        start = time.thread_time()
        for datagram in datagrams:
            now += FRAME_S
            media.receive_datagram(datagram, now)
            while (event := media.next_event()) is not None:
                if isinstance(event, AudioReceived):
                    media.push_audio(event.pcm, None, now)
            timer = media.get_timer()
            if timer is not None and timer <= now:
                media.handle_timer(now)
            media.datagrams_to_send()
        spent += time.thread_time() - start
        count += len(datagrams)
    stats = media.stats()  # every frame decoded, and its answer played (not silence)
    if stats["frames_decoded"] < count or stats["agent_frames_played"] < count - 2:
        raise BenchError(f"the media core did not decode and play every frame: {stats}")
    return 100 * spent / (count * FRAME_S)


def tone_frames() -> tuple[list[bytes], list[bytes]]:
    """One second of a 440 Hz tone as `bench sessions`' aiortc callers send it (aiortc's own
    encoder: stereo, 96 kb/s, VoIP mode), and the tone itself as the answer to encode."""
    import fractions

    import numpy as np
    from aiortc.codecs.opus import OpusEncoder as AiortcOpusEncoder
    from av import AudioFrame

    from firsthop.services.transceiver.media.frames import FRAME_SAMPLES

    t = np.arange(50 * FRAME_SAMPLES) / 48000
    tone = (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16)
    caller = AiortcOpusEncoder()
    packets: list[bytes] = []
    pcm = [tone[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES].tobytes() for i in range(50)]
    for i, chunk in enumerate(pcm):
        frame = AudioFrame(format="s16", layout="mono", samples=FRAME_SAMPLES)
        frame.planes[0].update(chunk)
        frame.pts, frame.sample_rate = i * FRAME_SAMPLES, 48000
        frame.time_base = fractions.Fraction(1, 48000)
        packets += caller.encode(frame)[0]
    return packets, pcm[: len(packets)]


def summarize(
    rows: list[dict[str, Any]], calls: list[int], floor: float | None = None
) -> dict[str, Any]:
    """Medians over the rounds per call count; firsthop's sessions per core over each
    reference's, for each way of counting firsthop's cost; the target against `stock`."""
    out: dict[str, Any] = {}
    for n in calls:
        mine = [r for r in rows if r["calls"] == n]
        spc: dict[str, float | None] = {}
        for target in TARGETS:
            for label in COSTS[target]:
                values = [
                    r["costs"][label]["sessions_per_core"]
                    for r in mine
                    if r["target"] == target and r["costs"][label]["sessions_per_core"]
                ]
                spc[label] = round(statistics.median(values), 1) if values else None
        ratios = {
            ref: {
                label: round(v / base, 2) if (v := spc[label]) and (base := spc[ref]) else None
                for label in COSTS["firsthop"]
            }
            for ref in REFERENCES
        }
        loss = {t: max(r["loss_pct_max"] or 0.0 for r in mine if r["target"] == t) for t in TARGETS}
        heard = {t: all(r["all_heard_own"] for r in mine if r["target"] == t) for t in TARGETS}
        clean = loss["firsthop"] == 0 and heard["firsthop"]
        saturated = {
            ref: loss[ref] > SATURATED_LOSS_PCT
            or any(
                sum(r["cpu_pct_of_core"].values()) >= SATURATED_CPU_PCT
                for r in mine
                if r["target"] == ref
            )
            for ref in REFERENCES
        }
        per_call = [
            r["costs"]["transceiver"]["cpu_pct_per_session"]
            for r in mine
            if r["target"] == "firsthop" and r["costs"]["transceiver"]["cpu_pct_per_session"]
        ]
        over_floor = round(statistics.median(per_call) / floor, 2) if per_call and floor else None
        out[str(n)] = {
            "over_floor": over_floor,
            "sessions_per_core": spc,
            "ratio_to": ratios,
            "loss_pct_max": loss,
            "all_heard_own": heard,
            "saturated": saturated,
            "target": {
                "ratio": TARGET_RATIOS,
                "reference": "stock",
                "met": {
                    label: clean and (ratios["stock"][label] or 0.0) >= TARGET_RATIOS[label]
                    for label in TARGET_RATIOS
                },
                "floor_ratio": FLOOR_TARGET,
                "floor_met": over_floor is not None and over_floor <= FLOOR_TARGET,
            },
        }
    return out


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def render(result: dict[str, Any]) -> str:
    cfg = result["config"]
    pinning = (
        f"services pinned to cpu {cfg['server_cpu']}, caller workers to cpu {cfg['caller_cpu']}"
        if cfg["server_cpu"] is not None
        else "not pinned (one CPU)"
    )
    lines = [
        f"firsthop bench sessions: echo calls, {cfg['seconds']} s steady window after "
        f"{cfg['warmup']} s warm-up, {cfg['rounds']} interleaved round(s), "
        f"{cfg['workers']} caller processes; {pinning}",
        "CPU: % of one core over the window, all threads; per session and sessions/core count "
        "the transceiver alone (firsthop) or the answerer; loss: 20 ms frames that did not come "
        "back carrying the caller's own tone; stock-mono: stock echoing fresh mono frames",
        "",
        f"{'calls':>5} {'target':<11}{'rnd':>4}{'conn':>5}  {'server CPU % of a core':<44}"
        f"{'%/sess':>7}{'sess/core':>10}{'loss% med/max':>15}{'own':>5}{'callers%':>9}",
    ]
    for r in result["rows"]:
        parts = ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_pct_of_core"].items())
        main = r["costs"]["transceiver" if r["target"] == "firsthop" else r["target"]]
        lines.append(
            f"{r['calls']:>5} {r['target']:<11}{r['round']:>4}{r['connected']:>5}  {parts:<44}"
            f"{_fmt(main['cpu_pct_per_session'], '.2f'):>7}"
            f"{_fmt(main['sessions_per_core']):>10}"
            f"{_fmt(r['loss_pct_median'], '.1f'):>8}/{_fmt(r['loss_pct_max'], '.1f'):<6}"
            f"{'yes' if r['all_heard_own'] else 'NO':>5}{r['caller_cpu_pct_of_core']:>9.1f}"
        )
    lines += ["", "medians over the rounds: sessions per core, and firsthop over each reference"]
    for n, s in result["summary"].items():
        spc, ratio = s["sessions_per_core"], s["ratio_to"]
        lines.append(
            f"  {n} calls: stock {_fmt(spc['stock'])}, stock-mono {_fmt(spc['stock-mono'])} "
            "sessions/core"
        )
        lines.append(f"    {'firsthop, counting':<34}{'sess/core':>10}{'x stock':>9}{'x mono':>8}")
        for label in COSTS["firsthop"]:
            lines.append(
                f"    {label:<34}{_fmt(spc[label]):>10}{_fmt(ratio['stock'][label], '.2f'):>9}"
                f"{_fmt(ratio['stock-mono'][label], '.2f'):>8}"
            )
        loss, heard = s["loss_pct_max"], s["all_heard_own"]
        lines.append(
            "    worst call loss %: "
            + ", ".join(f"{t} {loss[t]:.1f}" for t in TARGETS)
            + "; every caller heard its own tone: "
            + ", ".join(f"{t} {'yes' if heard[t] else 'NO'}" for t in TARGETS)
        )
        if result.get("floor"):
            lines.append(
                f"    codec floor (decode + encode of a call's frames in a tight loop, same core): "
                f"{result['floor']:.2f} % of a core per call; the transceiver is "
                f"{_fmt(s.get('over_floor'), '.2f')}x it (target <= {FLOOR_TARGET}x: "
                f"{'met' if s['target'].get('floor_met') else 'MISSED'})"
            )
        if result.get("media_core") and result.get("floor"):
            core = result["media_core"]
            lines.append(
                f"    the media core alone (media/core.py: SRTP, RTP, jitter buffer, decode, "
                f"output clock, encode, RTCP; same loop): {core:.2f} % of a core per call, "
                f"{core / result['floor']:.2f}x the floor; the rest is the transceiver's I/O"
            )
        for ref, full in s.get("saturated", {}).items():
            if full:
                lines.append(
                    f"    {ref} SATURATED (loss over {SATURATED_LOSS_PCT} % or its core "
                    f"{SATURATED_CPU_PCT:.0f} % busy): its sessions/core overstates it, so "
                    f"x {'mono' if ref == 'stock-mono' else 'stock'} is a lower bound; "
                    "measure with fewer calls"
                )
        met = s["target"]["met"]
        lines.append(
            "    target, x stock with no loss: "
            + ", ".join(
                f"{label} >= {TARGET_RATIOS[label]:.0f}x {'met' if ok else 'MISSED'}"
                for label, ok in met.items()
            )
        )
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """`bench sessions` without --knee (bench/cli.py sends --knee to knee.main)."""
    chosen = settings(args, QUICK if args.quick else DEFAULTS)

    def measure() -> dict[str, Any]:
        calls = [int(v) for v in str(chosen["calls"]).split(",")]
        if min(calls) < 1:
            raise ValueError("calls must be >= 1")
        return run(
            calls,
            seconds=float(chosen["seconds"]),
            rounds=int(chosen["rounds"]),
            warmup=float(chosen["warmup"]),
            workers=args.workers,
        )

    return report("sessions", args, measure, render)


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    """The `sessions` parser; the caller sets what runs it (main, or knee.main for --knee)."""
    p = sub.add_parser("sessions", help="server CPU per echoed call and loss vs stock aiortc")
    p.add_argument("--calls", help="concurrent calls per round; a list sweeps (10,20,30)")
    p.add_argument("--seconds", type=float, help="steady measuring window per round")
    p.add_argument("--rounds", type=int, help="interleaved rounds of the three targets")
    p.add_argument("--warmup", type=float, help="seconds after setup before the window")
    p.add_argument("--workers", type=int, default=2, help="caller processes per round")
    p.add_argument(
        "--knee",
        action="store_true",
        help="find the most calls one transceiver holds on one pinned core: double --calls "
        "(the start, default 20) until loss > 0.5 %% or residence p99 > 40 ms, then bisect; "
        "cheap callers (pre-encoded Opus out, RTP judged after the window); then stock "
        "aiortc's knee on the same core with the same callers",
    )
    p.add_argument("--max-calls", type=int, help="--knee: the sweep's ceiling (400)")
    p.add_argument("--resolution", type=int, help="--knee: bisect down to this many calls (10)")
    p.add_argument(
        "--whole-path",
        action="store_true",
        help="--knee: the transceiver, echo agent and relay together on the measured core",
    )
    p.add_argument(
        "--quick", action="store_true", help="3 calls, 2 s, 1 round (--knee: 2 then 4 calls)"
    )
    p.add_argument("--json", action="store_true", help="print JSON")
    return p


if __name__ == "__main__" and sys.argv[1:] == ["worker"]:
    asyncio.run(worker_main())
