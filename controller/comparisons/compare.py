"""The compare summary: per run, the headline figures of docs/pages-compare.md ("Compare summary"),
every one computed from the run's stored step metrics and spans.

Times are seconds on the learner's clock (seconds since its process started). A run's
*training window* starts at its first step's ``step/t_start`` (after boot: workers up, model
loaded) and ends at its last step's ``step/t_end``.
"""

from __future__ import annotations

import math
import statistics

from learner.bench.smoothing import smoothed
from learner.bench.efficiency import overlap_rule, own_bound, work_per_step
from learner.timeline import Metric, window_metrics

from controller.comparisons.fairness import warnings
from controller.models import Run, Span, StepMetric
from controller.comparisons.pooled import REFERENCE_SCHEDULE, pooled_summary

# Hand-picked runs (/compare/?runs=, /api/compare/): an overlay of 2-12 runs. A comparison's own
# page and /api/comparisons/<id>/ hold every run it launched (schedules x sweep values x repeats,
# at most MAX_LAUNCHED); the per-run charts draw at most static/js/comparepage.js's CHART_RUNS of them.
MIN_COMPARED, MAX_COMPARED = 2, 12
MAX_LAUNCHED = 24
MAX_ID = 2**31 - 1
# Time to reward reads an exponential moving average of reward/mean: per-step rewards of a few
# groups swing widely, so the first step whose raw reward passes a level is mostly luck.
DEFAULT_SMOOTHING = 0.8
WORK_FIELDS = ("engine_busy_s", "learner_work_s", "barrier_s", "step_mean_s")  # per step, learner.bench.efficiency


class CompareError(ValueError):
    """A bad ``runs``/``reward`` query: ``field`` names the parameter."""

    def __init__(self, field: str, reason: str):
        super().__init__(reason)
        self.field = field


def parse_run_ids(raw: str) -> list[int]:
    """``"1,2,3"`` -> [1, 2, 3]: MIN_COMPARED to MAX_COMPARED distinct ids (empty text -> [])."""
    try:
        ids = [int(part) for part in raw.split(",") if part.strip()]
    except ValueError:
        raise CompareError("runs", "expected comma-separated run ids") from None
    if any(not 1 <= i <= MAX_ID for i in ids):
        raise CompareError("runs", f"run ids are between 1 and {MAX_ID}")
    if len(ids) != len(set(ids)):
        raise CompareError("runs", "a run is listed twice")
    if ids and not MIN_COMPARED <= len(ids) <= MAX_COMPARED:
        raise CompareError("runs", f"pick between {MIN_COMPARED} and {MAX_COMPARED} runs (a comparison's "
                                           "own page shows all of its runs)")
    return ids


def parse_finite(raw: str, field: str) -> float | None:
    """A query parameter as a finite float; None when empty."""
    if raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise CompareError(field, f"expected a number, got {raw[:40]!r}") from None
    if not math.isfinite(value):
        raise CompareError(field, "must be a finite number")
    return value


def parse_smoothing(raw: str) -> float:
    weight = parse_finite(raw, "smoothing")
    if weight is None:
        return DEFAULT_SMOOTHING
    if not 0 <= weight < 1:
        raise CompareError("smoothing", "must be at least 0 and below 1")
    return weight


def parse_reward_level(raw: str) -> float | None:
    return parse_finite(raw, "reward")


def number(values: dict, key: str) -> float | None:
    """A stored metric as a float; None when missing or stored as null (NaN at the learner)."""
    value = values.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def present(rows: list[dict], key: str) -> list[float]:
    """The step rows' values of ``key``, skipping steps without it."""
    return [v for v in (number(r, key) for r in rows) if v is not None]


def median_of(rows: list[dict], key: str) -> float | None:
    found = present(rows, key)
    return statistics.median(found) if found else None


def spread_of(rows: list[dict], key: str) -> tuple[float | None, float | None]:
    """10th and 90th percentile of ``key`` over the steps (inclusive method: with two steps,
    10% and 90% of the way between them); (None, None) without a value."""
    found = present(rows, key)
    if len(found) < 2:
        return (found[0], found[0]) if found else (None, None)
    deciles = statistics.quantiles(found, n=10, method="inclusive")
    return deciles[0], deciles[-1]


def smoothed_rewards(rows: list[dict], weight: float) -> list[tuple[dict, float]]:
    """(step row, smoothed reward/mean) for the steps that have a reward."""
    with_reward = [r for r in rows if number(r, Metric.REWARD_MEAN) is not None]
    return list(zip(with_reward, smoothed([number(r, Metric.REWARD_MEAN) for r in with_reward], weight)))


def phase_medians(rows: list[dict]) -> tuple[float | None, float | None]:
    """R and L of a sync run (docs/bench-report.md): median (last reward - step start) and median
    (step end - first backward). In sync the phases do not overlap, so each ran alone."""
    rollout, learner = [], []
    for r in rows:
        start, end = number(r, Metric.T_START), number(r, Metric.T_END)
        last_reward, first_backward = number(r, Metric.LAST_REWARD_T), number(r, Metric.FIRST_BACKWARD_T)
        if start is not None and last_reward is not None:
            rollout.append(last_reward - start)
        if end is not None and first_backward is not None:
            learner.append(end - first_backward)
    return (statistics.median(rollout) if rollout else None, statistics.median(learner) if learner else None)


def step_rows(run_ids: list[int]) -> dict[int, list[dict]]:
    """run id -> its step metrics' values in step order (each with ``step`` added)."""
    rows: dict[int, list[dict]] = {rid: [] for rid in run_ids}
    for m in StepMetric.objects.filter(run_id__in=run_ids).order_by("run_id", "step").values("run_id", "step", "values"):
        rows[m["run_id"]].append({**m["values"], "step": m["step"]})
    return rows


def mean_of(rows: list[dict], key: str) -> float | None:
    found = present(rows, key)
    return statistics.fmean(found) if found else None


def step_figures(rows: list[dict]) -> dict:
    """A run's figures from its step metrics (``rows``, in step order): the runs lists' columns,
    and the compare summary's steps done, final reward and median step."""
    rewards = present(rows, Metric.REWARD_MEAN)
    ema = smoothed_rewards(rows, DEFAULT_SMOOTHING)
    return {"steps_done": len(rows), "step_s": median_of(rows, Metric.STEP_S),
            "final_reward": rewards[-1] if rewards else None, "reward_ema": ema[-1][1] if ema else None,
            "learner_idle": mean_of(rows, Metric.TRAINER_IDLE), "staleness": mean_of(rows, Metric.STALENESS_MEAN)}


def training_window(rows: list[dict]) -> tuple[float, float] | None:
    starts = present(rows, Metric.T_START)
    ends = present(rows, Metric.T_END)
    return (min(starts), max(ends)) if starts and ends and max(ends) > min(starts) else None


def idle_over(run_id: int, window: tuple[float, float] | None) -> dict[str, float | None]:
    """Learner and rollout idle over the whole training window, from every stored span (the
    per-step rollouter/idle_ratio is computed before the rollout spans running beside the
    learner reach the driver, docs/bench-report.md, so it is not averaged here)."""
    if window is None:
        return {"learner_idle": None, "rollout_idle": None}
    lo, hi = window
    spans = Span.objects.filter(run_id=run_id, t1__gt=lo, t0__lt=hi).values("kind", "t0", "t1")
    idle = window_metrics(spans.iterator(chunk_size=5000), lo, hi)
    return {"learner_idle": idle[Metric.TRAINER_IDLE], "rollout_idle": idle[Metric.ROLLOUT_IDLE]}


def run_work(run_id: int, rows: list[dict]) -> dict[str, float] | None:
    """engine_busy_s, learner_work_s and step_mean_s of a run over its stored steps, by the bench's
    own measure (learner.bench.efficiency.work_per_step, docs/bench-report.md "Efficiency"); None for a
    run without timed steps or without a stored span of work (its work is unknown, not zero)."""
    timed = [r for r in rows if number(r, Metric.T_START) is not None and number(r, Metric.T_END) is not None]
    if training_window(timed) is None:
        return None
    lo, hi = number(timed[0], Metric.T_START), number(timed[-1], Metric.T_END)
    spans = Span.objects.filter(run_id=run_id, t1__gt=lo, t0__lt=hi).values("lane", "kind", "t0", "t1")
    work = work_per_step([({**s, "type": "span"} for s in spans.iterator(chunk_size=5000))], [timed])
    return work if work["engine_busy_s"] or work["learner_work_s"] else None


def run_rule(run: Run) -> str:
    """The overlap rule of a run's schedule (learner.bench.efficiency.overlap_rule)."""
    config = run.config or {}
    speculation = bool(((config.get("rollout") or {}).get("speculation") or {}).get("enabled"))
    return overlap_rule(config.get("train", {}).get("schedule", run.schedule.kind), speculation)


def efficiencies(works: dict[int, dict | None], rules: dict[int, str]) -> dict[int, dict]:
    """Each run with work held against its own bound (learner.bench.efficiency.own_bound): the
    least step its own engine and learner work allow under its schedule's rule, so a run's
    efficiency, at most 1, does not depend on which other runs are compared."""
    return {rid: own_bound(w, rules[rid]) for rid, w in works.items() if w is not None}


def time_to_reward(rows: list[dict], level: float | None, start: float | None,
                   weight: float) -> tuple[float | None, int | None]:
    """Seconds from the first step's start to the end of the first step whose smoothed
    reward/mean reaches ``level`` (None when it never does)."""
    if level is None or start is None:
        return None, None
    for r, reward in smoothed_rewards(rows, weight):
        end = number(r, Metric.T_END)
        if end is not None and reward >= level:
            return end - start, r["step"]
    return None, None


def reward_curves(all_rows: list[list[dict]], weight: float) -> list[list[float]]:
    return [[v for _, v in smoothed_rewards(rows, weight)] for rows in all_rows]


def improved(curve: list[float]) -> bool:
    """Whether a smoothed reward curve rises above its first step's value at a later step."""
    return len(curve) >= 2 and max(curve[1:]) > curve[0]


def default_reward_level(all_rows: list[list[dict]], weight: float) -> float | None:
    """The highest smoothed reward/mean that every run crosses after its first step: above each
    run's first smoothed reward and reached by each at a later step, so the time to it measures
    learning, not the first batch's luck. None when no level is (a run whose reward never rises
    above its first step's, or one with a single rewarded step)."""
    curves = [c for c in reward_curves(all_rows, weight) if c]
    if not curves or any(len(c) < 2 for c in curves):
        return None
    level = min(max(c[1:]) for c in curves)
    return level if level > max(c[0] for c in curves) else None


def default_reward_levels(all_rows: list[list[dict]], weight: float) -> list[float]:
    """Levels from the runs' own smoothed curves such that every run that improved (rose above
    its first step's reward later) crosses at least one of them after its first step: one level,
    ``default_reward_level``, when every run crosses it; else as few as that takes (each improved
    run's interval (first value, best later value] holds a level: the least best of the runs not
    yet covered, in turn). Empty when no run improved."""
    common = default_reward_level(all_rows, weight)
    if common is not None:
        return [common]
    levels: list[float] = []
    for best, first in sorted((max(c[1:]), c[0]) for c in reward_curves(all_rows, weight) if improved(c)):
        if not any(first < level <= best for level in levels):
            levels.append(best)
    return levels


def own_level(curve: list[float], levels: list[float]) -> float | None:
    """The highest of ``levels`` the run crosses after its first step (None: it crosses none)."""
    crossed = [level for level in levels if improved(curve) and curve[0] < level <= max(curve[1:])]
    return max(crossed) if crossed else None


def reward_note(runs: list[Run], curves: list[list[float]], levels: list[float], chosen: bool) -> str:
    """The plain sentence under the summary when the time to reward needs one."""
    if chosen:
        at_start = [c for c in curves if c and c[0] >= levels[0]]
        if curves and len(at_start) == len(curves):
            return (f"every run's smoothed reward was already at or above {levels[0]:.3f} at its first step: the time "
                    "to it measures the first batch, not learning")
        return ""
    shown = [c for c in curves if c]
    if not shown:
        return "no run has a reward yet"
    if not any(improved(c) for c in shown):
        firsts, lasts = [c[0] for c in shown], [c[-1] for c in shown]
        span = lambda vs: f"{min(vs):.2f}" if max(vs) - min(vs) < 0.005 else f"{min(vs):.2f}-{max(vs):.2f}"
        return (f"no run improved: every run's smoothed reward stayed at or below its first step's ({span(firsts)} "
                f"at the first step, {span(lasts)} at the last; the reward chart shows the curves)")
    flat = [str(r) for r, c in zip(runs, curves) if not improved(c)]
    parts = []
    if len(levels) > 1:
        parts.append(f"no one level is crossed by every run after its first step: each run is timed to the highest of "
                     f"{', '.join(f'{v:.3f}' for v in levels)} it crosses after its first step")
    if flat:
        parts.append(f"{len(flat)} run{'s' if len(flat) > 1 else ''} never rose above {'their' if len(flat) > 1 else 'its'} "
                     f"first step's reward ({', '.join(flat[:4])}{', ...' if len(flat) > 4 else ''}): no time to reward")
    return "; ".join(parts)


def run_figures(run: Run, rows: list[dict], level: float | None, weight: float) -> dict:
    """One run's summary row; ``level``: the reward level it is timed to (None: no time to reward)."""
    window = training_window(rows)
    staleness = present(rows, Metric.STALENESS_MEAN)
    worst = present(rows, Metric.STALENESS_MAX)
    seconds, step = time_to_reward(rows, level, window[0] if window else None, weight)
    rewarded = smoothed_rewards(rows, weight)
    at_first = step is not None and bool(rewarded) and step == rewarded[0][0]["step"]
    p10, p90 = spread_of(rows, Metric.STEP_S)
    return {
        "id": run.pk, "name": str(run), "status": run.status,
        "schedule": run.config.get("train", {}).get("schedule", run.schedule.kind),
        **{k: v for k, v in step_figures(rows).items() if k in ("steps_done", "final_reward", "step_s")},
        "step_p10_s": p10, "step_p90_s": p90,
        **idle_over(run.pk, window),
        "training_s": window[1] - window[0] if window else None,
        "staleness_mean": statistics.fmean(staleness) if staleness else None,
        "staleness_max": max(worst) if worst else None,
        "tail_s": median_of(rows, Metric.TAIL_S),
        "time_to_reward_s": seconds, "reward_step": step, "reward_level": level,
        "reward_at_first_step": at_first,
        **speculation_figures(rows),
    }


def speculation_figures(rows: list[dict]) -> dict:
    """Speculation's per-step metrics (docs/speculation.md) over the run, None where it did not
    draft: mean kept-token and whole-draft shares, total drafted tokens."""
    kept, whole = present(rows, Metric.KEPT_TOKEN_SHARE), present(rows, Metric.WHOLE_DRAFT_SHARE)
    drafted = present(rows, Metric.DRAFTED_TOKENS)
    return {"kept_token_share": statistics.fmean(kept) if kept else None,
            "whole_draft_share": statistics.fmean(whole) if whole else None,
            "drafted_tokens": sum(drafted) if drafted else None}


def compare_summary(runs: list[Run], level: float | None = None, weight: float = DEFAULT_SMOOTHING) -> dict:
    """The compare page's summary table (GET /api/compare/): see docs/pages-compare.md."""
    rows = step_rows([r.pk for r in runs])
    chosen = level is not None
    curves = reward_curves([rows[r.pk] for r in runs], weight)
    levels = [level] if chosen else default_reward_levels([rows[r.pk] for r in runs], weight)
    own = [level if chosen else own_level(c, levels) for c in curves]
    figures = [run_figures(r, rows[r.pk], lv, weight) for r, lv in zip(runs, own)]
    for f, c in zip(figures, curves):
        f["reward_improved"] = improved(c) if c else None
    reference = next((f for f in figures if f["schedule"] == REFERENCE_SCHEDULE and f["step_s"]), None)
    rollout_s, learner_s = phase_medians(rows[reference["id"]]) if reference else (None, None)
    works = {r.pk: run_work(r.pk, rows[r.pk]) for r in runs}
    bounds = efficiencies(works, {r.pk: run_rule(r) for r in runs})
    for f in figures:
        work = works[f["id"]] or {}
        f.update({key: work.get(key) for key in WORK_FIELDS})
        own = bounds.get(f["id"], {})
        f.update({key: own.get(key) for key in ("bound_s", "bound_rule", "bound_barrier_s", "efficiency")})
        f["speedup_vs_sync"] = reference["step_s"] / f["step_s"] if reference and f["step_s"] else None
        # the speedup's spread: the reference's median over this run's p90 and p10 step
        f["speedup_p10"] = reference["step_s"] / f["step_p90_s"] if reference and f["step_p90_s"] else None
        f["speedup_p90"] = reference["step_s"] / f["step_p10_s"] if reference and f["step_p10_s"] else None
    pooled = pooled_summary(runs, rows)  # repeats of a schedule together, with intervals (controller/comparisons/pooled.py)
    return {"reference": reference["id"] if reference else None, "rollout_s": rollout_s, "learner_s": learner_s,
            "pooled": pooled, "trained_warnings": [g["trained_warning"] for g in pooled if g["trained_warning"]],
            # the one level in use (typed, or from the curves), None with several or none
            "reward_level": levels[0] if len(levels) == 1 else None, "reward_levels": levels,
            "reward_smoothing": weight, "reward_level_note": reward_note(runs, curves, levels, chosen),
            "warnings": warnings(runs, {r.pk: len(rows[r.pk]) for r in runs}), "runs": figures}
