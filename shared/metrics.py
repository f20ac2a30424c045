"""Prometheus text exposition (format 0.0.4) without a global registry.

Services build `MetricFamily` lists from their own state when scraped, so a relay can add up
its worker processes' snapshots and nothing on a packet path touches a metrics library.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Labels = Mapping[str, str]


@dataclass
class MetricFamily:
    name: str
    kind: str  # counter | gauge | histogram
    help: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> MetricFamily:
        self.samples.append((labels, value))
        return self


@dataclass
class Histogram:
    """A cumulative histogram with fixed upper bounds (seconds)."""

    name: str
    help: str
    buckets: Sequence[float]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        self.total += value
        self.count += 1
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1

    def render(self) -> str:
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for bound, n in zip(self.buckets, self.counts, strict=True):
            lines.append(f'{self.name}_bucket{{le="{_num(bound)}"}} {n}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{self.name}_sum {_num(self.total)}")
        lines.append(f"{self.name}_count {self.count}")
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _num(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def render(families: Iterable[MetricFamily | Histogram]) -> str:
    out: list[str] = []
    for fam in families:
        if isinstance(fam, Histogram):
            out.append(fam.render())
            continue
        out.append(f"# HELP {fam.name} {fam.help}\n# TYPE {fam.name} {fam.kind}\n")
        for labels, value in fam.samples:
            if labels:
                text = ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items()))
                out.append(f"{fam.name}{{{text}}} {_num(value)}\n")
            else:
                out.append(f"{fam.name} {_num(value)}\n")
    return "".join(out)


def parse_text(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Parse exposition text back into {(name, labels): value} (tests and the CLI use it)."""
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        name, _, rest = head.partition("{")
        labels: list[tuple[str, str]] = []
        if rest:
            for part in rest.rstrip("}").split(","):
                if part:
                    k, _, v = part.partition("=")
                    labels.append((k, v.strip('"')))
        out[(name, frozenset(labels))] = float(value)
    return out
