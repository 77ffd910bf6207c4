"""Learner time per trajectory of each learner path, side by side, alternating order (docs/learner.md).

    .venv/bin/python -m bench.decisions.learner_paths [--rounds 5] [--trajs 256] [--json out.json]

Built-in tiny policy, one torch thread, bench-shaped GRPO trajectories (30 prompt tokens, then
30-80 scored ones, groups of 8, binary rewards), the same ones for every variant:

  per-trajectory      StreamingLearner, one forward+backward per trajectory (the earlier learner)
  micro-batched       the whole batch at once (sync): padded micro-batches under the token budget
  adaptive-1by1       streaming caught up: each trajectory handed over alone, then ``idle_work``
                      until it has nothing left (per trajectory, or its group's close)
  deterministic-1by1  the same arrivals, ``learner.deterministic``: each group at its close,
                      one micro-batch of its members, into the fixed-point sum
and with ``kl_coef`` 0.1 (a second backward per trajectory in the earlier learner):
  kl per-trajectory   the running-sum form, KL by a second backward (retain_graph)
  kl one-pass         adaptive caught up: running sums, one batched VJP with two cotangents
  kl micro-batched    known advantages: KL folded into the same loss, one backward per micro-batch

Every round runs each variant once, in an order rotated per round; the median over rounds is
reported with the load average, since the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections import Counter

from bench.load_report import finish


def bench_batch(n: int, vocab: int, seed: int = 0):
    from learner.trajectory import Trajectory

    rng = random.Random(seed)
    trajs = []
    for i in range(n):
        prompt, scored = 30, rng.randint(30, 80)
        ids = [rng.randrange(4, vocab) for _ in range(prompt + scored)]
        trajs.append(Trajectory(id=i, group=i // 8, step=0, input_ids=ids, loss_mask=[0] * prompt + [1] * scored,
                                behavior_logprobs=[0.0] * len(ids), reward=float(rng.random() < 0.4)))
    return trajs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--trajs", type=int, default=256)
    ap.add_argument("--json", help="write the measurements here")
    args = ap.parse_args()
    import torch

    from learner.config import AlgorithmConfig
    from learner.grad.learners.deterministic import on_policy_learner
    from learner.grad.learners.common import LearnerOptions
    from learner.models.loading import load_model, resolve_model_dir

    torch.set_num_threads(1)
    model_dir = resolve_model_dir("builtin:tiny")
    model, ref = load_model(model_dir), load_model(model_dir)
    ref.requires_grad_(False)
    trajs = bench_batch(args.trajs, model.config.vocab_size)
    sizes = dict(Counter(t.group for t in trajs))

    def run(path: str, kl: float, whole: bool, deterministic: bool = False) -> float:
        learner = on_policy_learner(model, AlgorithmConfig(kl_coef=kl), ref if kl else None,
                                    LearnerOptions(path, deterministic=deterministic))
        learner.begin_batch(sizes)
        t0 = time.perf_counter()
        for chunk in ([trajs] if whole else [[t] for t in trajs]):
            learner.learn(chunk)
            while learner.idle_work():
                pass
        learner.finish_batch()
        return (time.perf_counter() - t0) / len(trajs) * 1000

    variants = {
        "per-trajectory": lambda: run("per-trajectory", 0.0, False),
        "micro-batched": lambda: run("micro-batched", 0.0, True),
        "adaptive-1by1": lambda: run("adaptive", 0.0, False),
        "deterministic-1by1": lambda: run("adaptive", 0.0, False, deterministic=True),
        "kl per-trajectory": lambda: run("per-trajectory", 0.1, False),
        "kl one-pass": lambda: run("adaptive", 0.1, False),
        "kl micro-batched": lambda: run("micro-batched", 0.1, True),
    }
    names = list(variants)
    times: dict[str, list[float]] = {n: [] for n in names}
    load_start = os.getloadavg()[0]
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            times[name].append(variants[name]())
    out = {"ms_per_trajectory": {n: statistics.median(v) for n, v in times.items()}, "all": times,
           "rounds": args.rounds, "trajs": len(trajs), "load_start": load_start}
    for n in names:
        print(f"{n:20} {out['ms_per_trajectory'][n]:7.2f} ms/trajectory  ({', '.join(f'{v:.2f}' for v in times[n])})")
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
