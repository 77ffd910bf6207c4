"""Learner seconds per step with and without the shared-prompt backward, sync and streaming.

    .venv/bin/python -m bench.decisions.shared_prompt [--config configs/long-prompt.yaml] [--steps 6] [--rounds 2]
                                            [--schedules sync,streaming] [--lora RANK] [--json out.json]

Four arms, ``sync`` / ``streaming`` × ``learner.shared_prompt_backward`` off / on, each a fresh
``thundersync train`` process (``learner.bench.run.Runner``), in alternating order ``rounds``
times; per run the medians of steps 1.. (step 0 is a warm-up) of ``timing_s/learner`` and
``timing_s/step``; per arm the median over its runs, and the on / off ratios per schedule.
``--lora RANK``: the policy with LoRA adapters of that rank (``model.lora``, the default target
modules) in every arm. The machine is shared: read the ratios beside the load average printed
with them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.load_report import finish
from learner.bench.measure import measured_steps
from learner.bench.run import Runner, alternating
from learner.config import LoraSettings, load_config

ARMS = [("sync", False), ("sync", True), ("streaming", False), ("streaming", True)]
METRICS = {"learner_s": "timing_s/learner", "step_s": "timing_s/step", "shared_rows": "learner/shared_prompt_rows"}


def _median(values: list[dict], metric: str) -> float | None:
    present = [v[metric] for v in values if metric in v]
    return statistics.median(present) if present else None


def measure(config: str, steps: int, rounds: int, workdir: Path, schedules: tuple[str, ...] = ("sync", "streaming"),
            lora_rank: int | None = None) -> dict:
    runners = {}
    for shared in (False, True):
        cfg = load_config(config)
        cfg.learner.shared_prompt_backward = shared
        if lora_rank is not None:
            cfg.model.lora = LoraSettings(rank=lora_rank, alpha=2.0 * lora_rank)
        runners[shared] = Runner(cfg, workdir)
    arms = [(s, sh) for s, sh in ARMS if s in schedules]
    runs = []
    for r, (schedule, shared) in alternating(arms, rounds):
        label = f"{schedule}-{'shared' if shared else 'plain'}-r{r}"
        runner = runners[shared]
        values = measured_steps(runner.train(label, schedule, steps, runner.cfg.task.tool_latency.scale), warmup=1)
        row = {col: _median(values, metric) for col, metric in METRICS.items()}
        runs.append({"schedule": schedule, "shared_prompt_backward": shared, "round": r, **row,
                     "load": os.getloadavg()[0]})
        print(f"{schedule:9} shared {'on ' if shared else 'off'} r{r}  learner {row['learner_s']:.3f} s  "
              f"step {row['step_s']:.3f} s  load {runs[-1]['load']:.1f}", flush=True)
    pooled = {f"{s}/{'on' if sh else 'off'}": {col: statistics.median(x[col] for x in runs
                                                                     if (x["schedule"], x["shared_prompt_backward"]) == (s, sh))
                                               for col in ("learner_s", "step_s")} for s, sh in arms}
    ratios = {s: {col: pooled[f"{s}/on"][col] / pooled[f"{s}/off"][col] for col in ("learner_s", "step_s")}
              for s in schedules}
    for arm, row in pooled.items():
        print(f"{arm:14} learner {row['learner_s']:.3f} s  step {row['step_s']:.3f} s")
    for s, ratio in ratios.items():
        print(f"{s:9} on/off  learner {ratio['learner_s']:.2f}x  step {ratio['step_s']:.2f}x")
    return {"config": config, "lora_rank": lora_rank, "runs": runs, "pooled": pooled, "on_over_off": ratios}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/long-prompt.yaml")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--schedules", default="sync,streaming", help="comma-separated: sync, streaming")
    ap.add_argument("--lora", type=int, metavar="RANK", help="LoRA adapters of this rank on the policy")
    ap.add_argument("--json")
    args = ap.parse_args()
    schedules = tuple(s for s in args.schedules.split(",") if s)
    if not schedules or set(schedules) - {"sync", "streaming"}:
        ap.error(f"--schedules: sync and/or streaming, got {args.schedules!r}")
    if args.lora is not None and args.lora < 1:
        ap.error(f"--lora: a rank >= 1, got {args.lora}")
    out = {"load_start": os.getloadavg()[0], "steps_per_run": args.steps, "rounds": args.rounds}
    with tempfile.TemporaryDirectory(prefix="thundersync-shared-prompt-") as tmp:
        out.update(measure(args.config, args.steps, args.rounds, Path(tmp), schedules, args.lora))
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
