"""`firsthop bench sessions|echo|voice --quick`, end to end.

Only that each bench runs against the real stack and measures what it says: every call
connects, every target has its rows, costs are positive, each caller hears its own tone, and
the tap sees the transceiver's residence. No timing thresholds here (the machines are shared
and noisy); the targets belong to the benches' own reports.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import run_bench

pytestmark = pytest.mark.serial  # (each measures CPU or timing: alone, after the rest)

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "firsthop.services.cli", "bench", *args, "--quick", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_quick_sessions_bench_measures_firsthop_and_stock() -> None:
    result = bench("sessions")
    rows = result["rows"]
    assert {r["target"] for r in rows} == {"firsthop", "stock", "stock-mono"}
    for row in rows:
        assert row["calls"] > 0
        assert row["connected"] == row["calls"], row["setup_errors"]
        assert row["window_s"] > 0
        assert all(v > 0 for v in row["cpu_pct_of_core"].values()), row["cpu_pct_of_core"]
        for cost in row["costs"].values():
            assert cost["cpu_pct_per_session"] > 0
            assert cost["sessions_per_core"] > 0
        assert len(row["per_call"]) == row["calls"]
        freqs = [call["freq"] for call in row["per_call"]]
        assert len(set(freqs)) == len(freqs)
        for call in row["per_call"]:
            assert 0 <= call["loss_pct"] <= 100
            assert call["frames"] > 0
            assert call["heard_own"], call
    firsthop = next(r for r in rows if r["target"] == "firsthop")
    assert set(firsthop["cpu_pct_of_core"]) == {"transceiver", "agent", "relay"}
    summary = next(iter(result["summary"].values()))
    assert set(summary["ratio_to"]) == {"stock", "stock-mono"}
    assert all(v is not None and v > 0 for v in summary["ratio_to"]["stock"].values())
    # the codec floor, measured in the same run, and the transceiver's cost over it
    assert 0 < result["floor"] < 5  # % of a core per call: decode + encode alone
    assert summary["over_floor"] > 1  # the transceiver does more than transcode
    # the media core alone, same loop, same frames: transcoding and more, less than it all
    assert result["floor"] < result["media_core"] < result["floor"] * summary["over_floor"]
    assert set(summary["target"]["met"]) == {"transceiver", "transceiver+agent+relay"}
    assert set(summary["saturated"]) == {"stock", "stock-mono"}  # (flagged when it lost frames)


def test_quick_knee_sweep_steps_up_and_its_loss_check_sees_a_stalled_agent() -> None:
    result = bench("sessions", "--knee", "--whole-path")
    config, check, rows = result["config"], result["loss_check"], result["rows"]
    pinned = config["transceiver_cpu"] is not None  # on 2+ CPUs: pinned apart
    assert not pinned or config["transceiver_cpu"] != config["bench_cpu"]
    # The agent stopped 0.5 s mid-window: the judge counts the frames that cost every call.
    assert check["detected"] and check["frames_lost"] > 0, check
    assert rows[0]["calls"] == 2 and {r["calls"] for r in rows} <= {2, 3, 4}
    for row in rows:
        assert row["connected"] == row["calls"], row["setup_errors"]
        assert row["frames_expected"] > 0 and 0 <= row["frames_lost"] <= row["frames_expected"]
        assert row["all_heard_own"], row["per_call"]
        assert len(row["per_call"]) == row["calls"]
        assert row["transceiver_cpu_pct"] > 0 and row["rss_kib"] > 0
        assert not pinned or str(config["transceiver_cpu"]) in row["core_busy_pct"]
        assert {"transceiver", "agent", "relay", "callers 0"} <= set(row["cpu_pct"])
        assert isinstance(row["passed"], bool) and row["bound"]
        counted = row["transceiver_counted"]  # the step's calls, as the transceiver saw them
        assert counted["frames_decoded"] > 0 and counted["agent_frames_played"] > 0, counted
        if config["capture_error"] is None and row["residence_ms"]["n"]:
            assert row["residence_ms"]["p50"] > 0, row
    if config["capture_error"] is None:  # CAP_NET_RAW: residence per burst onset, measured
        # (by the first step at least: once, on a loaded 2-core VM, a 4-call step of the
        # whole path on one core matched no onset in its short window)
        assert rows[0]["residence_ms"]["n"] > 0, rows[0]["residence_ms"]
    summary = result["summary"]
    assert summary["knee_calls"] in {0, 2, 3, 4}
    # the codec floor of the callers' own frames, on the measured core, in the same run
    assert 0 < summary["codec_floor_pct_per_call"] < 5
    if summary["knee_calls"]:  # the transceiver does more than transcode
        assert summary["transceiver_over_floor_at_knee"] > 1
    assert summary["bound_by"]
    # --whole-path: the transceiver, the echo agent and the relay (supervisor and worker) are
    # what is measured, together on the one core
    assert config["pinned"] == "path"
    assert config["measured"][:3] == ["transceiver", "agent", "relay"], config["measured"]
    assert "relay worker 0" in config["measured"]
    for row in rows:
        assert row["measured_cpu_pct"] >= row["transceiver_cpu_pct"] > 0
        parts = [row["cpu_pct"][n] for n in row["measured"]]  # each rounded to 0.1
        assert row["measured_cpu_pct"] == pytest.approx(sum(parts), abs=0.05 * (len(parts) + 1))
    # The reference: stock aiortc's sweep on the same core, the same callers, loss alone.
    ref = result["reference"]
    assert ref["target"] == "stock" and ref["rows"][0]["calls"] == 2
    for row in ref["rows"]:
        assert row["measured"] == ["stock"] and set(row["cpu_pct"]) >= {"stock", "callers 0"}
        assert row["connected"] == row["calls"], row["setup_errors"]
        assert row["frames_expected"] > 0 and row["all_heard_own"], row["per_call"]
        assert row["measured_cpu_pct"] > 0 and row["residence_ms"]["n"] == 0
        assert row["transceiver_counted"] is None
    stock_knee = ref["summary"]["knee_calls"]
    assert result["knee_over_stock"] == (
        round(summary["knee_calls"] / stock_knee, 2) if stock_knee else None
    )


def test_quick_echo_bench_measures_residence_and_mouth_to_ear() -> None:
    result = bench("echo")
    rows = result["rows"]
    assert {r["target"] for r in rows} == {"relay", "direct", "direct-notap", "stock", "twilio"}
    heard = sent = tapped = 0
    for row in rows:
        assert row["bursts_sent"] == result["config"]["bursts"]
        assert row["bursts_heard"] > 0, row
        heard, sent = heard + row["bursts_heard"], sent + row["bursts_sent"]
        values = [v for v in row["mouth_to_ear_ms"] if v is not None]
        assert values and all(v > 0 for v in values), row
        if row["target"] in ("relay", "direct", "twilio"):
            residence = [v for v in row["burst_residence_ms"] if v is not None]
            assert all(v > 0 for v in residence), row
            if row["tap_bursts"] == 0:
                continue  # (the tap saw no burst both ways: the row says so; see below)
            assert residence, row  # every burst the tap saw is matched to its onset
            tapped += 1
            sizes = row["packet_bytes_median"]
            # the size split the tap relies on: silence is small, tone is large, both ways
            assert sizes["up_small"] < sizes["up_big"] and sizes["down_small"] < sizes["down_big"]
    # The three tapped calls measured, but for one the tap may miss (one row in one CI run
    # had no residence at all; its cause, a clock step or a missed call, was not caught).
    assert tapped >= 2, rows
    assert heard >= 0.75 * sent
    summary = result["summary"]
    assert set(summary["targets"]) >= {
        "residence_p50_ms",
        "mouth_to_ear_p50_ms",
        "relay_over_direct_ms",
    }
    if any(r["target"] == "relay" and r["tap_bursts"] for r in rows):
        assert summary["relay"]["residence_ms"]["p50"] > 0
    assert summary["stock"]["mouth_to_ear_ms"]["p50"] > 0
    # The Media Streams bot's echo is heard, and its cost next to the native agent is given.
    assert summary["twilio"]["bursts_heard"] > 0
    assert summary["targets"]["twilio_over_native_ms"]["mouth_to_ear_p50"] is not None


@pytest.mark.timeout(240)
def test_quick_voice_bench_measures_the_assistant_through_the_edge_and_direct() -> None:
    result = bench("voice")
    rows = result["rows"]
    for path in ("edge", "direct", "direct-opus"):
        turns = [r for r in rows if r["path"] == path]
        assert len(turns) == result["config"]["turns"], turns
        for turn in turns:
            assert "error" not in turn, turn
            assert turn["transcript"], turn  # the question was heard and recognised
            assert turn["voice_to_voice_ms"] > 0, turn
    for turn in (r for r in rows if r["path"] == "direct"):
        assert turn["vad_hangover_ms"] > 0 and turn["recognition_ms"] > 0, turn
    (barge,) = result["barge_ins"]
    assert barge["cleared_seen"] and barge["barge_in_ms"] > 0, barge
    summary = result["summary"]
    assert summary["edge_added_p50_ms"] is not None
    assert summary["barge_in_ms"]["n"] == 1


@pytest.mark.timeout(240)
def test_quick_loss_bench_measures_firsthop_and_stock_through_the_impairment() -> None:
    result = bench("loss")
    rows = {r["target"]: r for r in result["rows"]}
    assert set(rows) == {"firsthop", "stock"}
    for row in rows.values():
        assert row["slots"] > 0 and row["echo_silent"] is not None, row
        assert 0 < row["down_lost"] < 0.2 and 0 < row["up_lost"] < 0.2, row  # 5 % was asked
    ours = rows["firsthop"]
    assert ours["agent_slots"] > 0.9 and ours["repaired"] > 0, ours


def test_the_capture_opens_with_cap_net_raw_alone() -> None:
    """AF_PACKET needs CAP_NET_RAW; the bigger receive buffer past rmem_max (CAP_NET_ADMIN)
    is had where it can be, not required."""
    capture = f"exec {sys.executable} -m firsthop.services.bench.capture 9"
    with subprocess.Popen(
        ["capsh", "--drop=cap_net_admin", "--", "-c", capture],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        ready = proc.stdout.readline()
        proc.stdin.close()  # EOF: it exits
        assert proc.wait(timeout=60) == 0
        assert ready == "ready\n", (ready, proc.stderr.read() if proc.stderr else "")


@pytest.mark.timeout(240)
def test_quick_churn_bench_reads_what_short_calls_leave_behind_on_both_servers() -> None:
    # The transceiver's threads besides its loop: asyncio's default executor (an agent link's
    # getaddrinfo), at most min(32, CPUs + 4), and Trio's thread cache (the registry's Redis
    # writes). More calls a round than that: a thread kept per call would show.
    executor = min(32, (os.cpu_count() or 1) + 4)
    calls = executor + 2
    result = bench("churn", "--calls", str(calls))
    config, series, summary = result["config"], result["series"], result["summary"]
    assert set(series) == {"firsthop", "stock"} and config["calls"] == calls
    for target, rows in series.items():
        assert [r["round"] for r in rows] == list(range(config["rounds"] + 1))
        assert all(r["threads"] >= 1 and r["rss_kib"] > 0 for r in rows), rows
        assert all(r["leftover_sessions"] == 0 for r in rows), rows
        for row in rows[1:]:
            assert row["connected"] == row["answered"] == calls, row["setup_errors"]
            assert row["heard_own"] > 0, row
        assert summary[target]["calls"] == calls * config["rounds"]
    firsthop = summary["firsthop"]
    assert firsthop["threads_max_idle"] <= firsthop["threads_before"] + executor + 1, firsthop


@pytest.mark.slow
def test_quick_phone_bench_measures_a_phone_call_next_to_a_webrtc_call() -> None:
    result = bench("phone")
    (row,) = result["rows"]
    for kind in ("phone", "webrtc"):
        assert row["answer_ms"][kind] > 0
        assert any(v is not None for v in row["mouth_to_ear_ms"][kind])  # each heard its bursts
        assert row["cpu_pct_per_call"][kind] > 0


def test_recording_bench_gives_cpu_and_bytes_per_call_minute() -> None:
    result = run_bench("recording", "--rounds", "1")
    for caller in ("aiortc", "browser-like"):
        r = result[caller]
        # a minute of 20 ms Opus both ways: tens of kB/s, and far less CPU than its codec work
        assert 200_000 < r["bytes_per_call_minute"] < 3_000_000, r
        assert 0 < r["cpu_ms_per_call_minute"] and 0 < r["over_codec"] < 1, r
    phone = result["phone-g711"]  # two 8 kHz channels of a byte a sample, and the header
    assert phone["bytes_per_call_minute"] == 58 + 3001 * 320, phone
    assert 0 < phone["cpu_ms_per_call_minute"] and 0 < phone["over_codec"] < 1, phone
