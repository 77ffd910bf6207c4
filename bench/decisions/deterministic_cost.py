"""What streaming's deterministic learner costs: streaming with ``learner.deterministic`` on and off, side by side.

    .venv/bin/python -m bench.decisions.deterministic_cost [--scale S] [--steps 6] [--rounds 2] [--json out.json]

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
import sys

from bench.load_report import finish
from bench.variants import compare_variants


def _deterministic(on: bool):
    def edit(cfg) -> None:
        cfg.learner.deterministic = on
    return edit


VARIANTS = {"streaming-adaptive": ("streaming", _deterministic(False)),
            "streaming-deterministic": ("streaming", _deterministic(True)), "sync": ("sync", _deterministic(False))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/bench.yaml")
    ap.add_argument("--scale", type=float, default=1.0, help="tool-latency scale")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    out = compare_variants(args.config, VARIANTS, "streaming-adaptive", args.scale, args.steps, args.rounds)
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
