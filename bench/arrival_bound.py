"""How early a streaming learner can finish a step, given when its trajectories arrived (docs/learner.md).

    .venv/bin/python -m bench.arrival_bound SYNC_EVENTS.jsonl [--caps none,0,2,4] [--balance 1] [--open-cost 2.2]

Reads a **sync** run's events (``thundersync train --events``, or a bench run kept with
``--events-dir``) and replays each step's arrivals through the idealised learner of
``learner/bench/arrival.py`` (one row at a time at the sync run's own cost per row, always busy
when a row it may learn is waiting, closed groups first, at most K groups with running sums).

The result, per step and K, is the earliest time (from the step's start) the learner's backward
work can be done: a lower bound on any drain policy of that K, before the optimizer and publish.
``--balance X`` rescales the cost per row so that each step's backward work is X·R (the bench's
``--balance`` sets R against L instead, which also holds the optimizer and publish): at X = 1 the
finish over R is the ceiling on streaming's efficiency that the arrival times alone impose.
Rows of a group without sums become learnable only when its last member arrives; when groups close
late in the rollout, a small K moves their rows after the last reward whatever the policy.
"""

from __future__ import annotations

import argparse
import json
import sys

from learner.bench.arrival import bounds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("events", help="a sync run's events JSONL")
    ap.add_argument("--caps", default="none,0,2,4", help="comma list of K; none = unlimited")
    ap.add_argument("--balance", type=float, help="backward work = X * R per step instead of the sync run's")
    ap.add_argument("--open-cost", type=float, default=1.0,
                    help="cost of a row learnt into running sums, in known-advantage rows (KL: ~2.2)")
    args = ap.parse_args()
    caps = [None if c == "none" else int(c) for c in args.caps.split(",")]
    with open(args.events) as handle:
        events = [json.loads(line) for line in handle if line.strip()]
    for b in bounds(events, caps, args.balance, args.open_cost):
        finish = "  ".join(f"{k} {v:.2f} ({v / b['rollout_s']:.2f} R)" for k, v in b["finish_s"].items())
        print(f"step {b['step']}: R {b['rollout_s']:.2f} s, backward {b['backward_s']:.2f} s ({b['rows']} rows); "
              f"earliest finish: {finish}" + (f" [{b['best_policy']}]" if "best_policy" in b else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
