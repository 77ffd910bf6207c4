"""What each bench row trained, beside how fast (docs/bench.md, "Throughput and what was trained").

Step time alone flatters a schedule that trains other trajectories: fully-async learns the groups
that finish first, so its batches hold shorter, easier trajectories than the on-policy schedules
sample. Per row, over its measured steps: trained tokens and trajectories per second of window,
the mean generated tokens and turns of a trained trajectory, its mean reward and the groups
dropped as too stale; against sync, the ratio of response lengths with a bootstrap interval,
and a warning when that interval excludes 1 by more than ``TOLERANCE``.
"""

from __future__ import annotations

import statistics
from typing import Any

from learner.bench.intervals import ratio_interval
from learner.timeline import Metric

TOLERANCE = 0.05  # a 5% difference in mean response length is worth a word, once it is beyond noise
LENGTH = Metric.RESPONSE_LENGTH + "mean"


def trained_figures(steps: list[dict[str, float]], step_mean_s: float) -> dict[str, Any]:
    """Per-row throughput and trained distribution from its measured steps' metrics."""
    lengths = [v[LENGTH] for v in steps if LENGTH in v]
    tokens = [v[Metric.TOKENS] for v in steps if Metric.TOKENS in v]
    counted = [v[Metric.TOKENS] / v[LENGTH] for v in steps if v.get(LENGTH) and Metric.TOKENS in v]
    return {
        "trained_tokens_per_s": statistics.fmean(tokens) / step_mean_s if tokens else None,
        "trained_trajectories_per_s": statistics.fmean(counted) / step_mean_s if counted else None,
        "response_length_mean": statistics.fmean(lengths) if lengths else None,
        "response_length_all": lengths,
        "turns_mean": statistics.fmean(v[Metric.TURNS_MEAN] for v in steps) if steps and Metric.TURNS_MEAN in steps[0] else None,
    }


def trained_against_sync(name: str, row: dict[str, Any], sync: dict[str, Any]) -> dict[str, Any]:
    """The row's mean response length over sync's with its interval, and the warning, if any."""
    mine, ref = row.get("response_length_all") or [], sync.get("response_length_all") or []
    if name == "sync" or not mine or not ref:
        return {"response_length_vs_sync": None, "response_length_vs_sync_ci90": None, "trained_warning": None}
    ratio = statistics.median(mine) / statistics.median(ref)
    ci = ratio_interval(mine, ref)  # (row / sync): the same resampling, the other way round
    beyond = ci is not None and (ci[0] > 1 + TOLERANCE or ci[1] < 1 - TOLERANCE)
    warning = None
    if beyond:
        word = "shorter" if ratio < 1 else "longer"
        warning = (f"{name} trained {abs(1 - ratio):.0%} {word} trajectories than sync "
                   f"({statistics.median(mine):.1f} vs {statistics.median(ref):.1f} generated tokens, "
                   f"90% interval of the ratio {ci[0]:.2f}-{ci[1]:.2f}); reward {row['reward_mean']:.3f} vs "
                   f"{sync['reward_mean']:.3f}")
    return {"response_length_vs_sync": ratio, "response_length_vs_sync_ci90": ci, "trained_warning": warning}
