"""`bench sessions --knee`: its judge counts every kind of lost echo, through the real codecs;
its capture reads what the relay and the transceiver exchange; its aiortc hook is in place.

The echo is made as the transceiver makes it: the caller's pre-encoded packets decoded by
libopus and re-encoded by the transceiver's own encoder (the echo agent returns the PCM as
it is). A late echo is what `AgentAudioTrack` does then: its encoder codes silence into the
slot and the frame plays a slot later.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

from firsthop.services.bench.caller_hooks import hook_points
from firsthop.services.bench.capture import bpf_program, note
from firsthop.services.bench.knee_caller import (
    BURST_FRAMES,
    FRAME_S,
    PERIOD_FRAMES,
    encoded_cycle,
    judge,
)
from firsthop.services.bench.knee_report import render, summarize
from firsthop.services.transceiver.media.codecs import OPUS_BITRATE, SILENT_PCM
from firsthop.services.transceiver.media.opus import OpusDecoder, OpusEncoder
from firsthop.shared.wire.proxy_v2 import build_proxy_v2

FREQ = 600.0
OTHERS = [FREQ, 660.0, 720.0]
T0 = 100.0
DELAY = 0.03  # from a frame leaving the caller to its echo arriving
CYCLES = 3
EXPECTED = CYCLES * BURST_FRAMES
MID = PERIOD_FRAMES + 20  # a slot in the middle of the second burst's echo


def echo_pcm(freq: float = FREQ) -> list[bytes]:
    """What the transceiver hands its encoder: the caller's cycles, decoded (the echo agent
    returns the PCM as it came), CYCLES + 1 of them."""
    decoder = OpusDecoder()
    return [decoder.decode(p) for _ in range(CYCLES + 1) for p in encoded_cycle(freq)]


def encode(pcm: list[bytes | None]) -> list[bytes | None]:
    """The call's encoder over its slots (None: a packet that never reaches the caller)."""
    encoder = OpusEncoder(OPUS_BITRATE)
    return [None if p is None else encoder.encode(p) for p in pcm]


def judged(slots: list[bytes | None]) -> tuple[int, int, bool]:
    """(frames lost, bursts with a loss, heard its own tone) of a recording of `slots`, one
    every 20 ms from DELAY after the first burst left; its RTP sequence wraps on the way."""
    packets = [
        (T0 + DELAY + i * FRAME_S, (65000 + i) & 0xFFFF, p)
        for i, p in enumerate(slots)
        if p is not None
    ]
    onsets = [T0 + k * PERIOD_FRAMES * FRAME_S for k in range(CYCLES + 1)]
    window = (T0, T0 + CYCLES * PERIOD_FRAMES * FRAME_S)
    verdict = judge(packets, onsets, FREQ, OTHERS, window)
    assert verdict.bursts == CYCLES
    assert verdict.expected == EXPECTED
    return verdict.lost, len(verdict.runs), verdict.heard_own


def test_an_echo_that_all_came_back_loses_nothing_and_is_heard_as_the_callers_own() -> None:
    assert judged(encode(list(echo_pcm()))) == (0, 0, True)


def test_an_echo_late_and_replaced_by_silence_is_a_lost_frame() -> None:
    pcm: list[bytes | None] = list(echo_pcm())
    pcm.insert(MID, SILENT_PCM)  # its slot coded as silence; it plays a slot later
    assert judged(encode(pcm))[:2] == (1, 1)
    pcm.insert(MID, SILENT_PCM)
    pcm.insert(MID, SILENT_PCM)
    assert judged(encode(pcm))[:2] == (3, 1)


def test_an_echo_dropped_for_silence_or_never_sent_is_a_lost_frame() -> None:
    pcm: list[bytes | None] = list(echo_pcm())
    pcm[MID] = SILENT_PCM  # dropped, silence in its slot
    assert judged(encode(pcm))[:2] == (1, 1)
    slots = encode(list(echo_pcm()))
    slots[MID] = None  # the packet never came
    assert judged(slots)[:2] == (1, 1)
    pcm = list(echo_pcm())
    del pcm[PERIOD_FRAMES + BURST_FRAMES - 1]  # the burst's last frame, gone
    assert judged(encode(pcm))[:2] == (1, 1)
    pcm = list(echo_pcm())
    del pcm[PERIOD_FRAMES + 1]  # and its first whole one
    assert judged(encode(pcm))[:2] == (1, 1)


def test_a_frame_lost_in_every_burst_is_loss_not_another_callers_tone() -> None:
    # the quick knee sweep judges one burst per call: a frame lost there is counted as lost,
    # and the caller still heard its own tone
    pcm: list[bytes | None] = list(echo_pcm())
    for k in range(CYCLES):
        pcm[k * PERIOD_FRAMES + 20] = SILENT_PCM
    assert judged(encode(pcm)) == (CYCLES, CYCLES, True)


def test_a_burst_that_never_came_back_loses_all_its_frames() -> None:
    slots = encode(list(echo_pcm()))
    for i in range(PERIOD_FRAMES, 2 * PERIOD_FRAMES):
        slots[i] = None
    assert judged(slots)[:2] == (BURST_FRAMES, 1)
    pcm: list[bytes | None] = list(echo_pcm())
    pcm[PERIOD_FRAMES : 2 * PERIOD_FRAMES] = [SILENT_PCM] * PERIOD_FRAMES
    assert judged(encode(pcm))[:2] == (BURST_FRAMES, 1)


def test_another_callers_tone_is_not_heard_as_ones_own() -> None:
    lost, _, heard_own = judged(encode(list(echo_pcm(660.0))))
    assert not heard_own
    assert lost >= 0.9 * EXPECTED  # 60 Hz away over 20 ms is not the caller's tone


def _frame(src: tuple[str, int], dst: tuple[str, int], client: tuple[str, int], up: bool) -> bytes:
    header = (
        build_proxy_v2(client, ("127.0.0.1", 5004))
        if up
        else build_proxy_v2(("127.0.0.1", 5004), client)
    )
    payload = header + bytes([0x80, 111]) + bytes(150)
    udp = struct.pack("!HHHH", src[1], dst[1], 8 + len(payload), 0) + payload
    ip = struct.pack(
        "!BBHHHBBH4s4s",
        0x45,
        0,
        20 + len(udp),
        0,
        0,
        64,
        17,
        0,
        socket.inet_aton(src[0]),
        socket.inet_aton(dst[0]),
    )
    return bytes(12) + b"\x08\x00" + ip + udp


def test_the_capture_reads_the_client_and_size_of_rtp_each_way() -> None:
    tx, relay, client = ("127.0.0.1", 40000), ("127.0.0.1", 3478), ("192.0.2.7", 5555)
    header_len = len(build_proxy_v2(client, ("127.0.0.1", 5004)))
    assert note(_frame(relay, tx, client, up=True), 7, tx[1]) == (7, "up", "192.0.2.7:5555", 152)
    assert note(_frame(tx, relay, client, up=False), 8, tx[1]) == (
        8,
        "down",
        "192.0.2.7:5555",
        152,
    )
    assert header_len > 0
    assert note(_frame(relay, ("127.0.0.1", 1), client, up=True), 9, tx[1]) is None
    assert note(b"\x00" * 40, 9, tx[1]) is None  # garbage: not a record, not a crash
    program = bpf_program(tx[1])
    assert program[-2] != program[-1] and len(program) == 15


def test_the_aiortc_internal_the_callers_hook_is_where_expected() -> None:
    async def main() -> dict[str, bool]:
        return hook_points()

    points = asyncio.run(main())
    assert points and all(points.values()), points


# -- the report: firsthop's knee next to stock's ----------------------------------------------


def _row(calls: int, passed: bool, cpu: float, measured: list[str]) -> dict[str, Any]:
    return {
        "calls": calls,
        "connected": calls,
        "loss_pct": 0.0 if passed else 2.0,
        "residence_ms": {"p50": None, "p99": None, "n": 0},
        "measured": measured,
        "measured_cpu_pct": cpu,
        "measured_cpu_pct_per_call": cpu / calls,
        "measured_runqueue_wait_ms": 0.0,
        "transceiver_cpu_pct": cpu if measured == ["transceiver"] else None,
        "transceiver_cpu_pct_per_call": cpu / calls if measured == ["transceiver"] else None,
        "core_busy_pct": {0: cpu, 1: 50.0},
        "callers_cpu_pct": 10.0,
        "rss_kib": 100_000,
        "rss_kib_per_session": 500.0,
        "passed": passed,
        "bound": "" if passed else "measured core",
    }


def test_the_knee_report_sets_firsthop_against_stock_on_the_same_core() -> None:
    tx = ["transceiver"]
    rows = [_row(20, True, 30.0, tx), _row(40, True, 60.0, tx), _row(80, False, 99.0, tx)]
    rows[2]["transceiver_counted"] = {"output_gaps": 37, "output_late_played": 900}
    ref_rows = [_row(5, True, 50.0, ["stock"]), _row(10, False, 99.0, ["stock"])]
    summary, ref_summary = summarize(rows), summarize(ref_rows)
    assert (summary["knee_calls"], ref_summary["knee_calls"]) == (40, 5)
    assert summary["measured_cpu_pct_at_knee"] == 60.0
    assert summary["calls_at_full_core_projected"] == round(100 / 1.5)
    assert ref_summary["first_failing_calls"] == 10 and ref_summary["failed_on"]
    config = {
        "measured": tx,
        "transceiver_cpu": 0,
        "bench_cpu": 1,
        "residence": None,
        "capture_error": "no CAP_NET_RAW",
        "seconds": 3.0,
        "warmup": 1.0,
        "max_loss_pct": 0.5,
        "max_residence_p99_ms": 40.0,
        "start": 20,
        "resolution": 10,
        "idle_rss_kib": 90_000,
    }
    check = {"stall_s": 0.5, "calls": 4, "per_call_lost": [20, 20], "detected": True}
    result: dict[str, Any] = {"config": config, "loss_check": check, "rows": rows}
    result["summary"] = summary
    result["reference"] = {"target": "stock", "rows": ref_rows, "summary": ref_summary}
    text = render(result)
    assert "stock knee: 5 calls on one core" in text
    # the transceiver's own account of the gaps it played, on its step's line (stock: -)
    step80 = next(line for line in text.splitlines() if line.startswith("    80"))
    assert step80.split()[-4:] == ["37", "FAIL", "measured", "core"], step80
    assert "knee over stock's: 8.00x" in text
    # no knee for stock (its first step failed): no ratio, not a division by zero
    result["reference"]["summary"] = summarize([_row(1, False, 99.0, ["stock"])])
    assert "knee over stock's: -" in render(result)
    assert "codec floor" not in text  # none measured: none reported
    result["summary"] = summarize(rows, 0.75)
    assert "the transceiver at the knee is 2.00x it (target <= 2.5x: met)" in render(result)
    result["summary"] = summarize(rows, 0.5)
    assert "the transceiver at the knee is 3.00x it (target <= 2.5x: MISSED)" in render(result)


def test_the_knee_report_sets_the_transceiver_at_its_knee_against_the_codec_floor() -> None:
    tx = ["transceiver"]
    rows = [_row(40, True, 60.0, tx), _row(80, False, 99.0, tx)]  # the knee: 1.5 % a call
    assert summarize(rows, 0.5)["transceiver_over_floor_at_knee"] == 3.0
    summary = summarize(rows, 0.75)
    assert summary["codec_floor_pct_per_call"] == 0.75
    assert summary["transceiver_over_floor_at_knee"] == 2.0
    # the whole path: the transceiver's own share, not the measured core's
    path = ["transceiver", "agent", "relay"]
    whole = [_row(40, True, 60.0, path) | {"transceiver_cpu_pct_per_call": 0.9}]
    assert summarize(whole, 0.3)["transceiver_over_floor_at_knee"] == 3.0
    assert summarize([_row(4, False, 99.0, tx)], 0.5)["transceiver_over_floor_at_knee"] is None
