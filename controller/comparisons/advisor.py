"""The schedule advisor (docs/pages-run.md, "Schedule advisor"): what the simulator predicts for each
schedule on a finished run's own workload.

The engine is the one behind ``thundersync simulate --spans`` (learner/sim): the run's stored spans
become a ``Workload`` (``workload_from_spans``: each trajectory's rollout envelope and backward
work, group closes, optimizer and publish as recorded, slots and ranks from the lanes) and
``simulate_all`` replays it under sync, async, fully-async and streaming. Any schedule's run
will do (a sync run is enough): the recorded durations are the workload, the schedule only
decides when each piece ran. The run's first step (boot, first compile) is left out, as the
bench leaves out its warm-up.

Beside the predictions: R (a batch's rollout makespan alone) and L (its learner work alone, the
barrier included), their ratio and the regime it names, where a sync step goes, one sentence a
user acts on, and the model's error on this run's own schedule: the simulated step of that
schedule against the run's measured median step over the same steps.

Cost: in-process, in the request. The replay is linear in the spans and the steps replayed are
bounded (the last ``MAX_REPLAYED`` after the first): on a 5-step sync run of
configs/demo-balanced.yaml (6,776 spans, 4 steps replayed) the workload took 0.07 s of CPU and the
four schedules 0.25 s (docs/results.md). The result is cached per run and its stored data
(``cache_key``), so a page view after the first reads it back.
"""

from __future__ import annotations

import statistics
from typing import Any

from django.core.cache import cache

from learner.config import SCHEDULES
from learner.sim.engine import learner_alone_s, rollout_alone_s
from learner.sim.results import simulate_all
from learner.sim.workload import SimInputError, workload_from_spans
from learner.timeline import Metric

from controller.models import Run, Span, StepMetric

WARMUP_STEPS = 1  # the run's first step (boot, first compile) is not its workload
SIM_WARMUP = 1  # the simulated pipeline's fill, left out of its summary
MIN_STEPS = 2  # recorded steps after the warm-up that the replay needs
MAX_REPLAYED = 10  # the run's last steps replayed: a bounded cost however long the run
# R/L beyond these bounds: one side sets the step and overlap can hide at most the other
ROLLOUT_BOUND, LEARNER_BOUND = 1.5, 1 / 1.5
CACHE_S = 24 * 3600
FINISHED = (Run.Status.SUCCEEDED, Run.Status.FAILED, Run.Status.CANCELLED)
SPAN_FIELDS = ("seq", "step", "kind", "t0", "t1", "lane", "traj", "group", "turn", "policy_version", "tokens")


class NoAdvice(ValueError):
    """Why a run has no advice yet: ``field`` names what is missing (status, spans)."""

    def __init__(self, field: str, reason: str):
        super().__init__(reason)
        self.field = field


def run_events(run: Run, warmup: int = WARMUP_STEPS) -> list[dict[str, Any]]:
    """The run's stored spans and step metrics from step ``warmup`` on, as the JSONL events
    ``thundersync train --events`` writes (docs/architecture.md), its config first."""
    events: list[dict[str, Any]] = [{"type": "run", "status": "started", "config": run.config}]
    spans = Span.objects.filter(run=run, step__gte=warmup).order_by("seq").values_list(*SPAN_FIELDS)
    events += [{"type": "span", **dict(zip(SPAN_FIELDS, row))} for row in spans.iterator(chunk_size=5000)]
    for step, values in StepMetric.objects.filter(run=run, step__gte=warmup).order_by("step").values_list(
            "step", "values"):
        events.append({"type": "metrics", "step": step, "values": values})
    return events


def cache_key(run: Run) -> str:
    """Per run and what is stored of it: new spans or metrics (a resumed run) make a new key."""
    last = Span.objects.filter(run=run).order_by("-seq").values_list("seq", flat=True).first()
    created = run.created.timestamp() if run.created else 0  # a reused id (another database) is another run
    return f"advice:v1:{run.pk}:{created}:{run.status}:{last}:{StepMetric.objects.filter(run=run).count()}"


def advice(run: Run) -> dict[str, Any]:
    """The advice for a finished run, computed once per stored state (``cache_key``)."""
    if run.status not in FINISHED:
        raise NoAdvice("status", f"the run is {run.status}: the advisor replays a finished run's spans")
    key = cache_key(run)
    found = cache.get(key)
    if found is None:
        found = compute(run)
        cache.set(key, found, CACHE_S)
    return found


def regime(ratio: float | None) -> str:
    if ratio is None or ratio > ROLLOUT_BOUND:  # None: no learner work recorded
        return "rollout-bound"
    if ratio < LEARNER_BOUND:
        return "learner-bound"
    return "balanced"


def sentence(kind: str, ratio: float | None, rollout_s: float, learner_s: float, barrier_s: float,
             predicted: dict[str, dict]) -> str:
    """What a user needs to read off the predictions, in one sentence."""
    sync = predicted["sync"]["step_s"]
    stream = predicted["streaming"]
    if ratio is None:
        return f"rollout-bound: no learner work recorded; the rollout's {rollout_s:.2f} s is the step"
    if kind == "rollout-bound":
        return (f"rollout-bound: R/L {ratio:.1f}; streaming can save at most the learner's {learner_s:.2f} s of "
                f"sync's {sync:.2f} s step; try speculation (drafting while the engine idles in the rollout's tail)")
    if kind == "learner-bound":
        return (f"learner-bound: R/L {ratio:.1f}; the learner's {learner_s:.2f} s sets the step and any overlap hides "
                f"at most the rollout's {rollout_s:.2f} s; add learner ranks or train fewer trajectories a step")
    stale = "zero staleness" if stream["staleness_max"] == 0 else f"staleness {stream['staleness_mean']:.2f}"
    return (f"balanced: R/L {ratio:.1f}; streaming should reach {stream['speedup_vs_sync']:.1f}x sync at {stale} "
            f"(async {predicted['async']['speedup_vs_sync']:.1f}x at staleness "
            f"{predicted['async']['staleness_mean']:.2f}); what streaming cannot hide is the "
            f"{barrier_s:.2f} s of optimizer and publish")


def measured_step(run: Run, warmup: int) -> float | None:
    steps = [v for v in (m.get(Metric.STEP_S) for m in StepMetric.objects.filter(
        run=run, step__gte=warmup).values_list("values", flat=True)) if isinstance(v, (int, float))]
    return statistics.median(steps) if steps else None


def compute(run: Run) -> dict[str, Any]:
    """Replay the run's workload under every schedule (learner/sim)."""
    last = StepMetric.objects.filter(run=run).order_by("-step").values_list("step", flat=True).first()
    first = max(WARMUP_STEPS, (last or 0) - MAX_REPLAYED + 1)
    try:
        workload = workload_from_spans(run_events(run, first))
    except SimInputError as err:
        raise NoAdvice("spans", f"cannot replay this run: {err}") from None
    n = len(workload.batches)
    if n < MIN_STEPS:
        raise NoAdvice("spans", f"{n} trained step(s) after the first: the advisor needs {MIN_STEPS}")
    try:
        results = simulate_all(workload, SCHEDULES, steps=n + SIM_WARMUP, warmup=SIM_WARMUP, per_step=False)
        rollout_s = statistics.median(rollout_alone_s(workload, s) for s in range(n))
        learner_s = statistics.median(learner_alone_s(workload, s, "group-affinity") for s in range(n))
    except (ValueError, ZeroDivisionError) as err:  # a recording the model cannot replay: said, never a 500
        raise NoAdvice("spans", f"cannot replay this run: {err}") from None
    barrier_s = statistics.median(b.optimizer_s + b.publish_s for b in workload.batches) + workload.reduce_s
    ratio = rollout_s / learner_s if learner_s > 0 else None
    predicted = {name: {
        "schedule": name, "step_s": r.step_s, "speedup_vs_sync": r.speedup_vs_sync,
        "learner_idle": r.trainer_idle_ratio, "rollout_idle": r.rollouter_idle_ratio,
        "staleness_mean": r.staleness_mean, "staleness_max": r.staleness_max, "tail_s": r.tail_s,
    } for name, r in results.items()}
    own = run.config.get("train", {}).get("schedule", run.schedule.kind)
    measured = measured_step(run, first)
    simulated = predicted[own]["step_s"] if own in predicted else None
    kind = regime(ratio)
    return {
        "run": run.pk, "schedule": own, "steps_replayed": n, "first_step": first,
        "rollout_slots": workload.rollout_slots, "learner_ranks": workload.learner_ranks,
        "rollout_s": rollout_s, "learner_s": learner_s, "rl_ratio": ratio, "regime": kind,
        # where a sync step goes: the rollout alone, then the learner's backward and closes, then
        # the optimizer and publish no schedule hides
        "breakdown": {"rollout_s": rollout_s, "backward_s": max(learner_s - barrier_s, 0.0), "barrier_s": barrier_s},
        "schedules": [predicted[name] for name in SCHEDULES],
        "measured_step_s": measured, "simulated_step_s": simulated,
        "model_error": (simulated - measured) / measured if measured and simulated is not None else None,
        "advice": sentence(kind, ratio, rollout_s, learner_s, barrier_s, predicted),
    }
