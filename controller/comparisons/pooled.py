"""The compare summary per schedule: a comparison's repeats pooled (docs/pages-compare.md, "Pooled over
repeats"), with the bench's own statistics (learner/bench/intervals.py, learner/bench/trained.py).

Runs launched with the same schedule preset and the same overrides (a sweep's value) are one
group. Its figure is the median step over the pooled steps of its runs with a bootstrap 90%
interval, and against the sync group (of the same overrides) the speedup, median over median,
with the interval of that ratio; a ratio whose interval admits 1 is flagged, since it is no
result. What each group trained is held against sync's by trained.py's rule: per-step mean
response lengths, their ratio's interval beyond 5% is worth a warning (fully-async trains the
groups that finish first), and the share of its trained trajectories in the slowest decile of
sync's (``decile_share``). Beside the median step, the equal-work step: the group's windows per
batch produced (``controller/comparisons/trained_work.py``), which charges a window that lived off work done
before it.
"""

from __future__ import annotations

import statistics

from learner.bench.intervals import median_interval, ratio_interval, spans_one
from learner.bench.trained import LENGTH, decile_share, trained_against_sync
from learner.bench.window import charged_step
from learner.timeline import Metric

from controller.models import Run
from controller.comparisons.trained_work import trained_tokens, window_counts
from learner.registries.schedules import BASELINE

REFERENCE_SCHEDULE = BASELINE  # the registry's baseline schedule (sync)


def group_key(run: Run) -> tuple:
    return run.schedule_id, repr(sorted(run.launch_overrides().items()))


def label(run: Run) -> str:
    """The schedule kind, and the preset's name when it is another (a tuned preset), and the
    launch overrides (a sweep's value)."""
    kind = run.config.get("train", {}).get("schedule", run.schedule.kind)
    name = kind if run.schedule.name == kind else f"{kind} ({run.schedule.name})"
    return name + "".join(f" · {k}={v}" for k, v in sorted(run.launch_overrides().items()))


def values_of(rows: list[dict], key: str) -> list[float]:
    return [float(r[key]) for r in rows if isinstance(r.get(key), (int, float)) and not isinstance(r.get(key), bool)]


def pooled_group(runs: list[Run], rows: dict[int, list[dict]]) -> dict:
    steps = [v for r in runs for v in values_of(rows[r.pk], Metric.STEP_S)]
    rewards = [v for r in runs for v in values_of(rows[r.pk], Metric.REWARD_MEAN)]
    counts = [c for c in (window_counts(r, rows[r.pk]) for r in runs) if c is not None]
    window, n_steps, trained, produced = (sum(c[i] for c in counts) for i in range(4))
    first = runs[0]
    return {
        # the window per batch produced, the bench's equal-work step (learner/bench/window.py)
        "step_equal_work_s": charged_step(window, trained, produced, n_steps),
        "trained_tokens_all": [n for r in runs for n in trained_tokens(r)],
        "label": label(first), "schedule": first.config.get("train", {}).get("schedule", first.schedule.kind),
        "runs": [r.pk for r in runs], "steps": len(steps), "step_all": steps,
        "step_s": statistics.median(steps) if steps else None, "step_ci90": median_interval(steps),
        "response_length_all": [v for r in runs for v in values_of(rows[r.pk], LENGTH)],
        "reward_mean": statistics.fmean(rewards) if rewards else None,
    }


def with_reference(group: dict, sync: dict | None) -> dict:
    """The group's speedup over ``sync`` with its interval and flag, and what it trained against sync's."""
    speedup = ci = None
    if sync is not None and group["step_s"] and sync["step_s"]:
        speedup, ci = sync["step_s"] / group["step_s"], ratio_interval(sync["step_all"], group["step_all"])
    trained = {"response_length_vs_sync": None, "response_length_vs_sync_ci90": None, "trained_warning": None}
    if sync is not None and group is not sync and group["reward_mean"] is not None and sync["reward_mean"] is not None:
        trained = trained_against_sync(group["label"], group, sync)
    decile = decile_share(group["trained_tokens_all"], sync["trained_tokens_all"] if sync is not None else [])
    return {**group, "speedup_vs_sync": speedup, "speedup_ci90": ci, "speedup_spans_one": spans_one(ci), **trained,
            **decile}


def pooled_summary(runs: list[Run], rows: dict[int, list[dict]]) -> list[dict]:
    """One row per group in the runs' order of first appearance (the summary's "pooled")."""
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault(group_key(r), []).append(r)
    pooled = {key: pooled_group(members, rows) for key, members in groups.items()}
    out = []
    for key, group in pooled.items():
        overrides = key[1]
        sync = next((g for (_, o), g in pooled.items() if g["schedule"] == REFERENCE_SCHEDULE and o == overrides
                     and g["step_s"]), None)
        row = with_reference(group, sync)
        for bulky in ("step_all", "response_length_all", "trained_tokens_all"):  # the steps are the API's per-run metrics already
            row.pop(bulky)
        out.append(row)
    return out
