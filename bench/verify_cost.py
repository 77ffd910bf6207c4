"""What verifying a step's drafts costs (learner/rollout/speculation.py, docs/speculation.md):
one forward over each draft's whole context vs each group's shared prompt forwarded once, the
remainders on its keys/values and the output embedding at sampled positions only.

    .venv/bin/python -m bench.verify_cost [--prompts 32] [--group-size 8] [--turns 2] [--repeats 7] [--preamble 0]

The drafts are a fixed set: arith-tool prompts (chat template) x G rows, each of ``--turns`` turns sampled by the
built-in policy (a calculator observation between turns); they are verified against that policy
moved by a small random step, in chunks of ``VERIFY_CHUNK`` as the worker does. One torch thread;
the arms alternate per repeat; medians and their ratio are printed, and whether the verdicts agree.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from learner.config import RunConfig
from learner.rollout.chat import ChatFormat
from learner.rollout.drafts import VERIFY_CHUNK
from learner.rollout.engine import SamplingParams, TorchEngine
from learner.rollout.models import load_model, load_tokenizer, resolve_model_dir, stop_token_ids
from learner.rollout.sampling import Stream
from learner.rollout.speculation import Sampled, verify
from learner.rollout.tasks import make_env


def drafts(engine: TorchEngine, prompts: list[list[int]], observation: list[int], turns: int,
           params: SamplingParams) -> list[Sampled]:
    rows = [Sampled(list(p), [], []) for p in prompts]
    for t in range(turns):
        if t:
            for r in rows:
                r.ids += observation
        seeds = [Stream(1000 * b + t, 0) for b in range(len(rows))]
        for b, (r, c) in enumerate(zip(rows, engine.generate([r.ids for r in rows], params, seeds=seeds))):
            r.positions += range(len(r.ids), len(r.ids) + len(c.token_ids))
            r.streams += [Stream(1000 * b + t, n) for n in range(len(c.token_ids))]
            r.ids += c.token_ids
    return rows


def timed_verify(model, views: list[Sampled], pad_id: int, share_prefix: bool) -> tuple[float, list]:
    t0, verdicts = time.perf_counter(), []
    for first in range(0, len(views), VERIFY_CHUNK):
        verdicts += verify(model, views[first:first + VERIFY_CHUNK], 1.0, 1.0, pad_id, share_prefix=share_prefix)
    return time.perf_counter() - t0, [(v.kept, v.token) for v in verdicts]


def fixed_drafts(prompts_n: int, group_size: int, turns: int, preamble: int = 0):
    """The built-in policy, its tokenizer and the drafts it samples (seeded: the same every run).
    ``preamble``: tokens put before every prompt, standing in for the system prompt and tool
    schemas a chat model's template writes there (the built-in tokenizer has no template)."""
    cfg = RunConfig()
    model_dir = resolve_model_dir(cfg.model.policy, cfg.model.cache_dir, cfg.seed)
    model, tok = load_model(model_dir, torch.float32), load_tokenizer(model_dir)
    env, rng = make_env(cfg.task), random.Random(0)
    chat = ChatFormat(tok, env)  # the policy's chat template, as the worker renders prompts
    system = (tok.encode("Use the calculator tool for every operation. " * preamble, add_special_tokens=False))[:preamble]
    prompts = [system + ids for _ in range(prompts_n)
               for ids in [tok.encode(chat.prompt_text(env.sample_task(rng)), add_special_tokens=False)] * group_size]
    params = SamplingParams(cfg.rollout.max_new_tokens, stop_token_ids(tok))
    views = drafts(TorchEngine(model, tok.pad_token_id), prompts, chat.observation_ids([], "42"), turns, params)
    return model, tok, views


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("--prompts", 32), ("--group-size", 8), ("--turns", 2), ("--repeats", 7), ("--preamble", 0)):
        parser.add_argument(name, type=int, default=default)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tok, views = fixed_drafts(args.prompts, args.group_size, args.turns, args.preamble)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the next step's weights: a small random step away
        for p in model.parameters():
            p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=gen))
    arms = {"whole context": False, "shared prefix": True}
    seconds: dict[str, list[float]] = {name: [] for name in arms}
    verdicts = {name: timed_verify(model, views, tok.pad_token_id, share)[1] for name, share in arms.items()}  # warm-up
    for _ in range(args.repeats):
        for name, share in arms.items():
            seconds[name].append(timed_verify(model, views, tok.pad_token_id, share)[0])
    mean_len = statistics.mean(len(v.ids) for v in views)
    sampled = statistics.mean(len(v.positions) for v in views)
    print(f"{len(views)} drafts ({args.prompts} prompts x {args.group_size}), {args.turns} turns, "
          f"{mean_len:.0f} tokens each ({sampled:.0f} sampled); median of {args.repeats} (seconds)")
    for name, s in seconds.items():
        print(f"{name:15s}{statistics.median(s):10.4f}")
    ratio = statistics.median(seconds["shared prefix"]) / statistics.median(seconds["whole context"])
    print(f"shared / whole: {ratio:.3f}   verdicts equal: {verdicts['shared prefix'] == verdicts['whole context']}")


if __name__ == "__main__":
    main()
