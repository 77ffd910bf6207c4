"""The bench's named workloads, and how long-tailed a workload's trajectories are.

    default    configs/bench.yaml: arith-tool, 2-4 turns, lognormal tool latency (sigma 0.5),
               its scale calibrated so that R = L (``--balance 1``)
    longtail   configs/bench-longtail.yaml: 1-5 turns, Pareto tool latency (alpha 1.1, cut at
               3 s): a model of SWE-style agent tools, most calls quick and a few (test runs,
               builds) two orders of magnitude longer; run at the config's own scale, so a
               rollout ends in a latency-bound tail on a mostly idle engine (R >> L)

A trajectory's time is the envelope of its rollout spans (first span's start to the last
one's end, tool waits included), as the simulator replays it (docs/schedules.md).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learner.bench.measure import measured_steps

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@dataclass(frozen=True)
class Workload:
    config: Path
    balance: float | None  # the default --balance; None: the config's tool latency at its own scale


WORKLOADS = {"default": Workload(CONFIGS / "bench.yaml", 1.0),
             "longtail": Workload(CONFIGS / "bench-longtail.yaml", None)}


def trajectory_seconds(events: list[dict[str, Any]], warmup: int, end: int | None = None) -> list[float]:
    """Each trajectory's time (its rollout spans' envelope) in the measured steps of one run."""
    measured = {v["step"] for v in measured_steps(events, warmup, end)}
    first: dict[tuple[int, int], float] = defaultdict(lambda: float("inf"))
    last: dict[tuple[int, int], float] = defaultdict(lambda: float("-inf"))
    for e in events:
        if e.get("type") == "span" and e["lane"].startswith("rollout/") and e["step"] in measured:
            key = (e["step"], e["traj"])
            first[key], last[key] = min(first[key], e["t0"]), max(last[key], e["t1"])
    return [last[k] - first[k] for k in first]


def tail_summary(runs: list[list[dict[str, Any]]], warmup: int, end: int | None = None) -> dict[str, float]:
    """Quantiles of trajectory time over the measured steps of ``runs``, pooled, and p99 / p50:
    how long a workload's tail is (the long-tail workload's target: p99 / p50 >= 8)."""
    times = [t for events in runs for t in trajectory_seconds(events, warmup, end)]
    if len(times) < 2:
        return {}
    cuts = statistics.quantiles(times, n=100, method="inclusive")
    p50, p90, p99 = cuts[49], cuts[89], cuts[98]
    return {"trajectories": len(times), "p50_s": p50, "p90_s": p90, "p99_s": p99, "max_s": max(times),
            "p99_over_p50": p99 / p50}
