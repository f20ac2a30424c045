"""`firsthop bench relay --quick`: the whole bench runs and measures both forwarders.

Only that it works end to end: packets reach the sink through the C reference and the relay,
and both have a CPU cost. No timing thresholds here (the machines are shared and noisy); the
targets belong to the bench's own report.
"""

from __future__ import annotations

from tests.support import run_bench


def test_quick_bench_measures_c_reference_and_relay() -> None:
    result = run_bench("relay", "--quick", timeout=60)
    rows = result["rows"]
    for target in ("c", "relay"):
        mine = [r for r in rows if r["target"] == target and not r.get("worker_restarted")]
        assert mine, f"no {target} rows"
        for row in mine:
            assert row["received"] > 0, row
            assert row["loss_pct"] < 5, row
            assert row["cpu_us_per_packet"] > 0, row
    assert {r["target"] for r in rows} == {"direct", "c", "relay"}
    assert set(result["summary"]["targets"]) == {"cpu_ratio", "throughput", "latency"}
