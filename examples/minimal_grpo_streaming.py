"""GRPO with the streaming learner, top to bottom in one file (python examples/minimal_grpo_streaming.py).

A tiny random Llama (vocab 32) learns to say token 7: each step samples 8 prompts x 4 answers
of 6 tokens, scores each answer (the share of 7s: a verifiable reward), and hands every
trajectory to the learner the moment its reward is known, in the order rewards arrive (here a
shuffle stands in for tool latency). The learner runs that trajectory's backward at once into
its group's running sums; when a group closes, its mean and std turn the sums into its exact
GRPO gradient. One optimizer step per batch: the step-0 gradient equals the batch-synchronous
one written straight from the formulas (``reference_gradient``), which this file checks.
"""

from __future__ import annotations

import argparse
import random
from collections import Counter

import torch

from learner.config import AlgorithmConfig
from learner.grad.learners.common import OptimizerStep
from learner.grad.learners.on_policy import StreamingLearner
from learner.grad.reference import reference_gradient
from learner.checks.tiny_models import VOCAB, tiny_llama
from learner.trajectory import Trajectory

TARGET, PROMPTS, GROUP, ANSWER = 7, 8, 4, 6


@torch.no_grad()
def sample(model, prompt: list[int], n: int, gen: torch.Generator) -> list[tuple[list[int], list[float]]]:
    """``n`` answers of ANSWER tokens to ``prompt`` at temperature 1, with each token's log-prob."""
    ids = torch.tensor([prompt] * n)
    logps = []
    for _ in range(ANSWER):
        logits = model(ids).logits[:, -1].float().log_softmax(-1)
        token = torch.multinomial(logits.exp(), 1, generator=gen)
        logps.append(logits.gather(1, token))
        ids = torch.cat([ids, token], dim=1)
    logps = torch.cat(logps, dim=1)
    return [(ids[i].tolist(), [0.0] * len(prompt) + logps[i].tolist()) for i in range(n)]


def rollout(model, step: int, rng: random.Random, gen: torch.Generator) -> list[Trajectory]:
    trajs = []
    for g in range(PROMPTS):
        prompt = [1, rng.randrange(2, VOCAB)]
        for ids, logps in sample(model, prompt, GROUP, gen):
            answer = ids[len(prompt):]
            trajs.append(Trajectory(id=len(trajs), group=step * PROMPTS + g, step=step, input_ids=ids,
                                    loss_mask=[0] * len(prompt) + [1] * ANSWER, behavior_logprobs=logps,
                                    reward=answer.count(TARGET) / ANSWER))
    return trajs


def main(steps: int = 20, seed: int = 0, quiet: bool = False) -> dict:
    torch.set_num_threads(1)  # a tiny model: one thread is the fastest
    torch.manual_seed(seed)
    model = tiny_llama(torch.float32, seed)
    algo = AlgorithmConfig(objective="grpo")
    optimizer = OptimizerStep(torch.optim.Adam(model.parameters(), lr=3e-2), grad_clip=1.0)
    learner = StreamingLearner(model, algo, optimizer=optimizer)
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    rewards, gap = [], None
    for step in range(steps):
        trajs = rollout(model, step, rng, gen)
        learner.begin_batch(dict(Counter(t.group for t in trajs)))
        for traj in rng.sample(trajs, len(trajs)):  # rewards arrive in any order: learn each at once
            learner.on_trajectory(traj)
        learner.finish_batch()  # the last groups close: the batch's gradient is in p.grad
        if step == 0:  # exactly the batch-synchronous gradient
            want = reference_gradient(model, trajs, algo)
            gap = max((p.grad - want[n]).abs().max().item() for n, p in model.named_parameters())
        learner.step()  # clip, one optimizer step; the next rollout samples the new policy
        rewards.append(sum(t.reward for t in trajs) / len(trajs))
        if not quiet:
            print(f"step {step:3d}  reward {rewards[-1]:.3f}" + (f"  |g - g_ref| {gap:.1e}" if step == 0 else ""))
    return {"rewards": rewards, "step0_max_abs_diff": gap}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    main(args.steps, args.seed)
