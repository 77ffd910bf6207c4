"""Results of the schedule simulator and its Python API (the bench compares them with measured runs).

    workload = workload_from_spans(events)            # or synthetic_workload(spec, steps, seed)
    result = simulate(workload, "streaming", steps=10, warmup=2)   # -> ScheduleResult
    results = simulate_all(workload)                  # every schedule, speedup_vs_sync filled in
    report = simulate_spans(events)                   # {"schedules": {...}, "inputs": {...}}
    events = simulated_events(result)                 # JSONL-ready run/span/metrics events

Summary numbers over the steps after ``warmup`` (steps are publish end to publish end, as
the driver's ``timing_s/step``): step_s (median), rollout_s R (a batch's rollout makespan
alone on the slots), learner_s L (its learner wall time alone, all rewards in hand),
bound_s = max(R, L), efficiency = bound_s / step_s, speedup_vs_sync = sync step_s /
step_s, idle ratios over the measured window (timeline.window_metrics), staleness
(trained step - sampled version, per trajectory), tail_s (median learner time from the
moment the batch could first be trained, its last reward or the previous publish, to the
complete gradient: backward, closes and reduction, without optimizer and publish),
step_equal_work_s (the window per batch it produced, as the bench measures a row:
``equal_work_step``).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

from learner.config import SCHEDULES
from learner.sim.engine import SimRun, learner_alone_s, rollout_alone_s, run_schedule
from learner.sim.workload import Workload, workload_from_spans
from learner.timeline import Kind, Metric, Span, window_metrics


@dataclass
class ScheduleResult:
    schedule: str
    step_s: float
    rollout_s: float
    learner_s: float
    bound_s: float
    efficiency: float
    trainer_idle_ratio: float
    rollouter_idle_ratio: float
    staleness_mean: float
    staleness_max: int
    tail_s: float
    speedup_vs_sync: float | None = None
    step_equal_work_s: float | None = None  # the window per batch it produced (learner/bench/window.py)
    per_step: list[dict[str, float]] = field(default_factory=list)
    run: SimRun | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)  # asdict recurses into the SimRun; drop it
        out.pop("run")
        return out


def step_metrics(run: SimRun, spans: list[Span]) -> list[dict[str, float]]:
    """Per-step values under the driver's metric names (learner/driver/loop.py)."""
    out = []
    for rec in run.steps:
        width = rec.t_end - rec.t_start
        window = [s for s in spans if s.t1 > rec.t_start and s.t0 < rec.t_end]
        idle = window_metrics(window, rec.t_start, rec.t_end)
        stale = rec.staleness
        out.append({
            **idle,
            Metric.STEP_S: width,
            Metric.LEARNER_S: (1.0 - idle[Metric.TRAINER_IDLE]) * width,
            Metric.GEN_S: (1.0 - idle[Metric.ROLLOUT_IDLE]) * width,
            Metric.TAIL_S: rec.t_end - rec.last_reward,
            Metric.T_START: rec.t_start,
            Metric.T_END: rec.t_end,
            Metric.LAST_REWARD_T: rec.last_reward,
            Metric.STALENESS_MEAN: sum(stale) / len(stale),
            Metric.STALENESS_MAX: float(max(stale)),
        })
    return out


def rollout_spans(run: SimRun) -> list[Span]:
    """Slot occupancy as spans: as the engine model ran them, else recorded sub-spans shifted to the
    simulated start, else one generate."""
    spans = []
    for rec_trajs in ([t for rec in run.steps for t in rec.trajs], run.unfinished):
        for t in rec_trajs:
            lane = f"rollout/0/{t.slot}"
            if t.drawn:  # an engine model's timing (learner/sim/shared_engine.py)
                spans += [Span(t.step, kind, t0, t1, lane, t.traj, t.group, turn, t.version, tokens)
                          for kind, t0, t1, turn, tokens in t.drawn]
                continue
            parts = t.work.segments or ()
            if not parts:
                spans.append(Span(t.step, Kind.GENERATE, t.start, t.end, lane, t.traj, t.group, 0, t.version))
            for p in parts:
                spans.append(Span(t.step, p.kind, t.start + p.t0, t.start + p.t1, lane, t.traj, t.group, p.turn,
                                  t.version, p.tokens))
    return spans


def equal_work_parts(run: SimRun, warmup: int, end: int | None = None) -> tuple[float, int, int]:
    """(window seconds, trajectories trained, trajectories produced) over steps ``warmup .. end-1``:
    the parts of ``equal_work_step``, to pool over several runs as the bench pools its rounds."""
    measured = run.steps[warmup:end]
    t0, t1 = measured[0].t_start, measured[-1].t_end
    dropped = {d[1] for d in run.decisions if d[0] == "drop"}
    every = [t for rec in run.steps for t in rec.trajs] + run.unfinished
    produced = sum(1 for t in every if t0 < t.end <= t1 and t.group not in dropped)
    return t1 - t0, sum(len(rec.trajs) for rec in measured), produced


def equal_work_step(run: SimRun, warmup: int, end: int | None = None) -> float | None:
    """The simulated window's length (steps ``warmup .. end-1``) per batch *produced*, as the bench
    defines it for a measured row (``learner/bench/window.py``): rewards that landed in the window,
    less the members of groups dropped as too stale, against the trajectories trained; None when
    none was produced. ``end`` before the run's last step leaves out the run's end, where
    fully-async admits no more than the remaining steps need and waits for its slowest groups
    (the bench's runs go on past their window for the same reason, ``drain_steps``)."""
    window, trained, produced = equal_work_parts(run, warmup, end)
    steps = len(run.steps[warmup:end])
    return window * trained / steps / produced if produced else None


def simulate(workload: Workload, schedule: str, steps: int = 10, warmup: int = 2, max_staleness: int = 2,
             assign: str = "group-affinity", per_step: bool = True) -> ScheduleResult:
    """Run ``schedule`` for ``steps`` optimizer steps and summarise steps ``warmup..steps-1``;
    ``per_step=False`` leaves ``per_step`` empty (each step's idle is a pass over every span: the
    summary alone costs about half as much on a recorded run's thousands of spans)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule: expected one of {', '.join(SCHEDULES)}, got {schedule!r}")
    if not 0 <= warmup < steps:
        raise ValueError(f"warmup: must be >= 0 and smaller than steps ({steps}), got {warmup}")
    run = run_schedule(workload, schedule, steps, max_staleness, assign)
    run.spans = sorted(run.spans + rollout_spans(run), key=lambda s: (s.t0, s.t1, s.lane))
    for seq, span in enumerate(run.spans):
        span.seq = seq
    per_step = step_metrics(run, run.spans) if per_step else []
    measured = run.steps[warmup:]
    idle = window_metrics(run.spans, measured[0].t_start, measured[-1].t_end)
    stale = [v for rec in measured for v in rec.staleness]
    rollout_s = statistics.median(rollout_alone_s(workload, r.step) for r in measured)
    learner_s = statistics.median(learner_alone_s(workload, r.step, assign) for r in measured)
    step_s = statistics.median(r.t_end - r.t_start for r in measured)
    bound = max(rollout_s, learner_s)
    return ScheduleResult(
        schedule=schedule,
        step_s=step_s,
        rollout_s=rollout_s,
        learner_s=learner_s,
        bound_s=bound,
        efficiency=bound / step_s,
        trainer_idle_ratio=idle[Metric.TRAINER_IDLE],
        rollouter_idle_ratio=idle[Metric.ROLLOUT_IDLE],
        staleness_mean=sum(stale) / len(stale),
        staleness_max=max(stale),
        tail_s=statistics.median(r.grad_ready - max(r.last_reward, r.t_start) for r in measured),
        step_equal_work_s=equal_work_step(run, warmup),
        per_step=per_step,
        run=run,
    )


def simulate_all(workload: Workload, schedules: Iterable[str] = SCHEDULES, **kwargs: Any) -> dict[str, ScheduleResult]:
    """Simulate each schedule; sync is always run too, as the speedup baseline."""
    wanted = list(schedules)
    results = {s: simulate(workload, s, **kwargs) for s in dict.fromkeys(["sync", *wanted])}
    for r in results.values():
        r.speedup_vs_sync = results["sync"].step_s / r.step_s
    return {s: results[s] for s in wanted}


def report(workload: Workload, results: dict[str, ScheduleResult], **settings: Any) -> dict[str, Any]:
    """The ``--json`` document: {"schedules": {name: summary}, "inputs": {...}}."""
    return {
        "schedules": {s: r.as_dict() for s, r in results.items()},
        "inputs": {**workload.inputs, "rollout_slots": workload.rollout_slots,
                   "learner_ranks": workload.learner_ranks, "reduce_s": workload.reduce_s, **settings},
    }


def simulate_spans(events: Iterable[dict[str, Any]], schedules: Iterable[str] = SCHEDULES,
                   **kwargs: Any) -> dict[str, Any]:
    """Replay a recorded run (span dicts or full JSONL events) under each schedule."""
    workload = workload_from_spans(events)
    return report(workload, simulate_all(workload, schedules, **kwargs), **kwargs)


def simulated_events(result: ScheduleResult, inputs: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The simulated run as a JSONL event stream (docs/architecture.md), for the Gantt and Perfetto."""
    events: list[dict[str, Any]] = [{
        "type": "run", "status": "started", "t": 0.0,
        "simulated": True, "schedule": result.schedule, "inputs": inputs or {},
    }]
    events += [s.to_event() for s in result.run.spans]
    events += [{"type": "metrics", "step": i, "values": v} for i, v in enumerate(result.per_step)]
    summary = {k: v for k, v in result.as_dict().items() if k != "per_step"}
    events.append({"type": "run", "status": "finished", "summary": summary})
    return events
