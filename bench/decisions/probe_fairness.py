"""Is a learner.backward span a fair machine-speed probe? The bench's same-speed columns
(docs/bench-report.md) divide each schedule's median backward by sync's. Two things besides the
machine's drift could move that ratio; this measures both, side by side, alternating order:

  1. contention: the same backward passes on the learner's core with the rollout core idle
     (as in sync's learning phase) and with a torch engine generating there (as in the
     overlapping schedules);
  2. learner kind: StreamingLearner.on_trajectory (sync, streaming) against
     OffPolicyLearner.train_batch (async, fully-async) on the same trajectories.

    .venv/bin/python -m bench.decisions.probe_fairness [--rounds 6]

Built-in tiny policy, bench-like trajectories (30 prompt + 30-80 scored tokens), one torch
thread per process, learner on core 0, generator on core 1 (needs 2 cores).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from collections import Counter


def generate_forever(core: int, stop) -> None:
    """The rollout side: batched generate calls until ``stop`` is set."""
    os.sched_setaffinity(0, {core})
    import torch

    from learner.rollout.engine.torch_engine import SamplingParams, TorchEngine
    from learner.models.loading import load_model, resolve_model_dir

    torch.set_num_threads(1)
    engine = TorchEngine(load_model(resolve_model_dir("builtin:tiny")), pad_id=0)
    prompts = [[1] + [5 + i % 20] * 30 for i in range(32)]
    while not stop.is_set():
        engine.generate(prompts, SamplingParams(max_new_tokens=32, stop_token_ids=[]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        print("needs 2 cores", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, {0})
    import torch

    from learner.config import AlgorithmConfig
    from learner.grad.learners.off_policy import OffPolicyLearner
    from learner.grad.learners.on_policy import StreamingLearner
    from learner.models.loading import load_model, resolve_model_dir
    from learner.trajectory import Trajectory

    torch.set_num_threads(1)
    model = load_model(resolve_model_dir("builtin:tiny"))
    rng = random.Random(0)
    trajs = []
    for i in range(256):
        n = rng.randint(60, 110)
        trajs.append(Trajectory(id=i, group=i // 8, step=0, input_ids=[rng.randrange(3, 30) for _ in range(n)],
                                loss_mask=[0] * 30 + [1] * (n - 30), behavior_logprobs=[0.0] * 30 + [-2.0] * (n - 30),
                                reward=rng.random(), turn_versions=[0]))
    algo = AlgorithmConfig()

    def streaming_ms() -> float:
        learner = StreamingLearner(model, algo)
        learner.begin_batch(dict(Counter(t.group for t in trajs)))
        spans = [learner.on_trajectory(t)["backward_s"] for t in trajs]
        learner.finish_batch()
        model.zero_grad(set_to_none=True)
        return 1e3 * statistics.median(spans)

    def off_policy_ms() -> float:
        spans: list[float] = []
        OffPolicyLearner(model, algo).train_batch(trajs, on_phase=lambda kind, t0, t1, traj, group: spans.append(t1 - t0))
        model.zero_grad(set_to_none=True)
        return 1e3 * statistics.median(spans)

    streaming_ms(), off_policy_ms()  # warm-up
    ctx = mp.get_context("spawn")

    def with_rollout_busy(fn) -> float:
        stop = ctx.Event()
        gen = ctx.Process(target=generate_forever, args=(1, stop))
        gen.start()
        time.sleep(8)  # its imports and model load, then steady generate calls
        try:
            return fn()
        finally:
            stop.set()
            gen.join()

    ratios: dict[str, list[float]] = {"busy/idle rollout core": [], "off-policy/streaming learner": []}
    for r in range(args.rounds):
        if r % 2 == 0:
            idle, busy = streaming_ms(), with_rollout_busy(streaming_ms)
            streaming, off_policy = streaming_ms(), off_policy_ms()
        else:
            busy, idle = with_rollout_busy(streaming_ms), streaming_ms()
            off_policy, streaming = off_policy_ms(), streaming_ms()
        ratios["busy/idle rollout core"].append(busy / idle)
        ratios["off-policy/streaming learner"].append(off_policy / streaming)
    for name, values in ratios.items():
        print(f"{name:30} median {statistics.median(values):.3f}  per round " + " ".join(f"{v:.3f}" for v in values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
