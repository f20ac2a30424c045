"""`bench sessions --knee`'s report: the sweep's summary and its text rendering."""

from __future__ import annotations

from typing import Any

from firsthop.services.bench.sessions import FLOOR_TARGET, MAX_LOSS_PCT

MAX_RESIDENCE_P99_MS = 40.0


def summarize(rows: list[dict[str, Any]], floor: float | None = None) -> dict[str, Any]:
    """The sweep's knee; with `floor` (the codec floor, % of a core per call, measured on
    the same core in the same run), the transceiver's CPU per call at the knee over it."""
    passed = [r for r in rows if r["passed"]]
    best = max(passed, key=lambda r: r["calls"]) if passed else None
    failed = [r for r in rows if not r["passed"] and (best is None or r["calls"] > best["calls"])]
    # the smallest failing count, as its last attempt found it (what the sweep went by)
    first_fail = None
    if failed:
        lowest = min(r["calls"] for r in failed)
        first_fail = [r for r in failed if r["calls"] == lowest][-1]
    return {
        "knee_calls": best["calls"] if best else 0,
        "rss_kib_per_session": best["rss_kib_per_session"] if best else None,
        "transceiver_cpu_pct_at_knee": best["transceiver_cpu_pct"] if best else None,
        # what ran on the measured core (the transceiver, the whole path, or stock), at the knee
        "measured_cpu_pct_at_knee": best["measured_cpu_pct"] if best else None,
        # Not a measurement: the knee's CPU per call, scaled to a whole core (a bench-bound
        # knee says how far the measured processes were from their own limit).
        "calls_at_full_core_projected": (
            round(100.0 / best["measured_cpu_pct_per_call"])
            if best and best["measured_cpu_pct_per_call"]
            else None
        ),
        "first_failing_calls": first_fail["calls"] if first_fail else None,
        "bound_by": first_fail["bound"] if first_fail else "not reached (max calls passed)",
        "failed_on": _reasons(first_fail) if first_fail else [],
        # the first step's: nothing before it but the loss check (later steps' carry what
        # earlier ones left behind in the heap)
        "rss_kib_per_session_first_step": rows[0]["rss_kib_per_session"] if rows else None,
        "first_step_calls": rows[0]["calls"] if rows else None,
        "codec_floor_pct_per_call": round(floor, 3) if floor else None,
        "transceiver_over_floor_at_knee": (
            round(best["transceiver_cpu_pct_per_call"] / floor, 2)
            if floor and best and best.get("transceiver_cpu_pct_per_call")
            else None
        ),
    }


def _reasons(row: dict[str, Any]) -> list[str]:
    out = []
    if row["loss_pct"] > MAX_LOSS_PCT:
        out.append(f"loss {row['loss_pct']:.2f} % > {MAX_LOSS_PCT}")
    p99 = row["residence_ms"]["p99"]
    if p99 is not None and p99 > MAX_RESIDENCE_P99_MS:
        out.append(f"residence p99 {p99:.1f} ms > {MAX_RESIDENCE_P99_MS:.0f}")
    if row["connected"] < row["calls"]:
        out.append(f"{row['calls'] - row['connected']} calls did not connect")
    return out or ["no residence measured"]


def _fmt(value: float | None, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def step_line(r: dict[str, Any]) -> str:
    res = r["residence_ms"]
    busy = "/".join(_fmt(v, ".0f") for v in r["core_busy_pct"].values())
    counted = r.get("transceiver_counted")
    gaps = str(counted.get("output_gaps", "-")) if counted else "-"
    return (
        f"{r['calls']:>6}{r['connected']:>6}{r['loss_pct']:>8.2f}"
        f"{_fmt(res['p50']):>7}{_fmt(res['p99']):>7}{res['n']:>6}"
        f"{r['measured_cpu_pct']:>7.1f}{r['measured_runqueue_wait_ms']:>8.0f}"
        f"{busy:>10}{r['callers_cpu_pct']:>9.1f}"
        f"{r['rss_kib'] / 1024:>8.1f}{_fmt(r['rss_kib_per_session']):>8}{gaps:>6}"
        f"  {'pass' if r['passed'] else 'FAIL'}  {'' if r['passed'] else r['bound']}"
    )


HEADER = (
    f"{'calls':>6}{'conn':>6}{'loss%':>8}{'res50':>7}{'res99':>7}{'n':>6}"
    f"{'cpu%':>7}{'wait':>8}{'cores%':>10}{'callers%':>9}{'RSS MB':>8}{'KiB/s':>8}{'gaps':>6}"
)


def render(result: dict[str, Any]) -> str:
    cfg, s, check = result["config"], result["summary"], result["loss_check"]
    measured = " + ".join(cfg["measured"])
    pinning = (
        f"{measured} on cpu {cfg['transceiver_cpu']}, the rest and the callers on "
        f"cpu {cfg['bench_cpu']}"
        if cfg["transceiver_cpu"] is not None
        else "not pinned (one CPU)"
    )
    residence = cfg["residence"] or f"NOT MEASURED ({cfg['capture_error']}): loss alone"
    lines = [
        f"firsthop bench sessions --knee: echo calls through relay -> transceiver -> agent; "
        f"{cfg['seconds']} s window after {cfg['warmup']} s warm-up per step; {pinning}",
        f"pass: loss <= {cfg['max_loss_pct']} % of tone frames and residence p99 <= "
        f"{cfg['max_residence_p99_ms']:.0f} ms ({residence}); doubling from {cfg['start']}, "
        f"then bisecting to {cfg['resolution']}",
        f"loss check: agent stopped {check['stall_s']} s mid-window with {check['calls']} "
        f"calls: lost frames per call {check['per_call_lost']} "
        f"({'detected' if check['detected'] else 'NOT DETECTED'})",
        "",
        HEADER + "   (cpu%: what is measured, of its core; wait: ms it was runnable but not "
        "running; cores%: busy per CPU; KiB/s: RSS per session over idle; gaps: silent slots "
        "the transceiver played inside the agent's speech, its frame later than the grace)",
    ]
    lines += [step_line(r) for r in result["rows"]]
    lines += [
        "",
        f"knee: {s['knee_calls']} calls on one core ({measured} "
        f"{_fmt(s['measured_cpu_pct_at_knee'])} % of it), "
        f"RSS {_fmt(s['rss_kib_per_session'])} KiB per session over idle "
        f"{cfg['idle_rss_kib'] / 1024:.1f} MB ({_fmt(s['rss_kib_per_session_first_step'])} at "
        f"the first step, {s['first_step_calls']} calls)",
        f"first failing step: {s['first_failing_calls'] or '-'} calls "
        f"({', '.join(s['failed_on']) or '-'}); bound by: {s['bound_by']}",
        f"projected, not measured: {_fmt(s['calls_at_full_core_projected'], '.0f')} calls at "
        f"100 % of the core, at the knee's CPU per call",
    ]
    over = s.get("transceiver_over_floor_at_knee")
    if over is not None:
        lines.append(
            f"codec floor (the callers' frames decoded and their decodes encoded in a tight "
            f"loop, same core): {s['codec_floor_pct_per_call']:.2f} % of a core per call; the "
            f"transceiver at the knee is {over:.2f}x it (target <= {FLOOR_TARGET}x: "
            f"{'met' if over <= FLOOR_TARGET else 'MISSED'})"
        )
    ref = result.get("reference")
    if ref is not None:
        rs = ref["summary"]
        lines += ["", "reference: stock aiortc alone on that core, the same callers, loss alone"]
        lines += [HEADER] + [step_line(r) for r in ref["rows"]]
        ratio = f"{s['knee_calls'] / rs['knee_calls']:.2f}x" if rs["knee_calls"] else "-"
        # per call at each knee: what one core would hold of each, the bench's core aside
        mine, theirs = s["measured_cpu_pct_at_knee"], rs["measured_cpu_pct_at_knee"]
        per_call = (
            f"{(theirs / rs['knee_calls']) / (mine / s['knee_calls']):.2f}x"
            if mine and theirs and s["knee_calls"] and rs["knee_calls"]
            else "-"
        )
        lines += [
            f"stock knee: {rs['knee_calls']} calls on one core (stock "
            f"{_fmt(rs['measured_cpu_pct_at_knee'])} % of it, RSS "
            f"{_fmt(rs['rss_kib_per_session'])} KiB per session); first failing step "
            f"{rs['first_failing_calls'] or '-'} ({', '.join(rs['failed_on']) or '-'})",
            f"knee over stock's: {ratio} ({measured} on one core vs stock alone on it; "
            f"targets: transceiver >= 6x, whole path >= 4x); CPU per call at the knees: "
            f"stock's over firsthop's {per_call}",
        ]
    return "\n".join(lines)
