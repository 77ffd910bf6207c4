"""Side-by-side runs of config variants on the real trainer: one fresh ``thundersync train``
process per run, variants in alternating order, ``rounds`` times; the first step of each run is a
warm-up and dropped; per variant the medians of the pooled measured steps (the machine's speed
drifts, so only ratios measured in one invocation are compared)."""

from __future__ import annotations

import os
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

from learner.bench.measure import measured_steps
from learner.bench.run import Runner, alternating
from learner.config import load_config

COLUMNS = {"step_s": "timing_s/step", "learner_s": "timing_s/learner", "tail_s": "timing_s/tail",
           "trainer_idle": "trainer/idle_ratio", "micro_batches": "learner/micro_batches",
           "accumulator_mb": "learner/peak_accumulator_mb"}


def compare_variants(config: str, variants: dict[str, tuple[str, Callable]], base: str, scale: float, steps: int,
                     rounds: int) -> dict:
    """``variants``: {name: (schedule, a function that edits the loaded config in place)}; ratios
    are against ``base``. Prints one line per variant."""
    load_start = os.getloadavg()[0]
    steps_of: dict[str, list[dict]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="thundersync-variants-") as tmp:
        for r, name in alternating(list(variants), rounds):
            schedule, edit = variants[name]
            cfg = load_config(config)
            edit(cfg)
            events = Runner(cfg, Path(tmp)).train(f"{name}-r{r}", schedule, steps, scale)
            steps_of[name] += measured_steps(events, warmup=1)
    out = {"variants": {}, "config": config, "scale": scale, "steps_per_run": steps, "rounds": rounds,
           "load_start": load_start}
    for name, values in steps_of.items():
        row = {col: statistics.median(v.get(metric, 0.0) for v in values) for col, metric in COLUMNS.items()}
        out["variants"][name] = {**row, "step_s_all": [v[COLUMNS["step_s"]] for v in values]}
    ref = out["variants"][base]
    for name, v in out["variants"].items():
        v[f"step_vs_{base}"] = v["step_s"] / ref["step_s"]
        v[f"learner_vs_{base}"] = v["learner_s"] / ref["learner_s"]
        print(f"{name:26} step {v['step_s']:.3f} s ({v[f'step_vs_{base}']:.2f}x)  learner {v['learner_s']:.3f} s "
              f"({v[f'learner_vs_{base}']:.2f}x)  tail {v['tail_s']:.3f} s  idle {v['trainer_idle']:.2f}  "
              f"micro-batches {v['micro_batches']:.0f}  accumulator {v['accumulator_mb']:.2f} MB")
    return out
