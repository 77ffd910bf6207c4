"""How soon the first trajectory of a batch can reach the learner: the torch engine's first
call over a GRPO batch (P prompts x G rows each), with and without prefix sharing, and when
its first row is handed back (``on_done``) vs when the whole call returns.

    .venv/bin/python -m bench.decisions.first_row [--prompts 32] [--group-size 8] [--repeats 5]

Same model (the built-in policy), prompts (arith-tool tasks) and seeds in both arms, one
torch thread; arms alternate per repeat, medians are printed side by side.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from learner.config import RunConfig
from learner.rollout.engine.torch_engine import SamplingParams, TorchEngine
from learner.tasks.registry import make_env
from learner.models.loading import load_model, load_tokenizer, resolve_model_dir, stop_token_ids


def one_call(engine: TorchEngine, batch: list[list[int]], params: SamplingParams) -> dict[str, float]:
    calls, first_done = [], []
    forward = engine.model.forward

    def timed(*args, **kwargs):
        t = time.perf_counter()
        out = forward(*args, **kwargs)
        calls.append(time.perf_counter() - t)
        return out

    engine.model.forward = timed
    t0 = time.perf_counter()
    engine.generate(batch, params, seeds=list(range(len(batch))),
                    on_done=lambda i, c: first_done.append(time.perf_counter() - t0) if not first_done else None)
    total = time.perf_counter() - t0
    engine.model.forward = forward
    return {"prefill_s": calls[0], "first_row_s": first_done[0], "call_s": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = RunConfig()
    model_dir = resolve_model_dir(cfg.model.policy, cfg.model.cache_dir, cfg.seed)
    model, tok = load_model(model_dir, torch.float32), load_tokenizer(model_dir)
    env, rng = make_env(cfg.task), random.Random(0)
    batch = [ids for _ in range(args.prompts)
             for ids in [tok.encode(env.sample_task(rng).prompt_text, add_special_tokens=False)] * args.group_size]
    params = SamplingParams(cfg.rollout.max_new_tokens, stop_token_ids(tok))
    arms = {"shared prefill": TorchEngine(model, tok.pad_token_id, share_prefill=True),
            "one prefill per row": TorchEngine(model, tok.pad_token_id, share_prefill=False)}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in arms}
    for name, engine in arms.items():
        one_call(engine, batch, params)  # warm-up
    for _ in range(args.repeats):
        for name, engine in arms.items():
            results[name].append(one_call(engine, batch, params))
    print(f"{args.prompts} prompts x {args.group_size} rows, median of {args.repeats} calls (seconds)")
    print(f"{'':22s}{'prefill':>10s}{'first row out':>15s}{'whole call':>12s}")
    for name, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{name:22s}{med['prefill_s']:10.4f}{med['first_row_s']:15.4f}{med['call_s']:12.4f}")


if __name__ == "__main__":
    main()
