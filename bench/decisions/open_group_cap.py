"""Bounded open groups on the bench workload: K = max_open_groups against unlimited, side by side.

    .venv/bin/python -m bench.decisions.open_group_cap [--cap 2] [--scale S] [--steps 6] [--rounds 2] [--json out.json]

Trains ``configs/bench.yaml`` under ``streaming`` (adaptive learner) with ``learner.max_open_groups``
unlimited and K, and under ``sync`` (micro-batched) for the memory reference, one fresh
``thundersync train`` process per run, in alternating order, ``--rounds`` times; the first
step of each run is a warm-up and dropped. Per variant: median step time over the pooled
measured steps, the most gradient-sized buffers held at once (``actor/peak_buffers``; at most
1 + 2K), the accumulator's peak MB and the learner process's peak RSS. Exactness at every K is
``thundersync check-exactness`` (and ``thundersync audit`` of a ``--dump-step``).
Beside the measurement, the sync runs' recorded arrivals replayed through ``bench/arrival_bound.py``:
the earliest any drain policy of cap K could finish each step's backward work, unlimited vs K.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.load_report import finish
from learner.bench.arrival import bounds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/bench.yaml")
    ap.add_argument("--cap", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0, help="tool-latency scale (the bench's at balance)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    from learner.bench.measure import measured_steps
    from learner.bench.run import Runner, alternating
    from learner.config import load_config

    variants = {"streaming-unlimited": ("streaming", None), f"streaming-K{args.cap}": ("streaming", args.cap),
                "sync": ("sync", None)}
    load_start = os.getloadavg()[0]
    steps: dict[str, list[dict]] = {name: [] for name in variants}
    arrivals: list[dict] = []  # per measured sync step: the arrival bound per K
    with tempfile.TemporaryDirectory(prefix="thundersync-cap-") as tmp:
        for r, name in alternating(list(variants), args.rounds):
            schedule, cap = variants[name]
            cfg = load_config(args.config)
            cfg.learner.max_open_groups = cap
            events = Runner(cfg, Path(tmp)).train(f"{name}-r{r}", schedule, args.steps, args.scale)
            steps[name] += measured_steps(events, warmup=1)
            if schedule == "sync":
                arrivals += [b for b in bounds(events, [None, args.cap]) if b["step"] >= 1]
    out = {"variants": {}, "scale": args.scale, "steps_per_run": args.steps, "rounds": args.rounds,
           "load_start": load_start}
    for name, values in steps.items():
        out["variants"][name] = {
            "max_open_groups": variants[name][1], "schedule": variants[name][0],
            "step_s": statistics.median(v["timing_s/step"] for v in values),
            "step_s_all": [v["timing_s/step"] for v in values],
            "peak_buffers": max(v["actor/peak_buffers"] for v in values),
            "peak_accumulator_mb": max(v["learner/peak_accumulator_mb"] for v in values),
            "peak_rss_mb": max(v["memory/peak_rss_mb"] for v in values),
            "skipped_trajectories": statistics.median(v["learner/skipped_trajectories"] for v in values),
        }
    ratios = [b["finish_s"][f"K={args.cap}"] / b["finish_s"]["unlimited"] for b in arrivals]
    out["arrival_bound"] = {"steps": arrivals, "median_finish_vs_unlimited": statistics.median(ratios)}
    print(f"arrival bound (sync runs' arrivals, {len(ratios)} steps): the learner's earliest finish with K={args.cap} "
          f"is {out['arrival_bound']['median_finish_vs_unlimited']:.2f}x unlimited's (median; "
          f"{min(ratios):.2f}-{max(ratios):.2f})")
    base = out["variants"]["streaming-unlimited"]["step_s"]
    for name, v in out["variants"].items():
        v["step_vs_unlimited"] = v["step_s"] / base
        print(f"{name:22} step {v['step_s']:.3f} s ({v['step_vs_unlimited']:.2f}x)  peak buffers "
              f"{v['peak_buffers']:.0f}  accumulator {v['peak_accumulator_mb']:.2f} MB  RSS {v['peak_rss_mb']:.0f} MB")
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
