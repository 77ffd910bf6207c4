"""What the loss curves cost the learner: one micro-batch's forward + backward with the detached
entropy / KL tally (``forward(..., stats=True)``, learner/grad/loss_tally.py) vs without, alternating.

    .venv/bin/python -m bench.decisions.loss_stats_overhead            # builtin:tiny (vocabulary 82)
    .venv/bin/python -m bench.decisions.loss_stats_overhead --vocab 32000   # a 19 M-parameter Llama, a real vocabulary

16 rows of 40 prompt + 60 generated tokens, one torch thread; prints the medians and their ratio.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time

import torch

from learner.config import AlgorithmConfig
from learner.grad.loss_tally import LossTally
from learner.grad.batching.microbatch import Row, forward, grads_of, on_policy_pg_loss
from learner.models.loading import load_model, resolve_model_dir


def model_of(vocab: int | None) -> torch.nn.Module:
    if vocab is None:
        return load_model(resolve_model_dir("builtin:tiny"))
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                                        num_attention_heads=4, num_key_value_heads=4))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = model_of(args.vocab)
    vocab = model.config.vocab_size
    rng = random.Random(0)
    rows = [Row(i, i // 4, [rng.randrange(vocab) for _ in range(100)], [0] * 40 + [1] * 60, adv=0.5) for i in range(16)]
    algo, params = AlgorithmConfig(), [p for p in model.parameters() if p.requires_grad]

    def once(stats: bool) -> float:
        t0 = time.perf_counter()
        fwd = forward(model, None, algo, rows, None, stats=stats)
        pg = on_policy_pg_loss(fwd, "grpo")
        tally = LossTally()
        if stats:
            tally.add(fwd, pg)
        grads_of(pg, params)
        if stats:
            tally.stats(1.0)
        return time.perf_counter() - t0

    once(False), once(True)  # warm-up
    arms: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeats):
        for stats in (False, True):
            arms[stats].append(once(stats))
    off, on = statistics.median(arms[False]), statistics.median(arms[True])
    print(f"vocab {vocab}, load average {os.getloadavg()[0]:.2f}: without {off * 1e3:.2f} ms, "
          f"with the tally {on * 1e3:.2f} ms, ratio {on / off:.3f}")


if __name__ == "__main__":
    main()
