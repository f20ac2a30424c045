"""`firsthop bench relay --quick`: the whole bench runs and measures every forwarder.

Only that it works end to end: packets reach the sink through the C reference, the Python floor
and the relay, and each has a CPU cost. No timing thresholds here (the machines are shared and
noisy); the targets belong to the bench's own report.
"""

from __future__ import annotations

import pytest

from tests.support import run_bench

pytestmark = pytest.mark.serial  # (it measures CPU: alone, after the rest)


def test_quick_bench_measures_c_reference_python_floor_and_relay() -> None:
    result = run_bench("relay", "--quick", timeout=60)
    rows = result["rows"]
    for target in ("c", "py", "relay"):
        mine = [r for r in rows if r["target"] == target and not r.get("worker_restarted")]
        assert mine, f"no {target} rows"
        for row in mine:
            assert row["received"] > 0, row
            assert row["loss_pct"] < 5, row
            assert row["cpu_us_per_packet"] > 0, row
    assert {r["target"] for r in rows} == {"direct", "c", "py", "relay"}
    assert set(result["summary"]["targets"]) == {"cpu_ratio", "throughput", "latency"}
    assert result["summary"]["max"]["py_cpu_ratio"] > 0
