"""Streaming's learner work against the micro-batched sync's, on the shipped workloads.

    .venv/bin/python -m bench.learner_work [--steps 6] [--rounds 2] [--only NAME] [--json out.json]

For each workload, fresh ``thundersync train`` processes (``learner.bench.run.Runner``) under
``sync`` and ``streaming`` in alternating order, ``rounds`` times; per run the medians of
steps 1.. (step 0 is a warm-up) of ``timing_s/learner`` and ``timing_s/step``, and per workload
streaming / sync ratios of the pooled medians. The machine is shared: read the ratios, with the
load average printed beside them.
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
METRICS = {"learner_s": "timing_s/learner", "step_s": "timing_s/step", "padding_share": "learner/padding_share",
           "open_row_cost": "learner/open_row_cost"}


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
        runs.append({"schedule": schedule, "round": r, **row})
        print(f"{name:14} {schedule:9} r{r}  learner {row['learner_s']:.3f} s  step {row['step_s']:.3f} s",
              flush=True)
    pooled = {s: {col: statistics.median(x[col] for x in runs if x["schedule"] == s) for col in ("learner_s", "step_s")}
              for s in SCHEDULES}
    ratio = {col: pooled["streaming"][col] / pooled["sync"][col] for col in ("learner_s", "step_s")}
    print(f"{name:14} streaming/sync  learner {ratio['learner_s']:.2f}x  step {ratio['step_s']:.2f}x", flush=True)
    return {"config": path, "runs": runs, "pooled": pooled, "streaming_over_sync": ratio}


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
