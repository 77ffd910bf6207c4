"""What packing rows into micro-batch lines saves the learner, on a recorded batch.

    .venv/bin/thundersync train --config C --schedule sync --steps 2 --dump-step DIR --dump-at 1
    .venv/bin/python -m bench.decisions.packing DIR [--rounds 7] [--json out.json]

Loads the dumped step (``DIR/batch.json``, ``DIR/model``, ``DIR/ref_model``: its real trajectories,
algorithm and policy) and learns the whole batch with the micro-batched learner (sync's),
right-padded and with ``learner.pack_rows``, in alternating order, ``rounds`` times, one torch
thread; reports the median seconds of each, their ratio and each one's padding share. The
machine is shared: the ratio is what to read, with the load average beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from bench.load_report import finish
from learner.config import AdvantageConfig, AlgorithmConfig
from learner.grad.learners.common import LearnerOptions
from learner.grad.learners.on_policy import StreamingLearner
from learner.models.loading import load_model
from learner.trajectory import Trajectory


def load_dump(path: Path) -> tuple[AlgorithmConfig, list[Trajectory], torch.nn.Module, torch.nn.Module | None]:
    batch = json.loads((path / "batch.json").read_text())
    algo = AlgorithmConfig(objective=batch["objective"], advantage=AdvantageConfig(**batch["advantage"]),
                           loss_agg_mode=batch["loss_agg_mode"], loss_scale_constant=batch["loss_scale_constant"],
                           kl_coef=batch["kl_coef"], entropy_coef=batch["entropy_coef"])
    fields = ("id", "group", "reward", "input_ids", "loss_mask", "behavior_logprobs", "turn_versions",
              "turn_spans", "teacher_logprobs")
    trajs = [Trajectory(step=batch["step"], **{k: t[k] for k in fields}) for t in batch["trajectories"]]
    ref = load_model(path / "ref_model") if (path / "ref_model").exists() else None
    return algo, trajs, load_model(path / "model"), ref


def learn_once(model, ref, algo: AlgorithmConfig, trajs: list[Trajectory], pack: bool) -> tuple[float, float]:
    learner = StreamingLearner(model, algo, ref, LearnerOptions("micro-batched", pack_rows=pack))
    t0 = time.perf_counter()
    learner.begin_batch(dict(Counter(t.group for t in trajs)))
    learner.learn(trajs)
    stats = learner.finish_batch()
    seconds = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    return seconds, stats.get("padding_share", 0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dump", type=Path, help="a --dump-step directory")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    algo, trajs, model, ref = load_dump(args.dump)
    out = {"dump": str(args.dump), "n_traj": len(trajs), "kl_coef": algo.kl_coef, "rounds": args.rounds,
           "load_start": os.getloadavg()[0]}
    seconds: dict[str, list[float]] = {"padded": [], "packed": []}
    share: dict[str, float] = {}
    for r in range(args.rounds):
        for name in (("padded", "packed") if r % 2 == 0 else ("packed", "padded")):
            s, share[name] = learn_once(model, ref, algo, trajs, pack=name == "packed")
            seconds[name].append(s)
    for name, values in seconds.items():
        out[name] = {"median_s": statistics.median(values), "all_s": values, "padding_share": share[name]}
        print(f"{name:7} {out[name]['median_s']:.3f} s  padding share {share[name]:.3f}")
    out["packed_over_padded"] = out["packed"]["median_s"] / out["padded"]["median_s"]
    print(f"packed / padded: {out['packed_over_padded']:.2f}x")
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
