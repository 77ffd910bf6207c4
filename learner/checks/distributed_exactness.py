"""``thundersync check-exactness --world-size 1,2,4 [--engine torch,deepspeed] [--zero 0,1,2]``.

For each world size W, W real rank processes (spawned, gloo, a free port) stream their own
groups of the same seeded batches (shuffled per rank, random drains), meet at the barrier and
reduce through each engine; rank 0 compares the reduced gradient with the single-process
reference gradient of the whole batch (``learner.grad.reference.reference_gradient``):

    rel_error = ‖g_reduced − g_ref‖ / ‖g_ref‖ ≤ 1e-12 (float64, torch engine), 1e-6 (float32, DeepSpeed).

Cases: GRPO × every loss_agg_mode (the advantage std rotates), OPD × its modes, one GRPO
batch with fewer groups than ranks (a rank with no group), and GRPO with the shared-prompt
backward (``learner.shared_prompt_backward``; every group's members share a prompt) on the
adaptive and the micro-batched (sync) paths. A group is learnt whole on its owner rank, so its
prompt's cotangent sums and its one prompt backward stay on that rank: the prompt's gradient
is part of the rank's share and reaches the others through the one reduction, like the rest.
Every batch has a group of one, a group of all-equal rewards and groups of unequal sizes (so
ranks carry unequal loads), and the model has a parameter no loss touches. The optimizer runs with lr 0, so every engine's full
clip-and-step path runs while the weights every case starts from stay the same.
"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter
from dataclasses import dataclass

import torch

from learner.config import LOSS_AGG_MODES, STD_MODES, AdvantageConfig, AlgorithmConfig
from learner.distributed.assignment import assign_owners
from learner.distributed.engines import make_learner_engine
from learner.distributed.rank import RankLearner
from learner.distributed.ranks import spawn_ranks
from learner.checks.exactness import (
    TOLERANCE, VOCAB, arrival_chunks, random_rewards, random_trajectory, relative_error, scored_turns, tiny_llama,
)
from learner.grad.learners.common import LearnerOptions
from learner.grad.learners.on_policy import StreamingLearner
from learner.grad.reference import reference_gradient
from learner.grad.objectives import OPD_LOSS_AGG_MODES
from learner.trajectory import Trajectory
from learner.registries.objectives import objective as objective_of
from learner.registries.engines import learner_engine


@dataclass(frozen=True)
class EngineSetup:
    engine: str  # torch (float64) or deepspeed (float32)
    zero_stage: int | None = None
    offload: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return torch.float64 if "float64" in learner_engine(self.engine).dtypes else torch.float32


@dataclass(frozen=True)
class DistCase:
    objective: str
    mode: str
    std: str
    few_groups: bool = False  # fewer groups than ranks: some rank owns none
    shared_prompt: bool = False  # learner.shared_prompt_backward on a batch whose groups share prompts
    learner: str = "adaptive"  # the rank's learner path: adaptive (streaming) or micro-batched (sync)

    def __str__(self) -> str:
        """The seed key's part: the fields before shared_prompt as they always were (the same
        batches for those cases), the others only where set."""
        base = (f"DistCase(objective={self.objective!r}, mode={self.mode!r}, std={self.std!r}, "
                f"few_groups={self.few_groups})")
        return base + (f"/shared-prompt/{self.learner}" if self.shared_prompt else "")


def dist_cases() -> list[DistCase]:
    cases = [DistCase("grpo", m, STD_MODES[i % len(STD_MODES)]) for i, m in enumerate(LOSS_AGG_MODES)]
    cases += [DistCase("opd", m, "none") for m in OPD_LOSS_AGG_MODES]
    cases += [DistCase("grpo", "token-mean", "unbiased", few_groups=True)]
    return cases + [DistCase("grpo", "token-mean", "unbiased", shared_prompt=True),
                    DistCase("grpo", "seq-mean-token-mean", "population", shared_prompt=True),
                    DistCase("grpo", "seq-mean-token-sum", "unbiased", shared_prompt=True, learner="micro-batched")]


def dist_batch(rng: random.Random, n_groups: int, shared_prompt: bool = False) -> list[Trajectory]:
    """Group 0: 2–5 distinct rewards; group 1: one member; group 2: all-equal; the rest random.
    ``shared_prompt``: each group's members start with one prompt of 2–12 tokens."""
    trajs: list[Trajectory] = []
    for group in range(n_groups):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(2, 12))] if shared_prompt else None
        if group == 0:
            rewards = random_rewards(rng, rng.randint(2, 5), "continuous")
        elif group == 1:
            rewards = random_rewards(rng, 1, "binary")
        elif group == 2:
            rewards = random_rewards(rng, rng.randint(2, 4), "equal")
        else:
            rewards = random_rewards(rng, rng.randint(1, 5), rng.choice(("binary", "continuous", "offset")))
        for reward in rewards:
            trajs.append(random_trajectory(rng, len(trajs), group, reward, prompt))
    return trajs


def exactness_model(dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """The exactness Llama plus a parameter no loss touches (its gradient must reduce to 0)."""
    model = tiny_llama(dtype, seed)
    model.register_parameter("unused_bias", torch.nn.Parameter(torch.ones(3, dtype=dtype)))
    return model


def _feed(rl: RankLearner, trajs: list[Trajectory], objective: str, path: str, rng: random.Random) -> None:
    mine = [t for t in trajs if rl.owns(t.group)]
    if objective_of(objective).group_advantage:
        items = rng.sample(mine, len(mine))
    else:
        turns = [turn for t in mine for turn in scored_turns(t)]
        items = rng.sample(turns, len(turns)) + rng.sample(mine, len(mine))
    for chunk in arrival_chunks(items, path, rng):
        rl.learn(chunk)
        while path == "adaptive" and rng.random() < 0.4 and rl.idle_work():
            pass


def _run_case(rank: int, world: int, setup: EngineSetup, case: DistCase, seed: int, model, ref_model, engine) -> dict:
    key = f"{seed}/{world}/{setup}/{case}"
    rng = random.Random(key)  # the same batch and conventions on every rank
    n_groups = max(1, world - 1) if case.few_groups else rng.randint(world + 1, 2 * world + 2)
    trajs = dist_batch(rng, max(n_groups, 3) if not case.few_groups else n_groups, case.shared_prompt)
    algo = AlgorithmConfig(
        objective=case.objective, advantage=AdvantageConfig(std=case.std, eps=1e-6), loss_agg_mode=case.mode,
        loss_scale_constant=rng.choice((7.0, 256.0)), kl_coef=rng.choice((0.0, rng.uniform(0.01, 0.5))),
        entropy_coef=rng.choice((0.0, rng.uniform(0.01, 0.5))),
    )
    options = LearnerOptions(path=case.learner, micro_batch_tokens=rng.choice((16, 48, 4096)),
                             shared_prompt_backward=case.shared_prompt,
                             shared_prompt_max_tokens=rng.choice((12, 32768)) if case.shared_prompt else 32768)
    rl = RankLearner(StreamingLearner(model, algo, ref_model, options), rank, world)
    sizes = dict(Counter(t.group for t in trajs))
    rl.begin_batch(sizes)
    _feed(rl, trajs, case.objective, case.learner, random.Random(f"{key}/arrival/{rank}"))
    stats = rl.finish_batch()
    engine.reduce()
    reduced = engine.reduced_grads()
    result = None
    if rank == 0:
        ref = reference_gradient(model, trajs, algo, ref_model)
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        rel = relative_error(dict(zip(names, reduced)), ref)
        owners = assign_owners(sizes, world)
        tol = TOLERANCE[setup.dtype]
        result = {
            "world_size": world, "engine": setup.engine, "zero_stage": setup.zero_stage, "offload": setup.offload,
            "dtype": str(setup.dtype).removeprefix("torch."), "objective": case.objective,
            "loss_agg_mode": case.mode, "std": case.std if objective_of(case.objective).group_advantage else "n/a",
            "learner": case.learner, "shared_prompt": case.shared_prompt,
            "shared_prompt_rows": stats.get("shared_prompt_rows", 0),  # rank 0's
            "rel_error": rel, "tol": tol, "passed": rel <= tol, "n_traj": len(trajs), "groups": len(sizes),
            "groups_per_rank": [sum(1 for o in owners.values() if o == r) for r in range(world)],
            "trajectories_per_rank": [sum(s for g, s in sizes.items() if owners[g] == r) for r in range(world)],
            "group_sizes": sorted(sizes.values()), "unused_param_grad_zero": bool(reduced[names.index("unused_bias")].abs().max() == 0),
        }
    engine.step()
    return result


def _rank_main(rank: int, world: int, setups: list[EngineSetup], seed: int,
               cases: list[DistCase] | None = None) -> list[dict]:
    results = []
    for setup in setups:
        model = exactness_model(setup.dtype, seed).train()
        ref_model = tiny_llama(setup.dtype, seed + 1)
        engine = make_learner_engine(setup.engine, model, lr=0.0, weight_decay=0.0, grad_clip=1.0,
                             zero_stage=setup.zero_stage or 0, offload=setup.offload)
        for case in cases if cases is not None else dist_cases():
            out = _run_case(rank, world, setup, case, seed, model, ref_model, engine)
            if out is not None:
                results.append(out)
    return results


def engine_setups(engines: list[str], zero_stages: list[int], offload: bool = False) -> list[EngineSetup]:
    setups = []
    for engine in engines:
        if learner_engine(engine).checkpoints_optimizer:  # no ZeRO stages to try
            setups.append(EngineSetup(engine))
        else:
            setups += [EngineSetup("deepspeed", z, offload and z > 0) for z in zero_stages]
    return setups


def run_distributed(world_sizes: list[int], setups: list[EngineSetup], seed: int = 0,
                    timeout_s: float = 900.0, cases: list[DistCase] | None = None) -> list[dict]:
    """Every case (of ``dist_cases()``, or ``cases``) of every setup at every world size; one
    spawn of W ranks per world size."""
    results = []
    for world in world_sizes:
        results += spawn_ranks(_rank_main, world, (setups, seed, cases), timeout_s=timeout_s)[0]
    return results


def main(world_sizes: list[int], engines: list[str], zero_stages: list[int], offload: bool = False,
         json_out: bool = False) -> int:
    cases = run_distributed(world_sizes, engine_setups(engines, zero_stages, offload))
    if json_out:
        print(json.dumps({"cases": cases}))
    else:
        print(f"{'W':>2} {'engine':9} {'zero':>4} {'dtype':7} {'objective':15} {'loss_agg_mode':24} "
              f"{'groups/rank':14} {'rel_error':>10} {'tol':>7}  ok")
        for c in cases:
            zero = "-" if c["zero_stage"] is None else c["zero_stage"]
            objective = c["objective"] + ("+prompt" if c.get("shared_prompt") else "")  # learner.shared_prompt_backward
            print(f"{c['world_size']:>2} {c['engine']:9} {zero:>4} {c['dtype']:7} {objective:15} "
                  f"{c['loss_agg_mode']:24} {str(c['groups_per_rank']):14} {c['rel_error']:10.2e} {c['tol']:7.0e}  "
                  f"{'yes' if c['passed'] else 'NO'}")
        print(f"{sum(c['passed'] for c in cases)}/{len(cases)} cases passed")
    return 0 if cases and all(c["passed"] for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main([1, 2], ["torch", "deepspeed"], [0, 1, 2], json_out="--json" in sys.argv[1:]))
