"""KV reuse across turns (``rollout.reuse_kv``) on vs off, by context length, side by side.

    .venv/bin/python -m bench.decisions.kv_reuse [--rows 64] [--contexts 32,128,384] [--rounds 5] [--json out.json]

The torch engine's second turn of ``--rows`` agent loops on the built-in tiny policy, one torch
thread: turn 1 samples 16 tokens after a prompt of C tokens, then every loop appends an
8-token "tool answer" and samples turn 2. Timed: turn 2's generate call, which with reuse
prefills only the 9 new tokens of each row (its last sampled token and the answer) on top of
the keys/values kept from turn 1, and without it the whole C + 24-token context. Both arms
sample the same tokens (tests/learner/test_continuous_batching.py). Rounds alternate the arm
order; medians and the load average are reported, as the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

from bench.load_report import finish


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--contexts", default="32,128,384")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    from learner.rollout.engine.torch_engine import TorchEngine
    from learner.models.loading import load_model, load_tokenizer, resolve_model_dir
    from learner.rollout.engine.sampling import SamplingParams

    torch.set_num_threads(1)
    policy = resolve_model_dir("builtin:tiny")
    tok, model = load_tokenizer(policy), load_model(policy)
    vocab = len(tok)
    params = SamplingParams(16, [])  # no stop token: every row samples 16 tokens per turn
    load_start = os.getloadavg()[0]
    out: dict = {"rows": args.rows, "rounds": args.rounds, "contexts": {}, "load_start": load_start}
    for context in [int(c) for c in args.contexts.split(",")]:
        rng = random.Random(context)
        prompts = [[rng.randrange(4, vocab) for _ in range(context)] for _ in range(args.rows)]
        answer = [[rng.randrange(4, vocab) for _ in range(8)] for _ in range(args.rows)]
        times: dict[str, list[float]] = {"reuse-kv": [], "full-prefill": []}
        for r in range(args.rounds):
            for arm in (["reuse-kv", "full-prefill"] if r % 2 == 0 else ["full-prefill", "reuse-kv"]):
                engine = TorchEngine(model, tok.pad_token_id, continuous_batching=True, reuse_kv=arm == "reuse-kv")
                keys = list(range(args.rows))
                first = engine.generate(prompts, params, seeds=keys, keys=keys)
                second = [p + c.token_ids + a for p, c, a in zip(prompts, first, answer)]
                t0 = time.perf_counter()
                engine.generate(second, params, seeds=[1000 + k for k in keys], keys=keys)
                times[arm].append(time.perf_counter() - t0)
        on, off = statistics.median(times["reuse-kv"]), statistics.median(times["full-prefill"])
        out["contexts"][context] = {"turn2_s": {"reuse-kv": on, "full-prefill": off}, "all": times, "ratio": on / off}
        print(f"context {context:4} tokens: turn 2 {on * 1e3:.1f} ms with reuse vs {off * 1e3:.1f} ms full prefill "
              f"({on / off:.2f}x)")
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
