"""What streaming's deterministic learner costs: streaming with ``learner.deterministic`` on and off, side by side.

    .venv/bin/python bench/deterministic_cost.py [--scale S] [--steps 6] [--rounds 2] [--json out.json]

Trains ``configs/bench.yaml`` under ``streaming`` with the adaptive learner
(``learner.deterministic: false``) and the deterministic one (``true``), and under ``sync``
(micro-batched, deterministic by construction) as the baseline, one fresh ``thundersync train``
process per run, in alternating order, ``--rounds`` times; the first step of each run is a
warm-up and dropped. Per variant, medians over the pooled measured steps: step time, learner
time (``timing_s/learner``), time after the last reward (``timing_s/tail``), the learner's
idle ratio, micro-batches per step and the accumulator's MB (docs/learner.md, "Deterministic mode").
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.load_report import finish  # noqa: E402

VARIANTS = {"streaming-adaptive": ("streaming", False), "streaming-deterministic": ("streaming", True),
            "sync": ("sync", False)}
COLUMNS = {"step_s": "timing_s/step", "learner_s": "timing_s/learner", "tail_s": "timing_s/tail",
           "trainer_idle": "trainer/idle_ratio", "micro_batches": "learner/micro_batches",
           "accumulator_mb": "learner/peak_accumulator_mb"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/bench.yaml")
    ap.add_argument("--scale", type=float, default=1.0, help="tool-latency scale")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    from learner.bench.measure import measured_steps
    from learner.bench.run import Runner, alternating
    from learner.config import load_config

    load_start = os.getloadavg()[0]
    steps: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="thundersync-det-") as tmp:
        for r, name in alternating(list(VARIANTS), args.rounds):
            schedule, deterministic = VARIANTS[name]
            cfg = load_config(args.config)
            cfg.learner.deterministic = deterministic
            events = Runner(cfg, Path(tmp)).train(f"{name}-r{r}", schedule, args.steps, args.scale)
            steps[name] += measured_steps(events, warmup=1)
    out = {"variants": {}, "scale": args.scale, "steps_per_run": args.steps, "rounds": args.rounds,
           "load_start": load_start}
    for name, values in steps.items():
        row = {col: statistics.median(v[metric] for v in values) for col, metric in COLUMNS.items()}
        out["variants"][name] = {**row, "step_s_all": [v[COLUMNS["step_s"]] for v in values]}
    base = out["variants"]["streaming-adaptive"]
    for name, v in out["variants"].items():
        v["step_vs_adaptive"] = v["step_s"] / base["step_s"]
        v["learner_vs_adaptive"] = v["learner_s"] / base["learner_s"]
        print(f"{name:24} step {v['step_s']:.3f} s ({v['step_vs_adaptive']:.2f}x)  learner {v['learner_s']:.3f} s "
              f"({v['learner_vs_adaptive']:.2f}x)  tail {v['tail_s']:.3f} s  idle {v['trainer_idle']:.2f}  "
              f"micro-batches {v['micro_batches']:.0f}  accumulator {v['accumulator_mb']:.2f} MB")
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
