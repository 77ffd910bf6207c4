"""What an open group's row costs the learner, grouped backward vs one micro-batch per bucket.

On the bench's policy (builtin:tiny) and bench-shaped rows (13-49 tokens, ~10 unscored prompt
tokens), one micro-batch of N rows is learnt three ways, in alternating order per round, through
the learner's own code (``OnPolicyBackward._micro_batch``):

  known       every row's advantage known: one backward into G (what sync runs)
  grouped     the rows are open groups' members, N/4 (group, reward) buckets of 4: one grouped backward
  per-bucket  the same buckets, one micro-batch each (the path before the grouped backward)

and reports median seconds (this thread's CPU seconds by default: ``--clock wall`` for wall-clock), the open/known ratio per row (``learner/open_row_cost``'s definition)
and the extra transient memory of a grouped micro-batch (its per-bucket gradients). One torch thread.

    .venv/bin/python -m bench.decisions.grouped_backward --rows 16,32,64 --rounds 5 [--kl 0.04] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from collections import Counter

import torch

from learner.config import AlgorithmConfig
from learner.grad.batching.drain import Bucket
from learner.grad.learners.common import LearnerOptions
from learner.grad.batching.microbatch import MicroBatchRows, Row
from learner.grad.learners.on_policy import StreamingLearner
from learner.models.loading import load_model, resolve_model_dir


def bench_rows(n: int, vocab: int, seed: int) -> list[Row]:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        length, prompt = rng.randint(13, 49), rng.randint(8, 11)
        ids = [rng.randrange(3, vocab) for _ in range(length)]
        rows.append(Row(traj=i, group=i // 8, ids=ids, mask=[0] * prompt + [1] * (length - prompt), adv=1.0))
    return rows


CLOCK = "cpu"  # this thread's CPU seconds (one torch thread): less moved by the other work on a shared machine


def run_arm(learner: StreamingLearner, rows: list[Row], arm: str) -> float:
    groups = Counter(r.group for r in rows)
    learner.begin_batch(dict(groups))
    state = learner._batch
    keys = [(r.group, float(r.traj % 8 >= 4)) for r in rows]  # two rewards per group of 8: buckets of 4
    if arm != "known":
        for g in groups:
            learner.acc.open_group(g)
    t0, cpu0 = time.perf_counter(), time.thread_time()
    if arm == "known":
        learner.backward._micro_batch(state, MicroBatchRows(rows), None, None)
    elif arm == "grouped":
        learner.backward._micro_batch(state, MicroBatchRows(rows), None, None, keys=keys)
    else:
        for key in dict.fromkeys(keys):
            mine = MicroBatchRows([r for r, k in zip(rows, keys) if k == key])
            learner.backward._micro_batch(state, mine, Bucket(key[0], key[1], []), None)
    seconds, cpu = time.perf_counter() - t0, time.thread_time() - cpu0
    learner.abandon_batch()
    return cpu if CLOCK == "cpu" else seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="16,32,64")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kl", type=float, default=0.0, help="algorithm.kl_coef (a second backward on the grouped path)")
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--json")
    args = parser.parse_args()
    global CLOCK
    CLOCK = args.clock
    torch.set_num_threads(1)
    path = resolve_model_dir("builtin:tiny")
    model = load_model(path)
    ref = load_model(path) if args.kl > 0 else None
    algo = AlgorithmConfig(objective="grpo", kl_coef=args.kl)
    learner = StreamingLearner(model, algo, ref, LearnerOptions("adaptive", micro_batch_tokens=10**6, pack_rows=False))
    assert learner.backward.pool.grouped is not None, "the bench policy is reducible"
    vocab = model.config.vocab_size
    params = sum(p.numel() for p in learner.acc.params)
    out = {"load_before": os.getloadavg()[0], "kl_coef": args.kl, "clock": args.clock, "sizes": []}
    for n in map(int, args.rows.split(",")):
        rows = bench_rows(n, vocab, seed=n)
        arms = ["known", "grouped", "per-bucket"]
        times: dict[str, list[float]] = {a: [] for a in arms}
        run_arm(learner, rows, "grouped")  # warm-up
        for r in range(args.rounds):
            for arm in (arms if r % 2 == 0 else arms[::-1]):
                times[arm].append(run_arm(learner, rows, arm))
        med = {a: statistics.median(v) for a, v in times.items()}
        size = {"rows": n, "buckets": n // 4, "median_s": med,
                "grouped_over_known": med["grouped"] / med["known"],
                "per_bucket_over_known": med["per-bucket"] / med["known"],
                "grouped_extra_mb": (n // 4) * params * 4 / 2**20}
        print(f"{n:4d} rows, {n // 4:3d} buckets: known {med['known'] * 1e3:7.1f} ms  grouped "
              f"{med['grouped'] * 1e3:7.1f} ms ({size['grouped_over_known']:.2f}x)  per-bucket "
              f"{med['per-bucket'] * 1e3:7.1f} ms ({size['per_bucket_over_known']:.2f}x)  "
              f"grouped's per-bucket gradients {size['grouped_extra_mb']:.1f} MB", flush=True)
        out["sizes"].append(size)
    out["load_after"] = os.getloadavg()[0]
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=1)


if __name__ == "__main__":
    main()
