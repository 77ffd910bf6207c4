"""Benchmark sync, async, fully-async and streaming on the real trainer, same workload.

`thundersync bench` trains the same model on the same task, seed and batch under each
schedule (a fresh `thundersync train` process per schedule: learner pinned to one core,
the rollout worker to another, so the overlap is real), drops the warm-up step and reports
step time, the workload's rollout span R and learner time L, each row's own bound (the least step
its engine and learner work allow under its schedule), efficiency, speedup vs sync, idle ratios, staleness, time
after the last reward and peak learner RSS, beside the simulator's prediction from the
recorded sync run; with speculation in the trainer also the rows sync+spec and
streaming+spec. ``--workload longtail`` runs the long-tail agentic workload. ``--balance X``
scales the modelled tool latency (the only modelled quantity) so that R = X * L;
``--sweep`` repeats the comparison over several R/L. Definitions: docs/bench-report.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from learner.bench.arrival import streaming_ceiling
from learner.bench.measure import (
    BenchError, Calibration, calibrate, compare, drain_steps, load_events, measured_steps, step_timeline, summarize,
)
from learner.bench.plan import QUICK_BUDGET_S, RunCost, plan_steps, refine_run_steps, run_cost, step_estimates
from learner.bench.rows import (
    REFERENCE_ROWS, bench_rows, row_config, row_of, speculation_factors, speculation_metrics,
)
from learner.bench.table import summary_text
from learner.bench.trained import slowest_decile
from learner.bench.window import charged_step
from learner.bench.workloads import WORKLOADS, tail_summary
from learner.config import SCHEDULES, RunConfig, load_config
from learner.cli_args import number, schedule_list

QUICK_STEPS = 6  # one warm-up step + five measured ones
QUICK_CALIBRATION_STEPS = 3  # a warm-up step + two measured ones (the first calibration run)
SWEEP_BALANCES = (0.25, 0.5, 1.0, 2.0, 4.0)
MAX_SCALE = 1000.0  # ToolLatency.scale's upper limit
MIN_REFINE_SCALE = 0.05  # below this the tool waits are too short to re-measure the scale from
PROG = "thundersync bench"
RUN_TIMEOUT_S = 3600.0  # one `thundersync train` run; the longest full bench run takes a few minutes


def _balances(text: str) -> list[float]:
    parse = number(float, 0.0, strict=True)
    return sorted({parse(t.strip()) for t in text.split(",") if t.strip()}) or list(SWEEP_BALANCES)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0]
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--workload", choices=tuple(WORKLOADS), default="default",
                        help="default: configs/bench.yaml at R = L; longtail: configs/bench-longtail.yaml, "
                        "heavy-tailed tool latency at its own scale [default]")
    source.add_argument("--config", help="workload: a run config (calibrated to --balance, default 1)")
    parser.add_argument("--schedules", type=schedule_list, default=list(SCHEDULES), metavar="LIST",
                        help=f"comma list; sync always runs as the baseline [{','.join(SCHEDULES)}]")
    parser.add_argument("--steps", type=number(int, 2), help="optimizer steps per schedule, warm-up included "
                        f"[train.steps of the config; {QUICK_STEPS} with --quick]")
    parser.add_argument("--warmup", type=number(int, 0), default=1, help="first steps left out [1]")
    knob = parser.add_mutually_exclusive_group()
    knob.add_argument("--balance", type=number(float, 0.0, strict=True), metavar="X",
                      help="target R/L: tool-latency scale calibrated so rollout R = X * learner L "
                      "[1; longtail: none, the config's scale]")
    knob.add_argument("--scale", type=number(float, 0.0), metavar="S",
                      help="use this tool-latency scale as is (no calibration run)")
    parser.add_argument("--rounds", type=number(int, 1), default=2, metavar="N",
                        help="runs per schedule, in alternating order; their steps are pooled [2]")
    parser.add_argument("--quick", action="store_true", help=f"up to {QUICK_STEPS} steps per schedule, as many as "
                        f"the two calibration runs ({QUICK_CALIBRATION_STEPS}-{QUICK_STEPS} steps) say fit in "
                        f"{QUICK_BUDGET_S / 60:.1f} minutes on this machine")
    parser.add_argument("--sweep", nargs="?", const=",".join(map(str, SWEEP_BALANCES)), type=_balances,
                        metavar="LIST", help="also measure speedup vs R/L at these balances "
                        f"[{','.join(map(str, SWEEP_BALANCES))}], simulated beside")
    parser.add_argument("--sweep-schedules", type=schedule_list, default=["streaming"], metavar="LIST",
                        help="schedules of each sweep point, sync always runs [streaming]")
    parser.add_argument("--no-speculation", dest="speculation", action="store_false",
                        help="leave out the sync+spec and streaming+spec rows")
    parser.add_argument("--json", metavar="FILE", help='write {"schedules": {...}, "workload": {...}, "machine": {...}}')
    parser.add_argument("--html", metavar="FILE", help="write a self-contained plotly report")
    parser.add_argument("--events-dir", metavar="DIR", help="keep every run's config and JSONL events here")


# ---------------------------------------------------------------- one real training run


class Runner:
    """Launches `thundersync train` processes for one workload and keeps their events."""

    def __init__(self, cfg: RunConfig, workdir: Path):
        self.cfg, self.workdir = cfg, workdir
        self.costs: list[RunCost] = []  # wall time and step times of each run, in order
        self.engine_timings: list[dict[str, Any]] = []  # the engine's costs, timed at each round's start

    def config(self, row: str) -> RunConfig:
        """The run config of a bench row (``learner/bench/rows.py``)."""
        return row_config(self.cfg, row)

    def time_engine(self) -> None:
        """Time the rollout engine's decode, join and copy costs once more, in a process of its own
        (``learner/bench/engine_cost.py``): the simulator's engine model for fully-async. A failure is
        printed and leaves that timing out (with none, fully-async is simulated without the model)."""
        from learner.bench.engine_cost import measure_in_subprocess

        path = self.workdir / "engine-cost.yaml"
        path.write_text(yaml.safe_dump(self.config("sync").model_dump(), sort_keys=False))
        try:
            self.engine_timings.append(measure_in_subprocess(str(path)))
        except (RuntimeError, ValueError) as err:
            print(f"{PROG}: engine cost not timed: {err}", file=sys.stderr)

    def engine_cost(self) -> dict[str, Any] | None:
        """The median of each cost over the timings (one per round: the machine's speed drifts
        between them, as between runs), with every timing kept; None without a timing."""
        if not self.engine_timings:
            return None
        median = {key: statistics.median(t.get(key, 0.0) for t in self.engine_timings)
                  for key in ("a_s", "b_s", "join_s", "copy_s", "b_col_s", "prompt_width")}
        return {**median, "timings": self.engine_timings}

    def train(self, label: str, row: str, steps: int, scale: float) -> list[dict[str, Any]]:
        cfg = self.config(row)
        schedule = cfg.train.schedule
        cfg.train.steps = steps
        cfg.task.tool_latency.scale = scale
        cfg.name = f"bench-{label}"
        config_path = self.workdir / f"{label}.yaml"
        events_path = self.workdir / f"{label}.jsonl"
        config_path.write_text(yaml.safe_dump(cfg.model_dump(), sort_keys=False))
        learner = "deterministic" if cfg.deterministic_learner() else cfg.learner_path()
        spec = ", speculation" if row_of(row).speculation else ""
        print(f"{PROG}: {label}: {schedule} ({learner} learner{spec}), {steps} steps, tool-latency scale "
              f"{scale:.3g} ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "learner.cli", "train", "--config", str(config_path), "--events",
                 str(events_path), "--quiet"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise BenchError(f"{label}: thundersync train still running after {RUN_TIMEOUT_S:.0f} s") from None
        if proc.returncode != 0:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise BenchError(f"{label}: thundersync train exited {proc.returncode}: {last}")
        wall_s = time.monotonic() - t0
        events = load_events(events_path)
        self.costs.append(run_cost(wall_s, events))
        print(f"{PROG}: {label}: done in {wall_s:.0f}s", file=sys.stderr, flush=True)
        return events


def sync_workload(sync_runs: list[list[dict[str, Any]]], warmup: int):
    """The measured steps of the sync runs as one simulator workload (batches pooled, in round
    order); raises ``SimInputError`` / ``ValueError`` when a recording cannot be replayed."""
    from dataclasses import replace

    from learner.sim.command import workload_from_spans

    workloads = [workload_from_spans([e for e in events if e.get("type") not in ("span", "metrics")
                                      or e["step"] >= warmup]) for events in sync_runs]
    return replace(workloads[0], batches=[b for w in workloads for b in w.batches])


def simulated(pooled, schedules: list[str], warmup: int) -> dict[str, Any]:
    """The simulator's prediction per schedule from the sync runs alone, at their machine speed."""
    from learner.sim.command import simulate_all

    schedules = [name for name in schedules if name in SCHEDULES]  # reference rows are not schedules
    results = simulate_all(pooled, schedules, steps=len(pooled.batches) + warmup, warmup=warmup)
    return {name: {k: getattr(r, k) for k in ("step_s", "efficiency", "speedup_vs_sync", "trainer_idle_ratio",
                                               "rollouter_idle_ratio", "staleness_mean", "staleness_max", "tail_s")}
            for name, r in results.items()}


def at_own_speed(pooled, results: dict[str, dict[str, Any]], warmup: int, steps: int,
                 max_staleness: int = 2, per_run: list | None = None) -> dict[str, dict[str, Any]]:
    """Per schedule, the machine as its own runs met it: ``speed_factor`` = its median backward
    over the sync runs' (the same forward + backward in every schedule that trains with sync's
    learner, so a ratio of machine speeds; docs/bench-report.md says how fair), and the simulator's step
    time of it and of sync on the sync workload at that speed (``at_speed``: compute scaled,
    modelled tool waits not). A speedup against the simulated sync at the same speed is what the
    schedule gains on a machine that holds still; the simulated step beside the measured one
    checks the schedule model, not the drift. A schedule with another learner path (streaming's
    adaptive learner) does other work per backward span, so it has no speed factor: it is
    simulated at sync's speed and has no same-speed speedup. Its equal-work step is simulated over
    the window its runs measured (``steps``, warm-up dropped, run on past it by the same drain
    steps): a pipeline that starts full, as fully-async's does, is measured and simulated through
    the same transient, for each sync run apart (``per_run``: their workloads; default the pooled one)."""
    from learner.sim.command import simulate, simulate_all
    from learner.sim.results import equal_work_parts
    from learner.sim.workload import at_speed

    per_run = per_run or [pooled]
    out = {}
    for name, r in results.items():
        if name not in SCHEDULES:
            continue
        same = r["learner"] == results["sync"]["learner"]
        slower = r["backward_ms"] / results["sync"]["backward_ms"] if same else None
        machine = at_speed(pooled, slower or 1.0)
        sim = simulate_all(machine, ["sync", name], steps=len(pooled.batches) + warmup, warmup=warmup)
        # the equal-work step as the bench pools it: each sync run's own batches over the window
        # its runs measured, the parts summed over the runs
        window = trained = produced = 0.0
        for one in per_run:
            run = simulate(at_speed(one, slower or 1.0), name, steps=steps + drain_steps(name, max_staleness),
                           warmup=warmup).run
            parts = equal_work_parts(run, warmup, end=steps)
            window, trained, produced = window + parts[0], trained + parts[1], produced + parts[2]
        out[name] = {"speed_factor": slower, "step_s": sim[name].step_s,
                     "step_equal_work_s": charged_step(window, trained, produced, len(per_run) * (steps - warmup)),
                     "sync_step_s": sim["sync"].step_s if same else None}
    return out


def alternating(arms: list, rounds: int):
    """(round, arm) for every arm in every round, the order reversed each round: a shared
    machine's speed drifts over minutes, and alternating puts the drift on every arm alike."""
    for r in range(rounds):
        for arm in arms if r % 2 == 0 else arms[::-1]:
            yield r, arm


def compare_schedules(runner: Runner, label: str, rows: list[str], steps: int, warmup: int,
                      scale: float, rounds: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """Measure every row (``learner/bench/rows.py``; sync first) at one scale, ``rounds`` times in
    alternating order (sync first, then last, ...): a shared machine's speed drifts over minutes,
    and alternating puts the drift on every row alike. Per-row results (steps pooled) and the
    simulation."""
    runs: dict[str, list[list[dict[str, Any]]]] = {name: [] for name in rows}
    timed_round = -1
    for r, name in alternating(rows, rounds):
        if r != timed_round and "fully-async" in rows:  # the engine model's costs, once a round
            runner.time_engine()
            timed_round = r
        drain = drain_steps(row_of(name).schedule, runner.cfg.train.max_staleness)
        run_label = f"{label}-{name}" + (f"-r{r}" if r else "")
        runs[name].append(runner.train(run_label, name, steps + drain, scale))
    batch = (runner.config("sync").train.prompts_per_step * runner.config("sync").train.group_size,
             runner.config("sync").train.group_size)
    summaries = {name: summarize(runs[name], warmup, end=steps, batch=batch) for name in rows}
    results = compare(summaries, alone={name for name in rows if row_of(name).alone})
    for name, r in results.items():
        r["learner"] = runner.config(name).learner_path()
        r.update(speculation_metrics([v for events in runs[name] for v in measured_steps(events, warmup, steps)]))
    if "streaming" in results:  # what the sync runs' arrival times leave it (docs/bench-report.md)
        results["streaming"].update(streaming_ceiling(runs["sync"], runs["streaming"], warmup, steps,
                                                      runner.config("streaming").learner.max_open_groups,
                                                      results["streaming"]["bound_s"]))
    for name in rows:  # what each trained of the slowest decile sync trains (learner.bench.trained)
        results[name].update(slowest_decile(runs[name], runs["sync"], warmup, steps))
    results["sync"]["trajectory_time"] = tail_summary(runs["sync"], warmup, steps)
    engine = runner.engine_cost()
    return results, replay(runs, results, warmup, steps, engine, runner.cfg.rollout.max_running_rows,
                           runner.cfg.train.max_staleness)


def replay(runs: dict[str, list[list[dict[str, Any]]]], results: dict[str, Any], warmup: int, steps: int,
           engine: dict[str, Any] | None = None, max_rows: int | None = None, max_staleness: int = 2) -> dict[str, Any]:
    """The sync recordings replayed by the simulator, as they ran and at each schedule's machine
    speed (the latter written into ``results``); the simulation per schedule. ``engine``: the
    engine's measured costs, the shared-engine model fully-async is simulated on
    (``learner/sim/shared_engine.py``); ``steps``: the measured runs' length, warm-up included,
    over which each row's equal-work step is simulated as it was measured."""
    from learner.sim.shared_engine import EngineCost, with_shared_engine
    from learner.sim.workload import SimInputError

    try:
        pooled, per_run = sync_workload(runs["sync"], warmup), [sync_workload([one], warmup) for one in runs["sync"]]
        if engine is not None:
            cost = EngineCost(engine["a_s"], engine["b_s"], engine["join_s"], engine.get("copy_s", 0.0),
                              engine.get("b_col_s", 0.0), engine.get("prompt_width", 0.0))
            pooled = with_shared_engine(pooled, cost, max_rows)
            per_run = [with_shared_engine(one, cost, max_rows) for one in per_run]
        sim = simulated(pooled, list(results), warmup)
        own = at_own_speed(pooled, results, warmup, steps, max_staleness, per_run)
        if pooled.engine is not None:
            sim["engine_model"] = {**pooled.inputs["engine_model"], "measured": engine}
    except (SimInputError, ValueError) as err:
        print(f"{PROG}: no simulation: {err}", file=sys.stderr)
        sim, own = {"error": str(err)}, {}
    for name, r in results.items():
        r["timeline"] = step_timeline(runs[name][0], warmup)
        if name in own:
            r["speed_factor"] = own[name]["speed_factor"]
            r["simulated_step_s"] = own[name]["step_s"]
            r["simulated_error"] = own[name]["step_s"] / r["step_s"] - 1.0
            # the simulator models a steady state: against the step charged for any backlog the
            # measured window consumed (learner.bench.window), the figure to hold it to
            r["simulated_step_equal_work_s"] = own[name]["step_equal_work_s"]
            if r.get("step_equal_work_s") and own[name]["step_equal_work_s"]:
                r["simulated_error_equal_work"] = own[name]["step_equal_work_s"] / r["step_equal_work_s"] - 1.0
            sync_at_speed = own[name]["sync_step_s"]
            r["speedup_same_speed"] = sync_at_speed / r["step_s"] if sync_at_speed is not None else None
    return sim


# ---------------------------------------------------------------- report


def machine_info() -> dict[str, Any]:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    import torch

    return {
        "cpus": os.cpu_count(), "cores": cores, "learner_core": cores[0],
        "rollout_cores": cores[1:] or cores, "pinned": len(cores) > 1,
        "platform": platform.platform(), "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(), "torch": torch.__version__, "torch_threads_per_process": 1,
        "load_avg_start": list(os.getloadavg()),
    }


def workload_info(cfg: RunConfig, steps: int, warmup: int, rounds: int, scale: float, balance: float | None,
                  calibration: Calibration | None, sync: dict[str, Any]) -> dict[str, Any]:
    lat = cfg.task.tool_latency
    return {
        "config": cfg.name, "model": cfg.model.policy, "task": cfg.task.name, "seed": cfg.seed,
        "objective": cfg.algorithm.objective, "kl_coef": cfg.algorithm.kl_coef,
        "prompts_per_step": cfg.train.prompts_per_step, "group_size": cfg.train.group_size,
        "trajectories_per_step": cfg.train.prompts_per_step * cfg.train.group_size,
        "ops": [cfg.task.min_ops, cfg.task.max_ops], "max_turns": cfg.task.max_turns,
        "max_new_tokens": cfg.rollout.max_new_tokens, "rollout_workers": cfg.rollout.workers,
        "steps_per_schedule": steps, "warmup_steps": warmup, "rounds": rounds,
        "drain_steps": {s: drain_steps(s, cfg.train.max_staleness) for s in SCHEDULES},
        "tool_latency": {"distribution": lat.distribution, "median_s": lat.median_s, "sigma": lat.sigma,
                         "alpha": lat.alpha, "max_s": lat.max_s, "scale": scale, "modelled": True},
        "balance_target": balance,
        "balance_measured": sync["rollout_s"] / sync["learner_s"],
        "rollout_s": sync["rollout_s"], "learner_s": sync["learner_s"],
        "rollout_s_predicted": calibration.rollout_at(scale) if calibration else None,
        "calibration": calibration.as_dict() if calibration else None,
    }


# ---------------------------------------------------------------- command


def _error(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def resolve_knob(args: argparse.Namespace, cfg: RunConfig) -> None:
    """What sets the tool-latency scale: a given ``--scale``, a ``--balance`` to calibrate to, or,
    for a workload without a default balance (longtail) and neither flag nor ``--sweep``, the
    config's own scale (its latency model as written)."""
    if args.scale is not None or args.balance is not None:
        return
    default = 1.0 if args.config else WORKLOADS[args.workload].balance
    if default is None and not args.sweep:
        args.scale = cfg.task.tool_latency.scale
    else:
        args.balance = default or 1.0


def run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config or WORKLOADS[args.workload].config)  # ConfigError: the CLI prints it, exits 2
    started = time.monotonic()
    steps = args.steps or (QUICK_STEPS if args.quick else cfg.train.steps)
    if steps <= args.warmup:
        return _error(f"--steps: must be larger than --warmup ({args.warmup}) to leave a measured step, got {steps}")
    if args.sweep and args.scale is not None:
        return _error("--sweep: sets the scale per balance, cannot be combined with --scale")
    for flag in ("json", "html"):
        path = getattr(args, flag)
        if path and not Path(path).resolve().parent.is_dir():
            return _error(f"--{flag}: directory of {path} does not exist")
    resolve_knob(args, cfg)
    machine = machine_info()
    with tempfile.TemporaryDirectory(prefix="thundersync-bench-") as tmp:
        workdir = Path(args.events_dir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        try:
            doc = bench(Runner(cfg, workdir), cfg, args, steps, started)
        except BenchError as err:
            print(f"{PROG}: failed: {err}", file=sys.stderr)
            return 1
    machine["load_avg_end"] = list(os.getloadavg())
    doc["machine"] = machine
    print(summary_text(doc))
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    if args.html:
        from learner.bench.report import render_html

        Path(args.html).write_text(render_html(doc))
    return 0


def bench(runner: Runner, cfg: RunConfig, args: argparse.Namespace, steps: int, started: float) -> dict[str, Any]:
    warmup = args.warmup
    calibration = calibrate_scale(runner, args, steps) if args.scale is None else None
    scale = args.scale if args.scale is not None else calibration.scale_for(args.balance, MAX_SCALE)
    if args.quick and not args.steps and not args.sweep:
        if calibration is None and scale > 0:  # a given scale: one short sync run measures the machine
            calibration = calibrate(runner.train("probe", "sync", calibration_steps(args, steps), scale), warmup, scale)
        if calibration is not None:
            steps = quick_steps(runner, args, calibration, scale, time.monotonic() - started)
    rows = bench_rows(args.schedules, reference=True, speculation=args.speculation)
    results, sim = compare_schedules(runner, "main", rows, steps, warmup, scale, args.rounds)
    balance = None if args.scale is not None else args.balance
    workload = workload_info(cfg, steps, warmup, args.rounds, scale, balance, calibration, results["sync"])
    workload.update(name=args.workload if not args.config else None, trajectory_time=results["sync"].pop("trajectory_time"))
    doc = {"schedules": {name: results[name] for name in rows}, "simulated": sim, "workload": workload,
           "speculation": speculation_factors(results)}
    if args.sweep:
        doc["sweep"] = sweep(runner, args, steps, calibration, main=(args.balance, results, sim))
    return doc


def calibrate_scale(runner: Runner, args: argparse.Namespace, steps: int) -> Calibration:
    """R as a function of the tool-latency scale, from one or two sync runs (docs/bench.md)."""
    # the same sync workload at scale 1: tool latency changes no sampled token (tasks and
    # sampling seeds are fixed per trajectory id), so its steps hold the very trajectories
    # the measured runs will have, only their waits differ
    cal_steps = calibration_steps(args, steps)
    events = runner.train("calibration", "sync", cal_steps, 1.0)
    calibration = calibrate(events, args.warmup, 1.0)
    # the model holds generation and queueing behind generate calls fixed, which they are
    # not quite once tool waits change who shares a call: a second sync run at the first
    # estimate measures them where the bench will run, and the estimate is refined from it
    first = calibration.scale_for(args.balance, MAX_SCALE)
    if first >= MIN_REFINE_SCALE:
        sync_step_s = calibration.rollout_at(first) + calibration.learner_s
        refine_steps = refine_run_steps(cal_steps, steps, runner.costs[-1].fixed_s, sync_step_s)
        events = runner.train("calibration-2", "sync", refine_steps, first)
        calibration = calibrate(events, args.warmup, first)
    return calibration


def quick_steps(runner: Runner, args: argparse.Namespace, calibration: Calibration, scale: float,
                elapsed_s: float) -> int:
    """Steps per run that fit what is left of --quick's budget, planned from the last
    calibration run (the machine as it is now; bench/plan.py)."""
    cost = runner.costs[-1]
    order = bench_rows(args.schedules, reference=True, speculation=args.speculation)
    estimates = step_estimates(order, cost.steady_step_s, calibration.rollout_at(scale), calibration.learner_s)
    for name in REFERENCE_ROWS:  # a sync whose learner takes about twice the micro-batched L (docs/learner.md)
        estimates[name] = cost.steady_step_s + calibration.learner_s
    drains = {name: drain_steps(row_of(name).schedule, runner.cfg.train.max_staleness) for name in order}
    steps, total = plan_steps(QUICK_BUDGET_S - elapsed_s, cost.fixed_s, estimates, drains, args.rounds,
                              most=QUICK_STEPS, least=args.warmup + 2)
    print(f"{PROG}: --quick: {steps} steps per run, estimated to end {elapsed_s + total:.0f} s after the start "
          f"(budget {QUICK_BUDGET_S:.0f} s)", file=sys.stderr, flush=True)
    return steps


def calibration_steps(args: argparse.Namespace, steps: int) -> int:
    """Steps of the calibration run: the measured runs' own, or with ``--quick`` (and no
    ``--steps``) a warm-up and two measured steps (the refining run's: ``refine_run_steps``)."""
    if args.quick and not args.steps:
        return min(steps, max(args.warmup + 2, QUICK_CALIBRATION_STEPS))
    return steps


def sweep(runner: Runner, args: argparse.Namespace, steps: int, calibration: Calibration,
          main: tuple[float, dict, dict]) -> list[dict[str, Any]]:
    """Speedup vs R/L: measured at each balance (the main run reused at its own), simulated beside."""
    points = []
    for balance in args.sweep:
        scale = calibration.scale_for(balance, MAX_SCALE)
        if balance == main[0]:
            results, sim = main[1], main[2]
        else:
            results, sim = compare_schedules(runner, f"sweep-{balance:g}", bench_rows(args.sweep_schedules, False, False),
                                             steps, args.warmup, scale, args.rounds)
        sync = results["sync"]
        points.append({
            "balance_target": balance, "scale": scale, "balance_measured": sync["rollout_s"] / sync["learner_s"],
            "rollout_s": sync["rollout_s"], "learner_s": sync["learner_s"],
            "measured": {n: {k: r.get(k) for k in ("step_s", "speedup_vs_sync", "speedup_same_speed", "efficiency",
                                                   "trainer_idle_ratio", "simulated_error")}
                         for n, r in results.items()},
            "simulated": sim,
        })
    return points
