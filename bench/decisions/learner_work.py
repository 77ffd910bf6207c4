"""Streaming's learner work against the micro-batched sync's, on the shipped workloads.

    .venv/bin/python -m bench.decisions.learner_work [--steps 6] [--rounds 2] [--only NAME] [--json out.json]

For each workload, fresh ``thundersync train`` processes (``learner.bench.run.Runner``) under
``sync`` and ``streaming`` in alternating order, ``rounds`` times; per run the medians of
steps 1.. (step 0 is a warm-up) of ``timing_s/learner`` and ``timing_s/step``, and per workload
streaming / sync ratios of the pooled medians. The machine is shared: read the ratios, with the
load average printed beside them. Beside the wall-clock learner seconds, what does not move with
the load: the learner thread's CPU seconds in its forwards and backwards (``learner/cpu_s``) and
the token slots they covered (``learner/token_slots``), so a gap can be told apart as work (more
slots, more CPU) or contention (the same CPU, more wall-clock: a learner that overlaps the
rollout shares the machine with it, sync's runs alone). Every run has speculation off (the bench
rows ``sync`` and ``streaming``, learner/bench/rows.py), the long-tail workload's included: what
is compared is the learner's work, not what drafts add to the rollout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.load_report import finish
from learner.bench.measure import measured_steps
from learner.bench.run import Runner, alternating
from learner.config import RunConfig, load_config

SCHEDULES = ["sync", "streaming"]
METRICS = {"learner_s": "timing_s/learner", "step_s": "timing_s/step", "cpu_s": "learner/cpu_s",
           "token_slots": "learner/token_slots", "micro_batches": "learner/micro_batches",
           "padding_share": "learner/padding_share", "open_row_cost": "learner/open_row_cost",
           "open_rows": "learner/open_rows", "open_micro_batches": "learner/open_micro_batches",
           "early_micro_batches": "learner/early_micro_batches", "tail_s": "timing_s/tail"}
RATIOS = ("learner_s", "step_s", "cpu_s", "token_slots")


def _kl(cfg: RunConfig) -> None:
    cfg.algorithm.kl_coef = 0.04


def _kl_16(cfg: RunConfig) -> None:
    _kl(cfg)
    cfg.task.tool_latency.scale = 0.3
    cfg.train.prompts_per_step = 16


WORKLOADS: dict[str, tuple[str, Callable[[RunConfig], None] | None]] = {
    "quickstart": ("configs/quickstart.yaml", None),
    "bench": ("configs/bench.yaml", None),
    "bench-kl": ("configs/bench.yaml", _kl),
    "bench-kl-16x8": ("configs/bench.yaml", _kl_16),
    "long-prompt": ("configs/long-prompt.yaml", None),  # a 796-token shared prompt, shared_prompt_backward on
    "longtail": ("configs/bench-longtail.yaml", None),  # Pareto tool latency at its own scale; speculation off here
}


def _median(values: list[dict], metric: str) -> float | None:
    present = [v[metric] for v in values if metric in v]
    return statistics.median(present) if present else None


def measure(name: str, steps: int, rounds: int, workdir: Path) -> dict:
    path, edit = WORKLOADS[name]
    cfg = load_config(path)
    if edit:
        edit(cfg)
    runner = Runner(cfg, workdir)
    runs: list[dict] = []
    for r, schedule in alternating(SCHEDULES, rounds):
        events = runner.train(f"{name}-{schedule}-r{r}", schedule, steps, cfg.task.tool_latency.scale)
        values = measured_steps(events, warmup=1)
        row = {col: _median(values, metric) for col, metric in METRICS.items()}
        runs.append({"schedule": schedule, "round": r, "load": os.getloadavg()[0], **row})
        print(f"{name:14} {schedule:9} r{r}  learner {_fmt(row['learner_s'])} s (cpu {_fmt(row['cpu_s'])} s, "
              f"{_fmt(row['token_slots'], '.0f')} slots, {_fmt(row['micro_batches'], '.0f')} micro-batches)  "
              f"step {_fmt(row['step_s'])} s  load {runs[-1]['load']:.1f}", flush=True)
    pooled = {s: {col: _median([x for x in runs if x["schedule"] == s and x[col] is not None], col) for col in RATIOS}
              for s in SCHEDULES}
    ratio = {col: pooled["streaming"][col] / pooled["sync"][col] for col in RATIOS
             if pooled["streaming"][col] is not None and pooled["sync"][col]}
    print(f"{name:14} streaming/sync  " + "  ".join(f"{col} {v:.2f}x" for col, v in ratio.items()), flush=True)
    return {"config": path, "runs": runs, "pooled": pooled, "streaming_over_sync": ratio}


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", action="append", choices=list(WORKLOADS), help="workloads to run (default: all)")
    ap.add_argument("--json")
    args = ap.parse_args()
    out = {"load_start": os.getloadavg()[0], "steps_per_run": args.steps, "rounds": args.rounds, "workloads": {}}
    with tempfile.TemporaryDirectory(prefix="thundersync-learner-work-") as tmp:
        for name in args.only or list(WORKLOADS):
            out["workloads"][name] = measure(name, args.steps, args.rounds, Path(tmp))
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
