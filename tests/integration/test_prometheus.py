"""Monitoring for operators, with a real Prometheus (Debian's `prometheus`, `promtool`):
monitoring/rules.yml checked and unit-tested by promtool, then loaded into a Prometheus that
scrapes a running edge (relay, transceiver, signaling on loopback) while a call goes through;
every rule evaluates, and every metric the Grafana dashboard and the rules name exists."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import socket
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from firsthop.services.call.caller import Caller, ToneTrack
from tests.integration.test_transceiver import hears, ingress, signal_via
from tests.support import (
    AgentProcess,
    RelayProcess,
    SignalingProcess,
    TransceiverProcess,
    eventually,
    free_tcp_port,
    start_all,
    wait_until,
)

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "monitoring"
JOBS = ("firsthop-relay", "firsthop-transceiver", "firsthop-signaling")


def tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed: run scripts/ensure-system-deps prometheus")
    return path


def promtool(*args: str) -> str:
    done = subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, timeout=60, cwd=MONITORING
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_promtool_checks_the_rules_and_the_example_config() -> None:
    assert "SUCCESS: 13 rules found" in promtool("check", "rules", "rules.yml")
    assert "SUCCESS" in promtool("check", "config", "prometheus.yml")


def test_promtool_unit_tests_every_alert() -> None:
    assert "SUCCESS" in promtool("test", "rules", "rules_test.yml")
    tested = set(re.findall(r"alertname: (\w+)", (MONITORING / "rules_test.yml").read_text()))
    alerts = {r["alert"] for g in rules()["groups"] for r in g["rules"] if "alert" in r}
    assert tested == alerts
    assert len(alerts) == 7


def rules() -> Any:
    return yaml.safe_load((MONITORING / "rules.yml").read_text())


def named_metrics(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (ours all start with `firsthop`)."""
    return set(re.findall(r"\b(firsthop[_:][a-z0-9_:]*)", expr))


def dashboard_exprs() -> list[str]:
    board = json.loads((MONITORING / "grafana" / "firsthop.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    return exprs


class Prometheus:
    def __init__(self, config: Path, data: Path) -> None:
        self.port = free_tcp_port()
        self.log = (data / "prometheus.log").open("w")
        self.proc = subprocess.Popen(
            [
                tool("prometheus"),
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )

    def api(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}{query}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2):
                return True
        except OSError:
            return False

    def query(self, expr: str) -> list[Any]:
        return list(self.api("query", query=expr)["result"])

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)
        self.log.close()


@pytest.fixture
def edge() -> Iterator[tuple[RelayProcess, TransceiverProcess, SignalingProcess]]:
    relay = RelayProcess()
    agent = AgentProcess("echo")
    start_all(relay, agent)
    tx = TransceiverProcess(agent_url=agent.url)
    tx.start()
    sig = SignalingProcess("--transceiver", tx.api, "--ingress", f"a=127.0.0.1:{relay.listen[1]}")
    sig.start()
    try:
        yield relay, tx, sig
    finally:
        for p in (sig, tx, agent):
            p.kill()
        relay.kill()


@pytest.mark.timeout(180)
def test_a_real_prometheus_scrapes_the_edge_and_evaluates_every_rule(
    edge: tuple[RelayProcess, TransceiverProcess, SignalingProcess], tmp_path: Path
) -> None:
    relay, tx, sig = edge
    targets = {
        "firsthop-relay": f"{relay.metrics_addr[0]}:{relay.metrics_addr[1]}",
        "firsthop-transceiver": tx.api.removeprefix("http://"),
        "firsthop-signaling": f"127.0.0.1:{sig.port}",
    }
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(MONITORING / "rules.yml")],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": [addr]}]}
            for job, addr in targets.items()
        ],
    }
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    prom = Prometheus(path, tmp_path)
    try:
        wait_until(prom.ready, timeout=30)

        def all_up() -> bool:
            active = prom.api("targets")["activeTargets"]
            return len(active) == 3 and all(t["health"] == "up" for t in active)

        wait_until(all_up, timeout=30)

        async def call() -> None:  # a call through the relay: setup, packets, RTT at its end
            caller = Caller(ToneTrack(440))
            await caller.start(signal_via(tx, ingress(relay)))
            await asyncio.wait_for(caller.wait_connected(), 10)
            await eventually(lambda: hears(caller, 440))
            await asyncio.sleep(3)  # a few scrapes with the call live
            await caller.close()

        asyncio.run(call())
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as junk:  # one counted drop
            junk.sendto(b"\x00" * 20, relay.listen)
        urllib.request.urlopen(f"{sig.url}/healthz", timeout=5).close()

        # the recording rules see the call: packets both ways, a session counted against capacity
        def rate_seen() -> bool:
            rows = prom.query("firsthop:relay_packets:rate5m")
            return {r["metric"].get("direction") for r in rows if float(r["value"][1]) > 0} >= {
                "upstream",
                "downstream",
            }

        wait_until(rate_seen, timeout=30)
        (ratio,) = prom.query("max_over_time(firsthop:transceiver_sessions:ratio[1m])")
        assert float(ratio["value"][1]) == pytest.approx(1 / 200)  # one call of --capacity 200

        def p95() -> float:  # NaN (no setups in the window) until the call's is seen
            rows = prom.query("firsthop:session_setup_seconds:p95")
            return float(rows[0]["value"][1]) if rows else float("nan")

        wait_until(lambda: p95() > 0, timeout=30)
        assert 0 < p95() < 5
        wait_until(lambda: prom.query("firsthop:relay_drops:rate5m"), timeout=30)

        # what the alerts rate() is there from the start, at 0: the first failure is an increase
        for series in (
            'firsthop_signaling_events_total{event="redis_errors"}',
            'firsthop_signaling_events_total{event="transceiver_failures"}',
            'firsthop_transceiver_events_total{event="agent_failures"}',
            'firsthop_transceiver_events_total{event="session_errors"}',
        ):
            (row,) = prom.query(f"min_over_time({series}[1m])")
            assert float(row["value"][1]) == 0, series

        # every rule loaded and evaluated without error; none fires on this healthy edge
        groups = prom.api("rules")["groups"]
        loaded = [r for g in groups for r in g["rules"]]
        assert len(loaded) == 13
        assert all(r["health"] == "ok" for r in loaded), [r for r in loaded if r["health"] != "ok"]
        firing = [a for a in prom.api("alerts")["alerts"] if a["state"] == "firing"]
        assert firing == []

        # every metric the dashboard and the rules name is one this edge exposes (or records)
        recorded = {r["record"] for g in rules()["groups"] for r in g["rules"] if "record" in r}
        wanted = set().union(*(named_metrics(e) for e in dashboard_exprs()))
        for group in rules()["groups"]:
            for rule in group["rules"]:
                wanted |= named_metrics(rule["expr"])

        def missing() -> set[str]:
            have = set(prom.api("label/__name__/values")) | recorded
            # a histogram is named by its _bucket series
            return {n for n in wanted if n not in have and f"{n}_bucket" not in have}

        try:
            wait_until(lambda: not missing(), timeout=30)
        except AssertionError:
            raise AssertionError(f"named but never exposed: {sorted(missing())}") from None
    finally:
        prom.stop()
