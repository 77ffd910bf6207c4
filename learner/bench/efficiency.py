"""Efficiency: each row's step against the least step its own schedule could take with the work
it did (docs/bench-report.md, "Efficiency"), so 1.0 means nothing was left on the table for that
schedule, whichever other rows or runs it is compared with.

Per row, over each run's measured window (first measured step's start to the last one's end;
the driver's step windows tile it), per step:

    engine_busy_s   the union of the engine's own work on each rollout worker (every rollout
                    span but the modelled tool wait: generation, the tool's real time,
                    verification, teacher scoring, drafting), averaged over the workers
    learner_work_s  the union of the learner spans on each learner rank (backward, group
                    closes, optimizer, publish), averaged over the ranks
    barrier_s       the part of that learner work after the batch's last reward by any
                    schedule's rule: the optimizer step and the publish
    step_mean_s     window length / measured steps

The bound is what the schedule's own rule lets overlap (``overlap_rule``):

    serial       sync: the learner starts after the last reward and the next rollout after
                 the publish, so engine and learner work add up: E + L
    barrier      streaming: learning overlaps the rollout, the optimizer and the publish
                 cannot: max(E + B, L)
    overlapped   async, fully-async and every speculative row (drafts run beside the
                 learner): max(E, L)

Each is at most step_mean_s on any run of that schedule (the work it sums is disjoint in time by
the schedule's rule, per worker and per rank), so efficiency = bound / step_mean_s <= 1.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from learner.timeline import Kind, LEARNER_KINDS, Metric, union_length
from learner.registries.schedules import schedule_kind

# a modelled wait holds a trajectory, not the engine (task.tool_latency)
NOT_ENGINE_WORK = (Kind.TOOL_WAIT,)
# learner work after the batch's last reward under every on-policy rule
BARRIER_KINDS = (Kind.OPTIMIZER, Kind.PUBLISH)

SERIAL, BARRIER, OVERLAPPED = "serial", "barrier", "overlapped"


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
    barrier_spans: list[tuple[str, float, float]] = []
    for s in spans:
        resource = _resource(s["lane"], s["kind"])
        if resource is not None and s["t1"] > t0 and s["t0"] < t1:
            intervals[resource].append((s["t0"], s["t1"]))
            if s["kind"] in BARRIER_KINDS:
                barrier_spans.append((resource, s["t0"], s["t1"]))

    def mean_busy(prefix: str) -> float:
        lanes = [iv for name, iv in intervals.items() if name.startswith(prefix)]
        return sum(union_length(iv, t0, t1) for iv in lanes) / len(lanes) if lanes else 0.0

    def mean_barrier() -> float:
        ranks = defaultdict(list)
        for sp in barrier_spans:
            ranks[sp[0]].append(sp[1:])
        return sum(union_length(iv, t0, t1) for iv in ranks.values()) / len(ranks) if ranks else 0.0

    return {"engine": mean_busy("rollout/"), "learner": mean_busy("learner/"), "barrier": mean_barrier()}


def work_per_step(runs: list[list[dict[str, Any]]], kept: list[list[dict[str, float]]]) -> dict[str, float]:
    """engine_busy_s, learner_work_s, barrier_s and step_mean_s of one row: ``kept`` holds each
    run's measured steps (``measure.measured_steps``), whose windows are pooled."""
    totals = {"engine": 0.0, "learner": 0.0, "barrier": 0.0}
    window = 0.0
    steps = 0
    for events, measured in zip(runs, kept):
        t0, t1 = measured[0][Metric.T_START], measured[-1][Metric.T_END]
        work = window_work((e for e in events if e.get("type") == "span"), t0, t1)
        for key in totals:
            totals[key] += work[key]
        window, steps = window + t1 - t0, steps + len(measured)
    return {"engine_busy_s": totals["engine"] / steps, "learner_work_s": totals["learner"] / steps,
            "barrier_s": totals["barrier"] / steps, "step_mean_s": window / steps}


def overlap_rule(schedule: str, speculation: bool = False) -> str:
    """What a schedule lets overlap: ``serial`` (sync), ``barrier`` (streaming), ``overlapped``
    (async, fully-async, and any schedule drafting the next step beside the learner)."""
    kind = schedule_kind(schedule)
    if speculation or not kind.on_policy:
        return OVERLAPPED
    return SERIAL if kind.baseline else BARRIER


def own_bound(work: dict[str, float], rule: str) -> dict[str, Any]:
    """``bound_s``: the least step the row's own work allows under ``rule`` (module docstring),
    and ``efficiency`` = bound_s / step_mean_s, at most 1 on any run of that schedule."""
    engine, learner, barrier = work["engine_busy_s"], work["learner_work_s"], work.get("barrier_s", 0.0)
    if rule == SERIAL:
        bound = engine + learner
    elif rule == BARRIER:
        bound = max(engine + barrier, learner)
    else:
        bound = max(engine, learner)
    return {"bound_engine_s": engine, "bound_learner_s": learner, "bound_barrier_s": barrier,
            "bound_rule": rule, "bound_s": bound, "efficiency": bound / work["step_mean_s"]}


def row_rule(name: str) -> str:
    """The overlap rule of a bench row by its name: ``sync``, ``sync-per-trajectory``,
    ``streaming+spec``, ..."""
    schedule, _, variant = name.partition("+")
    return overlap_rule(schedule.removesuffix("-per-trajectory"), speculation=variant == "spec")
