"""What each bench row trained, beside how fast (docs/bench-report.md, "Throughput and what was trained").

Step time alone flatters a schedule that trains other trajectories: fully-async learns the groups
that finish first, so its batches hold shorter, easier trajectories than the on-policy schedules
sample. Per row, over its measured steps: trained tokens and trajectories per second of window,
the mean generated tokens and turns of a trained trajectory, its mean reward and the groups
dropped as too stale; against sync, the ratio of response lengths with a bootstrap interval,
and a warning when that interval excludes 1 by more than ``TOLERANCE``; and the share of its
trained trajectories in the slowest decile of what sync trains (``slowest_decile``).
"""

from __future__ import annotations

import statistics
from typing import Any

from learner.bench.intervals import ratio_interval
from learner.timeline import Kind, Metric
from learner.registries.schedules import BASELINE  # a row is named after its schedule (+ a variant)

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
    if name == BASELINE or not mine or not ref:
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


# ---------------------------------------------------------------- the slowest decile

DECILE = 0.9  # the trajectories at or above sync's 90th percentile of generated tokens


def trained_lengths(events: list[dict[str, Any]], warmup: int, end: int) -> list[int]:
    """Generated tokens of every trajectory trained in steps ``warmup .. end-1``: by the
    ``assignment`` events where the schedule records them (fully-async's rollouts carry step -1
    until a step takes them, docs/spans.md), else by the step its rollout spans carry. Turns and
    drafts count (a kept draft is part of the response); a draft dropped and generated again
    counts twice, so on a speculation row the figure leans long."""
    tokens: dict[int, int] = {}
    step_of: dict[int, int] = {}
    for e in events:
        if e.get("type") == "span" and e["kind"] in (Kind.GENERATE, Kind.DRAFT) and e.get("traj") is not None:
            tokens[e["traj"]] = tokens.get(e["traj"], 0) + int(e.get("tokens") or 0)
            if e["step"] >= 0:
                step_of.setdefault(e["traj"], e["step"])
        elif e.get("type") == "assignment":
            step_of.update({t: e["step"] for t in e["trajs"]})
    return [tokens[t] for t, s in step_of.items() if warmup <= s < end and t in tokens]


def slowest_decile(row_runs: list[list[dict[str, Any]]], sync_runs: list[list[dict[str, Any]]], warmup: int,
                   end: int) -> dict[str, Any]:
    """The row's share of trained trajectories in the slowest decile of what sync trains: those
    generating at least sync's 90th percentile of tokens (a schedule-independent measure of a
    trajectory's work; its time depends on what else runs). About 0.10 for an on-policy schedule,
    less for one that trains the groups that finish first."""
    return decile_share([n for events in row_runs for n in trained_lengths(events, warmup, end)],
                        [n for events in sync_runs for n in trained_lengths(events, warmup, end)])


def decile_share(mine: list[int], reference: list[int]) -> dict[str, Any]:
    """``slowest_decile_tokens`` (the reference's 90th percentile of generated tokens) and
    ``slowest_decile_share`` (the share of ``mine`` at or above it); None without both."""
    ref = sorted(reference)
    if not ref or not mine:
        return {"slowest_decile_tokens": None, "slowest_decile_share": None}
    threshold = ref[min(int(DECILE * len(ref)), len(ref) - 1)]
    return {"slowest_decile_tokens": threshold,
            "slowest_decile_share": sum(1 for n in mine if n >= threshold) / len(mine)}
