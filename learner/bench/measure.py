"""What the bench reads off recorded runs: per-schedule summaries and the tool-latency calibration.

Every number comes from the JSONL events of a real ``thundersync train`` run (spans and the
driver's per-step metrics, docs/architecture.md); the first ``warmup`` steps are dropped.

    step_s      median of ``timing_s/step`` (publish to publish); spread: IQR, min, max
    R           rollout_s: median over the *sync* run's steps of (last reward - step start).
                In sync the learner waits for the last reward, so the batch rolls out alone:
                this is the rollout makespan with nothing else on the machine's other core.
    L           learner_s: median over the *sync* run's steps of (step end - first backward); sync
                trains micro-batched (docs/learner.md), the best learner a user would run. The
                ``sync-per-trajectory`` reference row is held against its own, the earlier learner's.
                Sync starts learning only with every reward in hand, so this is the learner's
                wall time alone: backward passes, group closes, the barrier's checks, optimizer,
                publish and the replicas' weight-load acks, whether or not the driver wraps each
                of them in a span (``learner_busy_s``, the union of learner spans, is beside it).
    bound_s     the least step the row's own engine and learner work allow under its schedule's
                rule (sync: E + L; streaming: max(E + optimizer and publish, L); async,
                fully-async, speculative rows: max(E, L)), efficiency = bound_s / mean step: at
                most 1, whatever else is compared (``learner/bench/efficiency.py``).

R and L are properties of the workload, measured once where each runs alone. They are not the
bound: a schedule that overlaps two batches' modelled tool waits (fully-async, speculation)
finishes a step in less than R. What each schedule itself spent is reported beside them
(``learner_busy_s``, ``rollout_busy_s``, ``first_backward_s``, ``engine_busy_s``).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from learner.bench.efficiency import own_bound, row_rule, work_per_step
from learner.bench.intervals import median_interval, ratio_interval, spans_one
from learner.bench.trained import trained_against_sync, trained_figures
from learner.bench.window import equal_work
from learner.sim.workload import MODELLED_KINDS
from learner.timeline import Kind, LEARNER_KINDS, Metric, ROLLOUT_KINDS, window_metrics
from learner.registries.schedules import BASELINE  # a row is named after its schedule (+ a variant)


class BenchError(RuntimeError):
    """A bench run could not be measured; ``str()`` is one line saying why."""


def load_events(path: str | Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def drain_steps(schedule: str, max_staleness: int) -> int:
    """Steps at the end of a run that are not steady state, so the bench runs and drops them.

    The driver stops dispatching when no later step will train the trajectories: async's last
    step has no next batch to roll out beside it, and fully-async's last ``max_staleness``
    steps are fed less than the bound allows. sync and streaming have no pipeline to drain.
    """
    return {"async": 1, "fully-async": max_staleness}.get(schedule, 0)


def measured_steps(events: list[dict[str, Any]], warmup: int, end: int | None = None) -> list[dict[str, float]]:
    """Per-step metric values of steps ``warmup .. end-1`` (warm-up and drain dropped), each with its ``step``."""
    steps = [{"step": e["step"], **e["values"]} for e in events if e.get("type") == "metrics"]
    kept = [v for v in steps if v["step"] >= warmup and (end is None or v["step"] < end)]
    if not kept:
        raise BenchError(f"run has {len(steps)} step(s); none left after dropping {warmup} warm-up step(s)")
    return kept


def _spread(values: list[float]) -> dict[str, Any]:
    if len(values) >= 2:
        q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    else:
        q1 = q3 = values[0]
    return {"median": statistics.median(values), "iqr": [q1, q3], "min": min(values), "max": max(values)}


def summarize(runs: list[list[dict[str, Any]]], warmup: int, end: int | None = None,
              batch: tuple[int, int] | None = None) -> dict[str, Any]:
    """What one schedule's runs did, over their measured steps ``warmup .. end-1``, pooled.

    ``runs``: one event list per run of the schedule (the bench repeats each schedule in
    rounds of alternating order, so slow drifts of a shared machine fall on every schedule
    alike). Medians are over the pooled steps. Idle ratios are recomputed from every recorded
    span over each run's measured window (the driver's step windows tile it) and pooled by
    window length; they are not read from the per-step metrics: the driver computes those
    when the step ends, before the rollout spans still running beside the learner (async,
    fully-async) have reached it. staleness_mean is the mean of the per-step means (every
    step trains the same number of trajectories). ``batch``: (trajectories per step, group size),
    for the equal-work window (``learner.bench.window``).
    """
    kept_per_run = [measured_steps(events, warmup, end) for events in runs]
    steps = [v for kept in kept_per_run for v in kept]
    backward_s = []
    for events, kept in zip(runs, kept_per_run):
        measured = {v["step"] for v in kept}
        backward_s += [e["t1"] - e["t0"] for e in events if e.get("type") == "span"
                       and e["kind"] == Kind.BACKWARD and e["step"] in measured]
    step_s = [v[Metric.STEP_S] for v in steps]
    spread = _spread(step_s)

    def median_of(fn) -> float:
        return statistics.median(fn(v) for v in steps)

    return {
        "steps_measured": len(steps),
        "runs": len(runs),
        "step_s": spread["median"],
        "step_s_iqr": spread["iqr"],
        "step_s_min": spread["min"],
        "step_s_max": spread["max"],
        "step_s_all": step_s,
        "learner_busy_s": median_of(lambda v: v[Metric.LEARNER_S]),
        # nearly the same work in every schedule (one trajectory's forward + backward): the machine's
        # speed during this schedule's runs, to read speedups and efficiencies against
        "backward_ms": 1000.0 * statistics.median(backward_s) if backward_s else float("nan"),
        "rollout_busy_s": median_of(lambda v: v[Metric.GEN_S]),
        "last_reward_s": median_of(lambda v: v[Metric.LAST_REWARD_T] - v[Metric.T_START]),
        "first_backward_s": median_of(lambda v: v[Metric.FIRST_BACKWARD_T] - v[Metric.T_START]),
        "learner_phase_s": median_of(lambda v: v[Metric.T_END] - v[Metric.FIRST_BACKWARD_T]),
        **(work := work_per_step(runs, kept_per_run)),
        **trained_figures(steps, work["step_mean_s"]),
        **(equal_work(runs, kept_per_run, *batch) if batch else {}),
        **idle_ratios(runs, kept_per_run),
        "staleness_mean": statistics.fmean(v[Metric.STALENESS_MEAN] for v in steps),
        "staleness_max": int(max(v[Metric.STALENESS_MAX] for v in steps)),
        "tail_s": median_of(lambda v: v[Metric.TAIL_S]),
        "peak_rss_mb": max(v[Metric.PEAK_RSS_MB] for v in steps),
        # the learner path's memory and the zero-variance skip (docs/learner.md)
        "peak_buffers": max(v.get(Metric.PEAK_BUFFERS, 1.0) for v in steps),
        "peak_accumulator_mb": max(v.get(Metric.PEAK_ACCUMULATOR_MB, 0.0) for v in steps),
        "skipped_trajectories": median_of(lambda v: v.get(Metric.SKIPPED_TRAJECTORIES, 0.0)),
        "reward_mean": statistics.fmean(v[Metric.REWARD_MEAN] for v in steps),
        # fully-async: groups found too stale over the measured steps (0 for the others)
        "dropped_groups": int(sum(v.get(Metric.DROPPED_GROUPS, 0.0) for v in steps)),
    }


def idle_ratios(runs: list[list[dict[str, Any]]], kept_per_run: list[list[dict[str, float]]]) -> dict[str, float]:
    """trainer_idle_ratio, rollouter_idle_ratio and trainer_wait_ratio over the runs' measured
    windows (``kept_per_run``: each run's measured steps), pooled by window length."""
    idle_s, window_s = {Metric.TRAINER_IDLE: 0.0, Metric.ROLLOUT_IDLE: 0.0, Metric.TRAINER_WAIT: 0.0}, 0.0
    for events, kept in zip(runs, kept_per_run):
        t0, t1 = kept[0][Metric.T_START], kept[-1][Metric.T_END]
        idle = window_metrics([e for e in events if e.get("type") == "span"], t0, t1)
        # blocked-on-data time is only known to the driver: per-step, weighted by step length
        idle[Metric.TRAINER_WAIT] = sum(v.get(Metric.TRAINER_WAIT, 0.0) * v[Metric.STEP_S] for v in kept) / (t1 - t0)
        for key in idle_s:
            idle_s[key] += idle[key] * (t1 - t0)
        window_s += t1 - t0
    return {"trainer_idle_ratio": idle_s[Metric.TRAINER_IDLE] / window_s,
            "rollouter_idle_ratio": idle_s[Metric.ROLLOUT_IDLE] / window_s,
            "trainer_wait_ratio": idle_s[Metric.TRAINER_WAIT] / window_s}


def compare(summaries: dict[str, dict[str, Any]], alone: set[str] = frozenset()) -> dict[str, dict[str, Any]]:
    """Add the workload's R and L, each row's own bound and efficiency and its speedup (needs sync).

    R and L are the micro-batched sync's; a row in ``alone`` (a sync run with another learner:
    the ``sync-per-trajectory`` reference) is held against its own R, L and work, those of the
    learner it trains with."""
    sync = summaries["sync"]
    bounds = {name: own_bound(s, row_rule(name)) for name, s in summaries.items()}

    def row(name: str, s: dict[str, Any]) -> dict[str, Any]:
        phases = s if name in alone else sync
        speedup_ci = ratio_interval(sync["step_s_all"], s["step_s_all"])
        return {**s, "rollout_s": phases["last_reward_s"], "learner_s": phases["learner_phase_s"], **bounds[name],
                "speedup_vs_sync": sync["step_s"] / s["step_s"],
                "step_s_ci90": median_interval(s["step_s_all"]), "speedup_ci90": speedup_ci,
                "speedup_spans_1": spans_one(speedup_ci) if name != BASELINE else None,
                **trained_against_sync(name, s, sync)}

    return {name: row(name, s) for name, s in summaries.items()}


def step_timeline(events: list[dict[str, Any]], step: int) -> dict[str, Any]:
    """Where one step's time went: merged learner and rollout busy intervals and reward
    times, in seconds from the step's start (for the report's timeline)."""
    values = next(e["values"] for e in events if e.get("type") == "metrics" and e["step"] == step)
    t0, t1 = values[Metric.T_START], values[Metric.T_END]
    spans = [e for e in events if e.get("type") == "span" and e["t1"] > t0 and e["t0"] < t1]

    def merged(kinds: tuple[str, ...]) -> list[list[float]]:
        out: list[list[float]] = []
        for a, b in sorted((max(s["t0"], t0) - t0, min(s["t1"], t1) - t0) for s in spans if s["kind"] in kinds):
            if out and a <= out[-1][1]:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
        return out

    rewards = sorted(s["t1"] - t0 for s in spans if s["kind"] == Kind.VERIFY)
    return {"step": step, "step_s": t1 - t0, "learner": merged(LEARNER_KINDS),
            "rollout": merged(ROLLOUT_KINDS), "rewards": rewards}


# ---------------------------------------------------------------- calibration of --balance


@dataclass
class Calibration:
    """R as a function of the tool-latency scale, from one sync run (docs/bench.md: the tool latency
    is the only modelled quantity, so it is the one knob that sets R/L).

    For trajectory i of a measured step: end_i = its reward time from the step start,
    lam_i = the summed modelled tool latency of its turns per unit scale. The tool draws are
    seeded per (trajectory, turn), so at scale s the same trajectory waits s * lam_i and
    end_i(s) = (end_i - scale_run * lam_i) + s * lam_i, the rest (generation, queueing
    behind other loops' generate calls) taken as fixed. R(s) = median over steps of
    max_i end_i(s); L does not depend on s.
    """

    learner_s: float
    scale_run: float
    steps: list[list[tuple[float, float]]]  # per measured step: (fixed part, lam) per trajectory

    def rollout_at(self, scale: float) -> float:
        return statistics.median(max(c + scale * lam for c, lam in trajs) for trajs in self.steps)

    def scale_for(self, balance: float, max_scale: float) -> float:
        """Smallest tool-latency scale with R(scale) = balance * L (0 if generation alone is
        already slower; ``max_scale`` if even that is not enough). R is nondecreasing in s."""
        target = balance * self.learner_s
        if self.rollout_at(0.0) >= target:
            return 0.0
        if self.rollout_at(max_scale) <= target:
            return max_scale
        lo, hi = 0.0, max_scale
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if self.rollout_at(mid) < target else (lo, mid)
        return hi

    def as_dict(self) -> dict[str, Any]:
        return {"learner_s": self.learner_s, "scale_run": self.scale_run,  # the scale of the run it was read from
                "rollout_s_at_run_scale": self.rollout_at(self.scale_run),
                "rollout_s_without_tool_latency": self.rollout_at(0.0)}


def calibrate(events: list[dict[str, Any]], warmup: int, scale_run: float) -> Calibration:
    if scale_run <= 0:
        raise BenchError("calibration: the calibration run needs a tool-latency scale > 0")
    steps = measured_steps(events, warmup)
    per_step = []
    for v in steps:
        end: dict[int, float] = {}
        tool: dict[int, float] = {}
        for e in events:
            if e.get("type") != "span" or e["step"] != v["step"] or e["kind"] not in ROLLOUT_KINDS:
                continue
            traj = e["traj"]
            end[traj] = max(end.get(traj, 0.0), e["t1"] - v[Metric.T_START])
            if e["kind"] in MODELLED_KINDS:
                tool[traj] = tool.get(traj, 0.0) + e["t1"] - e["t0"]
        if not end:
            raise BenchError(f"calibration: step {v['step']} has no rollout spans")
        per_step.append([(end[t] - tool.get(t, 0.0), tool.get(t, 0.0) / scale_run) for t in end])
    learner_s = statistics.median(v[Metric.T_END] - v[Metric.FIRST_BACKWARD_T] for v in steps)
    return Calibration(learner_s, scale_run, per_step)

