"""Per-step metrics as a pure function of the step's spans, trajectories and learner stats
(names as verl's where one exists; docs/spans.md lists them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from learner.driver import rules
from learner.rollout.env import task_metrics
from learner.timeline import union_length, window_metrics
from learner.trajectory import Trajectory


@dataclass
class StepRecord:
    """What one optimizer step consumed, for its metrics."""

    step: int
    t_start: float
    trajs: list[Trajectory] = field(default_factory=list)
    trained_version: int = 0
    first_backward: float | None = None
    learner_stats: dict = field(default_factory=dict)
    mismatch: dict = field(default_factory=dict)
    dropped_groups: int = 0  # fully-async: groups found too stale during this step


def step_metrics(rec: StepRecord, spans: list[dict], t_end: float, waits: list[tuple[float, float]],
                 version: int, schedule: str, memory_mb: dict[str, float]) -> dict[str, float]:
    """Metrics of the step ``rec`` that ran from ``rec.t_start`` to ``t_end`` (its publish).

    ``spans``: span events overlapping the window; ``waits``: run-clock intervals the driver
    was blocked on the rollout fleet for data; ``version``: the policy version after the
    step's publish; ``memory_mb``: the ``memory/*`` values measured by the caller."""
    width = t_end - rec.t_start
    values = window_metrics(spans, rec.t_start, t_end)
    # verl's fully-async trainer/idle_ratio: the share of the step spent blocked waiting
    # for rollout data (ours above is stricter: no learner span running, so the learner's
    # own bookkeeping between spans counts as idle too)
    values["trainer/wait_ratio"] = union_length(waits, rec.t_start, t_end) / max(width, 1e-12)
    staleness = [rules.staleness(rec.trained_version, v) for t in rec.trajs for v in t.turn_versions]
    rewards = [t.reward for t in rec.trajs]
    last_reward = max(t.t_reward for t in rec.trajs)
    values.update({
        "timing_s/step": width,
        "timing_s/learner": (1.0 - values["trainer/idle_ratio"]) * width,
        "timing_s/gen": (1.0 - values["rollouter/idle_ratio"]) * width,
        "timing_s/tail": t_end - last_reward,
        "step/t_start": rec.t_start,
        "step/t_end": t_end,
        "step/last_reward_t": last_reward,
        "step/first_backward_t": rec.first_backward if rec.first_backward is not None else float("nan"),
        "staleness/mean": sum(staleness) / max(len(staleness), 1),
        "staleness/max": float(max(staleness, default=0)),
        "reward/mean": sum(rewards) / len(rewards),
        "response/turns_mean": sum(len(t.turn_versions) for t in rec.trajs) / len(rec.trajs),
        "response/tokens": float(sum(t.n_scored for t in rec.trajs)),
        "actor/grad_norm": rec.learner_stats.get("grad_norm", 0.0),
        **memory_mb,
        "policy/version": float(version),
        **rec.mismatch,
        **task_metrics(rec.trajs),
    })
    if schedule == "fully-async":
        values["rollout/dropped_groups"] = float(rec.dropped_groups)
    for k in ("clip_frac", "peak_buffers"):
        if k in rec.learner_stats:
            values[f"actor/{k}"] = float(rec.learner_stats[k])
    return values
