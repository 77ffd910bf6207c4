"""Engine benchmark: output tokens/s of the vLLM engine vs the torch engine on the same model
and prompts, and weight-publish latency vs model size.

    .venv/bin/python -m bench.engine_bench [--batch 32] [--new-tokens 64] [--sizes tiny,s,m,l] [--json F]

For each model: the same arith-tool prompts, one warm-up call, then ``--repeats`` timed
batched ``generate`` calls per engine (fixed length: no stop tokens, so both engines emit
exactly batch × new_tokens tokens); one torch thread for both. Publish latency is the
trainer's path, median of ``--repeats``: the learner's copy into the shared-memory
``WeightStore`` (``store``), then a replica's ``load_weights`` from it (``vllm load``:
in-place reload + prefix-cache reset; ``torch load``: parameter copy).
``tiny`` is the built-in policy (head 16, served padded to 32); the others are seeded random
Llamas with the same char vocabulary. Each vLLM start-up costs ~30 s on CPU.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from learner.config import RunConfig
from learner.rollout.engine.torch_engine import SamplingParams, TorchEngine
from learner.tasks.registry import make_env
from learner.models.loading import load_model, load_tokenizer, resolve_model_dir
from learner.rollout.processes.weights import WeightStore

# name -> (hidden, layers, heads, intermediate); head size 64 needs no padding on CPU
RANDOM_SIZES: dict[str, tuple[int, int, int, int]] = {
    "s": (256, 4, 4, 768),
    "m": (512, 6, 8, 1536),
    "l": (768, 8, 12, 2304),
}


def random_llama_dir(name: str, tokenizer, root: Path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, inter = RANDOM_SIZES[name]
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads, intermediate_size=inter,
                         max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    out = root / name
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def prompts(tokenizer, n: int) -> list[list[int]]:
    env, rng = make_env(RunConfig().task), random.Random(0)
    return [tokenizer.encode(env.sample_task(rng).prompt_text, add_special_tokens=False) for _ in range(n)]


def tokens_per_s(engine, batch: list[list[int]], params: SamplingParams, repeats: int) -> float:
    seeds = list(range(len(batch)))
    engine.generate(batch, params, seeds=seeds)  # warm-up
    n, t0 = 0, time.perf_counter()
    for _ in range(repeats):
        n += sum(len(c.token_ids) for c in engine.generate(batch, params, seeds=seeds))
    return n / (time.perf_counter() - t0)


def publish_ms(model, engine, repeats: int) -> tuple[float, float]:
    """Median ms of (learner -> store copy, store -> engine load)."""
    named = dict(model.named_parameters())
    store = WeightStore(named)
    store_ms, load_ms = [], []
    for v in range(1, repeats + 1):
        t0 = time.perf_counter()
        store.publish(named, v)
        t1 = time.perf_counter()
        store.read_into(engine.load_weights, want=v)
        t2 = time.perf_counter()
        store_ms.append(1e3 * (t1 - t0))
        load_ms.append(1e3 * (t2 - t1))
    return statistics.median(store_ms), statistics.median(load_ms)


def bench_model(name: str, model_dir: Path, tokenizer, args) -> dict:
    from learner.rollout.vllm_backend.vllm_engine import VllmEngine

    batch = prompts(tokenizer, args.batch)
    params = SamplingParams(args.new_tokens, stop_token_ids=[])  # fixed length
    model = load_model(model_dir)
    torch_engine = TorchEngine(load_model(model_dir), pad_id=tokenizer.pad_token_id)
    row = {"model": name, "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
           "mb": sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20}
    row["torch_tok_s"] = tokens_per_s(torch_engine, batch, params, args.repeats)
    _, row["torch_load_ms"] = publish_ms(model, torch_engine, args.repeats)
    cfg = RunConfig.model_validate({"train": {"prompts_per_step": args.batch, "group_size": 1}})
    vllm_engine = VllmEngine(cfg, str(model_dir), tokenizer, replica=0)
    try:
        row["vllm_startup_s"] = vllm_engine.stats.extra["startup_s"]
        row["vllm_tok_s"] = tokens_per_s(vllm_engine, batch, params, args.repeats)
        row["store_ms"], row["vllm_load_ms"] = publish_ms(model, vllm_engine, args.repeats)
    finally:
        vllm_engine.close()
    row["speedup"] = row["vllm_tok_s"] / row["torch_tok_s"]
    return row


def print_table(rows: list[dict], args) -> None:
    print(f"\nbatch {args.batch} x {args.new_tokens} new tokens, {args.repeats} timed calls, 1 torch thread")
    head = ("model", "params", "MB", "torch tok/s", "vLLM tok/s", "speedup", "store ms", "vLLM load ms",
            "torch load ms", "vLLM start s")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print(f"| {r['model']} | {r['params_m']:.2f}M | {r['mb']:.1f} | {r['torch_tok_s']:.0f} | {r['vllm_tok_s']:.0f} "
              f"| {r['speedup']:.2f}x | {r['store_ms']:.2f} | {r['vllm_load_ms']:.1f} | {r['torch_load_ms']:.2f} "
              f"| {r['vllm_startup_s']:.0f} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32, help="prompts per generate call")
    p.add_argument("--new-tokens", type=int, default=64, help="tokens generated per prompt")
    p.add_argument("--repeats", type=int, default=3, help="timed calls / publishes per measurement")
    p.add_argument("--sizes", default="tiny,s,m,l", help=f"comma list of tiny,{','.join(RANDOM_SIZES)}")
    p.add_argument("--json", help="also write the rows here")
    args = p.parse_args()
    torch.set_num_threads(1)
    policy_dir = resolve_model_dir("builtin:tiny")
    tokenizer = load_tokenizer(policy_dir)
    rows = []
    with tempfile.TemporaryDirectory(prefix="engine-bench-") as tmp:
        for name in args.sizes.split(","):
            if name != "tiny" and name not in RANDOM_SIZES:
                p.error(f"--sizes: unknown size {name!r} (tiny, {', '.join(RANDOM_SIZES)})")
            model_dir = policy_dir if name == "tiny" else random_llama_dir(name, tokenizer, Path(tmp))
            rows.append(bench_model(name, model_dir, tokenizer, args))
            print(json.dumps(rows[-1]), file=sys.stderr)
    print_table(rows, args)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
