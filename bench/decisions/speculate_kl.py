"""With a KL term, should streaming learn a zero-variance candidate's members in idle time?

    .venv/bin/python -m bench.decisions.speculate_kl [--kl 0.04] [--scale S] [--steps 6] [--rounds 2] [--json out.json]

A group whose rewards so far are all equal may close with A = 0 for every member. Without a
KL/entropy term its members then need no backward at all, so the adaptive learner waits for a
second reward or the close. With one, every member needs a backward for that term anyway, and an
open-group bucket learns it in the same pass as the policy-gradient part (docs/learner.md, "KL /
entropy in one pass"): waiting only moves that work to after the close. Trains
``configs/bench.yaml`` with ``algorithm.kl_coef`` = ``--kl`` under streaming with
``learner.speculate_zero_variance`` false and true, and under sync, side by side
(``bench/variants.py``).
"""

from __future__ import annotations

import argparse
import sys

from bench.load_report import finish
from bench.variants import compare_variants


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/bench.yaml")
    ap.add_argument("--kl", type=float, default=0.04, help="algorithm.kl_coef")
    ap.add_argument("--scale", type=float, default=0.6, help="tool-latency scale (0.44-0.59 put R at L with kl 0.04)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()

    def variant(speculate: bool):
        def edit(cfg) -> None:
            cfg.algorithm.kl_coef = args.kl
            cfg.learner.speculate_zero_variance = speculate
        return edit

    variants = {"streaming-wait": ("streaming", variant(False)), "streaming-speculate": ("streaming", variant(True)),
                "sync": ("sync", variant(False))}
    out = compare_variants(args.config, variants, "streaming-wait", args.scale, args.steps, args.rounds)
    out["kl_coef"] = args.kl
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
