"""Equal-work windows: a row's step time charged for the backlog its measured window consumed
(docs/bench-report.md, "Equal-work windows").

A row's measured window trains ``steps x batch`` trajectories. A pipelined schedule can train
trajectories produced before the window began: fully-async starts up to ``max_staleness + 1``
batches' groups at once, so over a few measured steps it drains that backlog and steps faster
than it could keep up. Over the same window, the trajectories the rollout *finished* (reward
arrivals: one ``rollout.verify`` span each), less the members of groups dropped as too stale,
are what the window produced for training. The equal-work step is the window's length per batch
*produced*:

    step_equal_work_s = window_s x batch / produced

and ``backlog_per_step`` = (trained − produced) / steps: positive when the window lived off work
done before it. In a steady state the two counts agree and the equal-work step is the mean step.
"""

from __future__ import annotations

from typing import Any

from learner.timeline import Kind, Metric


def equal_work(runs: list[list[dict[str, Any]]], kept_per_run: list[list[dict[str, float]]], batch: int,
               group_size: int) -> dict[str, Any]:
    """``step_equal_work_s``, ``produced_per_step`` and ``backlog_per_step`` of one row, pooled over its runs."""
    window = produced = trained = 0.0
    steps = 0
    for events, kept in zip(runs, kept_per_run):
        t0, t1 = kept[0][Metric.T_START], kept[-1][Metric.T_END]
        finished = sum(1 for e in events if e.get("type") == "span" and e["kind"] == Kind.VERIFY
                       and e["lane"].startswith("rollout/") and t0 < e["t1"] <= t1)
        dropped = sum(v.get(Metric.DROPPED_GROUPS, 0.0) for v in kept) * group_size
        window += t1 - t0
        produced += max(finished - dropped, 0.0)
        trained += len(kept) * batch
        steps += len(kept)
    return {"step_equal_work_s": charged_step(window, trained, produced, steps),
            "produced_per_step": produced / steps, "backlog_per_step": (trained - produced) / steps}


def charged_step(window_s: float, trained: float, produced: float, steps: int) -> float | None:
    """The window per batch produced: ``window_s`` over ``steps`` steps that trained ``trained``
    trajectories while ``produced`` were produced for training (None when none was)."""
    return window_s * trained / steps / produced if produced and steps else None
