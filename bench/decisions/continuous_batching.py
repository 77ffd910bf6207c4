"""Continuous batching in the torch engine on vs off (or, with ``--switch reuse_kv``, KV reuse
across turns on vs off, continuous batching on in both), on the bench workload under sync, side by side.

    .venv/bin/python -m bench.decisions.continuous_batching [--switch continuous_batching|reuse_kv] [--scale 0]
        [--steps 6] [--rounds 2] [--cap N] [--json out.json]

Trains ``configs/bench.yaml`` under ``sync`` (micro-batched learner) with
``rollout.continuous_batching`` true and false, one fresh ``thundersync train`` process per run,
in alternating order, ``--rounds`` times; the first step of each run is a warm-up and dropped.
``--scale`` is the tool-latency scale (0: generation alone, where the bench's calibration lands
on this machine: docs/bench-limits.md). Per arm, over the pooled measured steps: the rollout makespan R
(step start to last reward), the learner's L, the step, and the arrival bound
(``bench/arrival_bound.py``, ``--balance 1``: backward work = R) as the earliest finish over R,
i.e. 1 / the ceiling on streaming's efficiency that the reward arrival times impose; plus the
share of learnt rows that arrived after half of R. ``--cap N`` runs the continuous arm with
``rollout.max_running_rows: N`` (later turns first). Sampled tokens do not depend on the mode
(tests/learner/test_continuous_batching.py), so both arms train the same trajectories.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench.load_report import finish
from learner.bench.arrival import bounds, step_arrivals


def late_share(events: list[dict], warmup: int) -> list[float]:
    """Per measured step: the share of learnt rows whose reward came after half of R."""
    out = []
    for s in step_arrivals(events):
        if s.step >= warmup and s.learnt:
            half = s.t_start + 0.5 * (s.last_reward - s.t_start)
            out.append(sum(s.arrival[t] > half for t in s.learnt) / len(s.learnt))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/bench.yaml")
    ap.add_argument("--scale", type=float, default=0.0, help="tool-latency scale (0: generation alone)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cap", type=int, help="rollout.max_running_rows of the continuous arm")
    ap.add_argument("--switch", choices=["continuous_batching", "reuse_kv"], default="continuous_batching",
                    help="the rollout setting the two arms differ in")
    ap.add_argument("--json")
    args = ap.parse_args()
    from learner.bench.measure import measured_steps
    from learner.bench.run import Runner, alternating
    from learner.config import load_config

    arms = ({"continuous": True, "fixed": False} if args.switch == "continuous_batching"
            else {"reuse-kv": True, "full-prefill": False})
    load_start = os.getloadavg()[0]
    steps: dict[str, list[dict]] = {name: [] for name in arms}
    bound: dict[str, list[float]] = {name: [] for name in arms}
    late: dict[str, list[float]] = {name: [] for name in arms}
    with tempfile.TemporaryDirectory(prefix="thundersync-contbatch-") as tmp:
        for r, name in alternating(list(arms), args.rounds):
            cfg = load_config(args.config)
            if args.switch == "reuse_kv":
                cfg.rollout.reuse_kv = arms[name]
                cfg.rollout.max_running_rows = args.cap
            else:
                cfg.rollout.continuous_batching = arms[name]
                cfg.rollout.reuse_kv = cfg.rollout.reuse_kv and arms[name]
                cfg.rollout.max_running_rows = args.cap if arms[name] else None
            events = Runner(cfg, Path(tmp)).train(f"{name}-r{r}", "sync", args.steps, args.scale)
            steps[name] += measured_steps(events, warmup=1)
            bound[name] += [b["finish_s"]["unlimited"] / b["rollout_s"]
                            for b in bounds(events, [None], balance=1.0) if b["step"] >= 1]
            late[name] += late_share(events, warmup=1)
    out = {"arms": {}, "scale": args.scale, "cap": args.cap, "switch": args.switch, "steps_per_run": args.steps, "rounds": args.rounds,
           "load_start": load_start}
    for name, values in steps.items():
        rollout = [v["step/last_reward_t"] - v["step/t_start"] for v in values]
        out["arms"][name] = {
            args.switch: arms[name],
            "rollout_s": statistics.median(rollout), "rollout_s_all": rollout,
            "learner_s": statistics.median(v["timing_s/learner"] for v in values),
            "step_s": statistics.median(v["timing_s/step"] for v in values),
            "bound_finish_over_r": statistics.median(bound[name]), "bound_finish_over_r_all": bound[name],
            "efficiency_ceiling": 1.0 / statistics.median(bound[name]),
            "late_share": statistics.median(late[name]),
        }
    for name, a in out["arms"].items():
        print(f"{name:12} R {a['rollout_s']:.3f} s ({min(a['rollout_s_all']):.2f}-{max(a['rollout_s_all']):.2f})  "
              f"L {a['learner_s']:.3f} s  step {a['step_s']:.3f} s  arrival bound at balance "
              f"{a['bound_finish_over_r']:.2f} R ({min(a['bound_finish_over_r_all']):.2f}-"
              f"{max(a['bound_finish_over_r_all']):.2f}; efficiency <= {a['efficiency_ceiling']:.2f})  "
              f"rows after R/2 {a['late_share']:.0%}")
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
