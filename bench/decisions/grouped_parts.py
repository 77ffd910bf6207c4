"""Where a grouped micro-batch's premium over a known one goes, part by part.

On the bench's policy (builtin:tiny) and bench-shaped rows (``bench.decisions.grouped_backward``), one
micro-batch of N rows in N/4 (group, reward) buckets is learnt four ways, alternating per round,
through the learner's own code:

  known            every advantage known: one backward into G (sync's micro-batch)
  grouped          the grouped backward (learner/grad/batching/grouped.py) into the buckets' sums
  grouped-no-adds  the same, the accumulator's per-bucket adds left out (S, T' untouched)
  no-reduction     the same backward with the hooks' reductions left out: activation gradients
                   only, no parameter gradient at all (a floor, not a learner)

and, inside ``grouped``, this thread's CPU seconds in the reductions of each module kind
(Linear, RMSNorm, Embedding). Then the one operation the Linear reduction replaces, timed apart:
a layer's weight gradient as one matmul over the micro-batch's tokens against one matmul per
destination (the grouped reduction) at the policy's layer shapes. The last two arms are
measurement-only variants (monkeypatched here), never a learner path. One torch thread, this
thread's CPU seconds (less moved by other work on a shared machine than wall-clock).

    .venv/bin/python -m bench.decisions.grouped_parts --rows 16,32,64 --rounds 9 [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections import Counter
from contextlib import contextmanager

import torch

from bench.decisions.grouped_backward import bench_rows, run_arm
from learner.config import AlgorithmConfig
from learner.grad.batching import grouped as grouped_module
from learner.grad.learners.common import LearnerOptions
from learner.grad.learners.on_policy import StreamingLearner
from learner.models.loading import load_model, resolve_model_dir

ARMS = ("known", "grouped", "grouped-no-adds", "no-reduction")


@contextmanager
def variant(learner: StreamingLearner, arm: str, reduce_s: Counter | None = None):
    """``arm``'s monkeypatches (none for known/grouped), undone on exit; ``reduce_s``: add each
    reduction's CPU seconds under its module kind."""
    acc, cls = learner.acc, grouped_module.GroupedGradients
    real_reduce = cls._reduce

    def timed_reduce(self, mod, kind, saved, delta):
        t0 = time.thread_time()
        real_reduce(self, mod, kind, saved, delta)
        reduce_s[kind] += time.thread_time() - t0

    if arm in ("grouped-no-adds", "no-reduction"):
        acc.add_to_group = lambda *args, **kwargs: None
    if arm == "no-reduction":
        cls._reduce = lambda self, *args: None
    elif reduce_s is not None:
        cls._reduce = timed_reduce
    try:
        yield
    finally:
        vars(acc).pop("add_to_group", None)  # the class's own method again
        cls._reduce = real_reduce


def micro_batch_arms(learner: StreamingLearner, n: int, rounds: int, vocab: int) -> dict:
    rows = bench_rows(n, vocab, seed=n)
    times: dict[str, list[float]] = {a: [] for a in ARMS}
    for arm in ARMS:  # warm-up
        with variant(learner, arm):
            run_arm(learner, rows, "known" if arm == "known" else "grouped")
    for r in range(rounds):
        for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
            with variant(learner, arm):
                times[arm].append(run_arm(learner, rows, "known" if arm == "known" else "grouped"))
    reduce_s: Counter = Counter()
    with variant(learner, "grouped", reduce_s):
        for _ in range(rounds):
            run_arm(learner, rows, "grouped")
    med = {a: statistics.median(v) for a, v in times.items()}
    return {"rows": n, "buckets": n // 4, "median_s": med,
            "over_known": {a: med[a] / med["known"] for a in ARMS},
            "spread_s": {a: [min(v), max(v)] for a, v in times.items()},
            "reduction_s": {k: v / rounds for k, v in reduce_s.items()}}


def weight_gradient_arms(d: torch.Tensor, a: torch.Tensor, rows: int, parts: int) -> dict:
    """Ways to compute a Linear weight gradient δᵀa over a (rows, width) grid of tokens (``d``: δ,
    ``a``: the input, one token a row of each): one matmul (the ordinary backward); per destination
    of ``rows / parts`` consecutive rows, one matmul each, stacked (the grouped reduction), the
    same written into a preallocated stack, and one ``bmm`` of per-row gradients summed into the
    destinations by a (parts, rows) matmul (the alternatives weighed for the reduction)."""
    tokens, o, i = d.shape[0], d.shape[1], a.shape[1]
    width, per = tokens // rows, rows // parts
    cut = [(k * per * width, (k + 1) * per * width) for k in range(parts)]
    stacked = torch.empty(parts, o, i, dtype=d.dtype)
    member = torch.zeros(parts, rows, dtype=d.dtype)
    for k in range(parts):
        member[k, k * per:(k + 1) * per] = 1.0

    def into_stack():
        for k, (s, e) in enumerate(cut):
            torch.mm(d[s:e].t(), a[s:e], out=stacked[k])
        return stacked

    def per_row():
        g = torch.bmm(d.view(rows, width, o).transpose(1, 2), a.view(rows, width, i))
        return (member @ g.view(rows, -1)).view(parts, o, i)

    return {"one": lambda: d.t() @ a, "per-destination": lambda: torch.stack([d[s:e].t() @ a[s:e] for s, e in cut]),
            "per-destination-into-stack": into_stack, "per-row-bmm": per_row}


def matmul_split(shapes: list[tuple[int, int]], rows: int, width: int, parts: int, repeats: int) -> list[dict]:
    """``weight_gradient_arms`` timed at each (out, in) layer shape, alternating per round."""
    out = []
    for o, i in shapes:
        arms = weight_gradient_arms(torch.randn(rows * width, o), torch.randn(rows * width, i), rows, parts)
        times: dict[str, list[float]] = {k: [] for k in arms}
        for r in range(repeats):
            for name, fn in (list(arms.items()) if r % 2 == 0 else list(arms.items())[::-1]):
                t0 = time.thread_time()
                for _ in range(20):
                    fn()
                times[name].append((time.thread_time() - t0) / 20)
        med = {k: statistics.median(v) for k, v in times.items()}
        out.append({"out": o, "in": i, "tokens": rows * width, "destinations": parts, "median_s": med,
                    "ratio": med["per-destination"] / med["one"],
                    "over_split": {k: med[k] / med["per-destination"] for k in arms if k != "one"}})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="16,32,64")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = resolve_model_dir("builtin:tiny")
    model = load_model(path)
    learner = StreamingLearner(model, AlgorithmConfig(objective="grpo"), None,
                               LearnerOptions("adaptive", micro_batch_tokens=10**6, pack_rows=False))
    assert learner.backward.pool.grouped is not None, "the bench policy is reducible"
    out = {"load_before": os.getloadavg()[0], "clock": "cpu", "sizes": []}
    for n in map(int, args.rows.split(",")):
        size = micro_batch_arms(learner, n, args.rounds, model.config.vocab_size)
        ratio = size["over_known"]
        red = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in sorted(size["reduction_s"].items()))
        print(f"{n:4d} rows: known {size['median_s']['known'] * 1e3:6.1f} ms; grouped {ratio['grouped']:.2f}x, "
              f"without the adds {ratio['grouped-no-adds']:.2f}x, without any reduction "
              f"{ratio['no-reduction']:.2f}x; reductions: {red}", flush=True)
        out["sizes"].append(size)
    shapes = sorted({(m.out_features, m.in_features) for m in model.modules() if isinstance(m, torch.nn.Linear)})
    width = 49  # the longest bench row: a 32-row padded micro-batch's grid, 8 destinations of 4 rows
    out["matmul_split"] = matmul_split(shapes, 32, width, 8, args.rounds)
    for m in out["matmul_split"]:
        other = ", ".join(f"{k} {v:.2f}x" for k, v in m["over_split"].items() if k != "per-destination")
        print(f"weight gradient {m['out']}x{m['in']} over {m['tokens']} tokens: one matmul "
              f"{m['median_s']['one'] * 1e6:.0f} us, {m['destinations']} per-destination "
              f"{m['median_s']['per-destination'] * 1e6:.0f} us ({m['ratio']:.2f}x); against the split: {other}",
              flush=True)
    out["load_after"] = os.getloadavg()[0]
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=1)


if __name__ == "__main__":
    main()
