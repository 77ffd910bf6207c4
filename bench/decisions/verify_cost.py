"""What verifying a step's drafts costs (learner/rollout/speculation/token_verify.py, docs/speculation-verify.md):
one forward over each draft's whole context vs each group's shared prompt forwarded once, the
remainders on its keys/values and the output embedding at sampled positions only.

    .venv/bin/python -m bench.decisions.verify_cost [--prompts 32] [--group-size 8] [--turns 2] [--repeats 7]
        [--preamble 0]
    .venv/bin/python -m bench.decisions.verify_cost --remainders [--min-tokens 64] ...

The drafts are a fixed set: arith-tool prompts (chat template) x G rows, each of ``--turns`` turns sampled by the
built-in policy (a calculator observation between turns); they are verified against that policy
moved by a small random step, in chunks of ``VERIFY_CHUNK`` as the worker does. One torch thread;
the arms alternate per repeat; medians and their ratio are printed, and whether the verdicts agree.

``--remainders``: the arms are instead the verification (shared prefix) followed by every rejected
draft's remainder to the end of its turn (one generate call, as the worker's remainders join one),
with the verification forward's keys/values kept for the remainders (``rollout/engine/kv_keep.py``,
contexts of at least ``--min-tokens``, the prefix store's threshold) or not (the remainder
prefills its whole context again); verification and remainder seconds are printed apart, with
the prefill tokens reused and whether the remainders' tokens agree.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from learner.config import RunConfig
from learner.tasks.chat import ChatFormat
from learner.rollout.speculation.drafts import VERIFY_CHUNK
from learner.rollout.engine.torch_engine import SamplingParams, TorchEngine
from learner.rollout.engine.kv_keep import KeepKV
from learner.rollout.engine.prefix_store import MIN_TOKENS
from learner.models.loading import load_model, load_tokenizer, resolve_model_dir, stop_token_ids
from learner.rollout.engine.sampling import Stream
from learner.rollout.speculation.token_verify import Sampled, verify
from learner.tasks.registry import make_env


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


def timed_remainders(model, pad_id: int, views: list[Sampled], params: SamplingParams, keep_kv: bool,
                     min_tokens: int) -> tuple[float, float, float, int, list]:
    """(verification s, remainders s, of it their prefill s, prefill tokens reused, the remainders'
    tokens): the drafts verified in chunks, then each rejected one's turn from its corrected token
    on, in one call (its prefill timed as the engine's cost model times it)."""
    engine = TorchEngine(model, pad_id, reuse_kv=True)
    engine.prefixes.min_tokens = min_tokens
    prefill, add = [], engine.step_cost.prefill.add
    engine.step_cost.prefill.add = lambda size, seconds: (prefill.append(seconds), add(size, seconds))
    t0, verdicts = time.perf_counter(), []
    for first in range(0, len(views), VERIFY_CHUNK):
        chunk = views[first:first + VERIFY_CHUNK]
        keep = KeepKV(engine.prefixes, list(range(first, first + len(chunk))), 10**9) if keep_kv else None
        verdicts += verify(model, chunk, 1.0, 1.0, pad_id, keep=keep)
    t1 = time.perf_counter()
    prompts, seeds, keys = [], [], []
    for b, (d, v) in enumerate(zip(views, verdicts)):
        if v.token is not None and v.token not in params.stop_token_ids:  # (a stop token ends the turn there)
            stream = d.streams[v.kept]
            prompts.append(d.ids[:d.positions[v.kept]] + [v.token])
            seeds.append(Stream(stream.seed, stream.start + 1))
            keys.append(b)
    out = engine.generate(prompts, params, seeds=seeds, keys=keys)
    return t1 - t0, time.perf_counter() - t1, sum(prefill), engine.prefixes.tokens_reused, [c.token_ids for c in out]


def remainders_main(args, model, tok, views) -> None:
    params = SamplingParams(RunConfig().rollout.max_new_tokens, stop_token_ids(tok))
    arms = {"prefill again": False, "verified kv": True}
    runs: dict[str, list] = {name: [] for name in arms}
    for name, keep in arms.items():  # warm-up
        timed_remainders(model, tok.pad_token_id, views, params, keep, args.min_tokens)
    for _ in range(args.repeats):
        for name, keep in arms.items():
            runs[name].append(timed_remainders(model, tok.pad_token_id, views, params, keep, args.min_tokens))
    mean_len = statistics.mean(len(v.ids) for v in views)
    print(f"{len(views)} drafts ({args.prompts} prompts x {args.group_size}), {args.turns} turns, {mean_len:.0f} tokens "
          f"each, {len(runs['verified kv'][0][4])} remainders; min-tokens {args.min_tokens}; median of {args.repeats} (seconds)")
    med = {name: [statistics.median(r[i] for r in rs) for i in range(3)] for name, rs in runs.items()}
    for name, (v, r, p) in med.items():
        print(f"{name:15s} verify {v:8.4f}  remainders {r:8.4f} (prefill {p:7.4f})  verify + remainders {v + r:8.4f}  "
              f"prefill tokens reused {runs[name][0][3]}")
    after, before = med["verified kv"], med["prefill again"]
    print(f"verified / again: verify {after[0] / before[0]:.3f}, remainders {after[1] / before[1]:.3f}, their prefill "
          f"{after[2] / before[2]:.3f}, verify + remainders {(after[0] + after[1]) / (before[0] + before[1]):.3f}   "
          f"remainders' tokens equal: {runs['verified kv'][0][4] == runs['prefill again'][0][4]}")


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
    for name, default in (("--prompts", 32), ("--group-size", 8), ("--turns", 2), ("--repeats", 7), ("--preamble", 0),
                          ("--min-tokens", MIN_TOKENS)):
        parser.add_argument(name, type=int, default=default)
    parser.add_argument("--remainders", action="store_true", help="verification + remainders, kept kv vs prefilled")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tok, views = fixed_drafts(args.prompts, args.group_size, args.turns, args.preamble)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the next step's weights: a small random step away
        for p in model.parameters():
            p.add_(0.05 * p.abs().mean() * torch.randn(p.shape, generator=gen))
    if args.remainders:
        return remainders_main(args, model, tok, views)
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
