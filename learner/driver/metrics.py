"""Per-step metrics as a pure function of the step's spans, trajectories and learner stats
(names as verl's where one exists; docs/spans.md lists them)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from learner.driver import rules
from learner.tasks.env import task_metrics
from learner.timeline import Metric, union_length, window_metrics
from learner.trajectory import Trajectory
from learner.registries.schedules import schedule_kind


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
    values[Metric.TRAINER_WAIT] = union_length(waits, rec.t_start, t_end) / max(width, 1e-12)
    staleness = [rules.staleness(rec.trained_version, v) for t in rec.trajs for v in t.turn_versions]
    rewards = [t.reward for t in rec.trajs]
    last_reward = max(t.t_reward for t in rec.trajs)
    values.update({
        Metric.STEP_S: width,
        Metric.LEARNER_S: (1.0 - values[Metric.TRAINER_IDLE]) * width,
        Metric.GEN_S: (1.0 - values[Metric.ROLLOUT_IDLE]) * width,
        Metric.TAIL_S: t_end - last_reward,
        Metric.T_START: rec.t_start,
        Metric.T_END: t_end,
        Metric.LAST_REWARD_T: last_reward,
        Metric.FIRST_BACKWARD_T: rec.first_backward if rec.first_backward is not None else float("nan"),
        Metric.STALENESS_MEAN: sum(staleness) / max(len(staleness), 1),
        Metric.STALENESS_MAX: float(max(staleness, default=0)),
        # the staleness histogram (the compare page draws it from these, not from spans)
        **{f"{Metric.STALENESS_TURNS}{k}": float(n) for k, n in sorted(Counter(staleness).items())},
        Metric.REWARD_MEAN: sum(rewards) / len(rewards),
        Metric.TURNS_MEAN: sum(len(t.turn_versions) for t in rec.trajs) / len(rec.trajs),
        Metric.TOKENS: float(sum(t.n_scored for t in rec.trajs)),
        Metric.GRAD_NORM: rec.learner_stats.get("grad_norm", 0.0),
        **memory_mb,
        Metric.VERSION: float(version),
        **rec.mismatch,
        **task_metrics(rec.trajs),
    })
    if schedule_kind(schedule).follows_latest:
        values[Metric.DROPPED_GROUPS] = float(rec.dropped_groups)
    for stat, name in (("clip_frac", Metric.CLIP_FRAC), ("peak_buffers", Metric.PEAK_BUFFERS),
                       ("skipped_trajectories", Metric.SKIPPED_TRAJECTORIES),
                       ("speculative_trajectories", Metric.SPECULATIVE_TRAJECTORIES),
                       ("micro_batches", Metric.MICRO_BATCHES), ("peak_accumulator_mb", Metric.PEAK_ACCUMULATOR_MB),
                       ("open_row_cost", Metric.OPEN_ROW_COST), ("padding_share", Metric.PADDING_SHARE),
                       ("shared_prompt_rows", Metric.SHARED_PROMPT_ROWS), ("token_slots", Metric.TOKEN_SLOTS),
                       ("cpu_s", Metric.LEARNER_CPU_S), ("open_rows", Metric.OPEN_ROWS),
                       ("open_micro_batches", Metric.OPEN_MICRO_BATCHES),
                       ("early_micro_batches", Metric.EARLY_MICRO_BATCHES),
                       ("peak_memory_mb", Metric.PEAK_LEARNER_MEMORY_MB),
                       ("early_row_share", Metric.EARLY_ROW_SHARE), ("early_cost_ratio", Metric.EARLY_COST_RATIO)):
        if stat in rec.learner_stats:
            values[name] = float(rec.learner_stats[stat])
    for stat, value in rec.learner_stats.items():
        if stat.startswith("deferred_"):
            values[Metric.DEFERRED + stat.removeprefix("deferred_")] = float(value)
    values[Metric.LATE_CLOSE_SHARE] = late_close_share(rec.trajs, rec.t_start, last_reward)
    return values


# the "last tenth" of ``learner/late_close_share``
LATE_CLOSE_TAIL = 0.1


def late_close_share(trajs: list[Trajectory], t_start: float, last_reward: float) -> float:
    """The share of the step's groups whose last reward came in the last ``LATE_CLOSE_TAIL`` of the
    step's rollout (from the step's start, or its first reward if earlier, to its last reward):
    work that can only be learnt in the tail, whatever the drain does."""
    closes: dict[int, float] = {}
    for t in trajs:
        closes[t.group] = max(closes.get(t.group, t.t_reward), t.t_reward)
    if not closes:
        return 0.0
    start = min(t_start, min(t.t_reward for t in trajs))
    cut = last_reward - LATE_CLOSE_TAIL * (last_reward - start)
    return sum(c >= cut for c in closes.values()) / len(closes)
