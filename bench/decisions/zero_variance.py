"""Zero-variance skip on a real run: how many trajectories it skips and the learner time it saves.

    .venv/bin/python -m bench.decisions.zero_variance [--config configs/arith-grpo.yaml] [--schedule sync] [--rounds 3]

1. Trains the config for real (in this process, with its rollout worker), recording every
   batch the learner is handed and each step's ``learner/skipped_trajectories``.
2. Replays each recorded batch through the micro-batched learner's backward (padded
   micro-batches, known advantages, the run's final weights), once with every trajectory and
   once without the zero-variance ones, alternating which goes first, ``--rounds`` times; the
   time saved is the difference of the medians of the per-batch sums.

A group whose rewards are all equal has A = 0 for every member: without a KL/entropy term its
members add exactly nothing, so the learner skips their backward (docs/learner.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from bench.load_report import finish


def record_run(config: str, schedule: str, steps: int | None):
    """Train for real; returns (batches of trajectories, per-step metrics)."""
    from learner.config import load_config
    from learner.driver.loop import train
    from learner.grad.learners.on_policy import StreamingLearner
    from learner.timeline import MemorySink
    from learner.trajectory import Trajectory

    overrides = {"train.schedule": schedule} | ({"train.steps": steps} if steps else {})
    cfg = load_config(config, overrides)
    batches: list[list] = []
    learn, begin = StreamingLearner.learn, StreamingLearner.begin_batch

    def recording_begin(self, group_sizes):
        batches.append([])
        return begin(self, group_sizes)

    def recording_learn(self, items, on_phase=None):
        batches[-1].extend(x for x in items if isinstance(x, Trajectory))
        return learn(self, items, on_phase)

    StreamingLearner.begin_batch, StreamingLearner.learn = recording_begin, recording_learn
    try:
        sink = MemorySink()
        trainer, _ = train(cfg, sink)
    finally:
        StreamingLearner.begin_batch, StreamingLearner.learn = begin, learn
    metrics = [e["values"] for e in sink.events if e.get("type") == "metrics"]
    return cfg, trainer.model, batches, metrics


def zero_advantage(trajs, algo):
    """(trajectory, A) for the members of ``trajs`` whose advantage is exactly 0."""
    from learner.grad.learners.common import batch_advantages

    adv = batch_advantages(trajs, algo.advantage)
    return [(t, adv[t.id]) for t in trajs if adv[t.id] == 0.0]


def replay_s(model, algo, budget: int, trajs, with_zero: bool) -> float:
    """Seconds of the micro-batched backward of ``trajs`` (known advantages), with or without A = 0 rows."""
    from learner.grad.learners.common import batch_advantages
    from learner.grad.batching.microbatch import forward, grads_of, grpo_row, on_policy_pg_loss, plan_micro_batches

    adv = batch_advantages(trajs, algo.advantage)
    rows = [grpo_row(t, adv[t.id]) for t in trajs if with_zero or adv[t.id] != 0.0]
    params = [p for p in model.parameters() if p.requires_grad]
    t0 = time.perf_counter()
    for part in plan_micro_batches(rows, budget):
        grads_of(on_policy_pg_loss(forward(model, None, algo, part), algo.objective), params)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/arith-grpo.yaml")
    ap.add_argument("--schedule", default="sync")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the measurements here")
    args = ap.parse_args()
    load_start = os.getloadavg()[0]
    cfg, model, batches, metrics = record_run(args.config, args.schedule, args.steps)
    if cfg.algorithm.kl_coef > 0 or cfg.algorithm.entropy_coef > 0:
        print("this config has a KL/entropy term: zero-variance members still take their backward", file=sys.stderr)
    n = sum(len(b) for b in batches)
    skipped = sum(m.get("learner/skipped_trajectories", 0.0) for m in metrics)
    zero = [t for b in batches for t, a in zero_advantage(b, cfg.algorithm)]
    tokens = sum(len(t.input_ids) for b in batches for t in b)
    full, lean = [], []
    for r in range(args.rounds):
        for with_zero in ((True, False) if r % 2 == 0 else (False, True)):
            total = sum(replay_s(model, cfg.algorithm, cfg.train.micro_batch_tokens, b, with_zero) for b in batches)
            (full if with_zero else lean).append(total)
    out = {"config": args.config, "schedule": args.schedule, "steps": len(batches), "trajectories": n,
           "skipped_trajectories": skipped, "skipped_fraction": skipped / n,
           "skipped_per_step": [m.get("learner/skipped_trajectories", 0.0) for m in metrics],
           "zero_advantage_trajectories": len(zero),
           "zero_advantage_token_fraction": sum(len(t.input_ids) for t in zero) / tokens,
           "replay_s_all": statistics.median(full), "replay_s_skip": statistics.median(lean),
           "replays_all": full, "replays_skip": lean, "load_start": load_start}
    out["saved_fraction"] = 1 - out["replay_s_skip"] / out["replay_s_all"]
    print(f"{args.schedule}: {skipped:.0f} of {n} trajectories skipped as zero-variance ({out['skipped_fraction']:.1%}; "
          f"{out['zero_advantage_token_fraction']:.1%} of the tokens); "
          f"micro-batched backward over the {len(batches)} batches {out['replay_s_all']:.2f} s with them, "
          f"{out['replay_s_skip']:.2f} s without ({out['saved_fraction']:.1%} saved)")
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
