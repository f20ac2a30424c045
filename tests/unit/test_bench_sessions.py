"""`bench sessions`' summary: a reference that could not keep up is flagged, not believed."""

from __future__ import annotations

from typing import Any

from firsthop.services.bench.sessions import COSTS, render, summarize


def _row(target: str, cpu: float, loss: float, calls: int = 8) -> dict[str, Any]:
    labels = COSTS[target]
    return {
        "calls": calls,
        "round": 1,
        "connected": calls,
        "target": target,
        "cpu_pct_of_core": {target if target != "firsthop" else "transceiver": cpu},
        "costs": {
            label: {"cpu_pct_per_session": cpu / calls, "sessions_per_core": 100 * calls / cpu}
            for label in labels
        },
        "loss_pct_median": loss,
        "loss_pct_max": loss,
        "all_heard_own": True,
        "caller_cpu_pct_of_core": 50.0,
    }


def _result(stock_cpu: float, stock_loss: float) -> dict[str, Any]:
    rows = [_row("firsthop", 20.0, 0.0), _row("stock", stock_cpu, stock_loss)]
    rows.append(_row("stock-mono", 60.0, 0.0))
    config = {"seconds": 15, "warmup": 2, "rounds": 1, "workers": 2, "server_cpu": 0}
    config["caller_cpu"] = 1
    return {"config": config, "rows": rows, "summary": summarize(rows, [8]), "floor": None}


def test_a_reference_that_lost_frames_or_filled_its_core_is_flagged_saturated() -> None:
    for cpu, loss in ((99.3, 27.0), (96.0, 0.0), (70.0, 0.6)):
        result = _result(cpu, loss)
        summary = result["summary"]["8"]
        assert summary["saturated"] == {"stock": True, "stock-mono": False}, (cpu, loss)
        text = render(result)
        assert "stock SATURATED" in text and "x stock is a lower bound" in text
        assert "stock-mono SATURATED" not in text
    calm = _result(60.0, 0.2)
    assert calm["summary"]["8"]["saturated"] == {"stock": False, "stock-mono": False}
    assert "SATURATED" not in render(calm)
