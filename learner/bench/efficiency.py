"""The bench's efficiency bound: the least work per step that the engine and the learner did in
any row, so that no schedule can exceed efficiency 1 (docs/bench.md, "Efficiency").

Per row, over each run's measured window (first measured step's start to the last one's end;
the driver's step windows tile it):

    engine_busy_s   per step, the union of the engine's own work on each rollout worker (every
                    rollout span but the modelled tool wait: generation, the tool's real time,
                    verification, teacher scoring, drafting), averaged over the workers
    learner_work_s  per step, the union of the learner spans on each learner rank (backward,
                    group closes, optimizer, publish), averaged over the ranks
    step_mean_s     window length / measured steps

A worker or a rank does at most one window of work in one window, so each row's own
max(engine_busy_s, learner_work_s) <= its step_mean_s. The bound is max(least engine_busy_s,
least learner_work_s) over the rows compared, and efficiency = bound / step_mean_s <= 1 for
every row. The rollout makespan R (which a schedule that overlaps two batches' tool waits
undercuts) and the sync learner's wall time L stay in the report as properties of the workload.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from learner.timeline import Kind, LEARNER_KINDS, Metric, union_length

# a modelled wait holds a trajectory, not the engine (task.tool_latency)
NOT_ENGINE_WORK = (Kind.TOOL_WAIT,)


def _resource(lane: str, kind: str) -> str | None:
    """The engine or learner rank a span's work ran on: ``rollout/<w>`` for every span of a
    rollout lane (``rollout/<w>/<trajectory>``) but a modelled wait, ``learner/<r>`` for a
    learner span; None for what occupies neither (a replica's weight load, a wait)."""
    parts = lane.split("/")
    if parts[0] == "rollout" and kind not in NOT_ENGINE_WORK:
        return f"rollout/{parts[1]}"
    if parts[0] == "learner" and kind in LEARNER_KINDS:
        return f"learner/{parts[1]}" if len(parts) > 1 else "learner/0"
    return None


def window_work(spans: Iterable[dict[str, Any]], t0: float, t1: float) -> dict[str, float]:
    """Seconds of work in [t0, t1]: the engines' and the learner ranks', each the mean over its
    workers / ranks of the union of their spans (overlapping rows of one batch count once)."""
    intervals: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in spans:
        resource = _resource(s["lane"], s["kind"])
        if resource is not None and s["t1"] > t0 and s["t0"] < t1:
            intervals[resource].append((s["t0"], s["t1"]))

    def mean_busy(prefix: str) -> float:
        lanes = [iv for name, iv in intervals.items() if name.startswith(prefix)]
        return sum(union_length(iv, t0, t1) for iv in lanes) / len(lanes) if lanes else 0.0

    return {"engine": mean_busy("rollout/"), "learner": mean_busy("learner/")}


def work_per_step(runs: list[list[dict[str, Any]]], kept: list[list[dict[str, float]]]) -> dict[str, float]:
    """engine_busy_s, learner_work_s and step_mean_s of one row: ``kept`` holds each run's measured
    steps (``measure.measured_steps``), whose windows are pooled."""
    engine = learner = window = 0.0
    steps = 0
    for events, measured in zip(runs, kept):
        t0, t1 = measured[0][Metric.T_START], measured[-1][Metric.T_END]
        work = window_work((e for e in events if e.get("type") == "span"), t0, t1)
        engine, learner, window, steps = engine + work["engine"], learner + work["learner"], window + t1 - t0, steps + len(measured)
    return {"engine_busy_s": engine / steps, "learner_work_s": learner / steps, "step_mean_s": window / steps}


def efficiency_bound(rows: dict[str, dict[str, Any]], alone: set[str]) -> dict[str, dict[str, float]]:
    """Per row: ``bound_s`` = max(least engine_busy_s, least learner_work_s) over the rows not in
    ``alone`` (a row in ``alone``, another learner's reference, is held against its own work) and
    ``efficiency`` = bound_s / step_mean_s, at most 1 by construction."""
    pooled = [r for name, r in rows.items() if name not in alone]
    least = {key: min(r[key] for r in pooled) for key in ("engine_busy_s", "learner_work_s")}
    out = {}
    for name, r in rows.items():
        work = r if name in alone else least
        bound = max(work["engine_busy_s"], work["learner_work_s"])
        out[name] = {"bound_engine_s": work["engine_busy_s"], "bound_learner_s": work["learner_work_s"],
                     "bound_s": bound, "efficiency": bound / r["step_mean_s"]}
    return out
