"""GPU check: the streaming learner and the torch rollout engine on one CUDA device.

    python -m bench.gpu_check [--device cuda] [--sizes s,m] [--json F]

Per model size, a seeded random Llama (token ids are drawn, so no tokenizer is needed):
  1. rollout: ``TorchEngine.generate`` of one GRPO batch (P prompts x G samples, fixed length,
     prefill shared per prompt): the call's time R and output tokens/s;
  2. learner: those completions fed to ``StreamingLearner.on_trajectory`` in a random order
     (rewards drawn: this checks cost, not learning), each call between two device syncs:
     learner.backward ms per trajectory (median, p90), group close ms, then finish_batch +
     clip + AdamW; L = their sum; peak device memory and most group-sum buffers open;
  3. publish: ``WeightStore.publish`` (device -> shared host memory, what every step pays) and
     ``TorchEngine.load_weights`` (host -> device), page-locked (as a GPU learner's store is) and
     pageable;
  4. exactness: the streamed gradient of a smaller batch against the batch-synchronous
     reference (``reference_gradient``, all graphs held at once) on the same device, fp32.
From the measured parts: sync pays R + L + publish per step; streaming on separate rollout
and learner devices pays about max(R, L) + the work after the last reward (tail: one
backward + close + optimizer + publish). On one GPU the two cannot overlap, so those two
are derived from measured parts, labelled as such, not measured steps.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from learner.config import AlgorithmConfig
from learner.grad.exactness import relative_error
from learner.grad.learner_common import LearnerOptions
from learner.grad.on_policy import StreamingLearner
from learner.grad.reference import reference_gradient
from learner.rollout.engine import SamplingParams, TorchEngine
from learner.rollout.weights import WeightStore
from learner.timeline import Kind
from learner.trajectory import Trajectory

# name -> (hidden, layers, heads, intermediate, vocab)
SIZES: dict[str, tuple[int, int, int, int, int]] = {
    "tiny": (64, 2, 4, 128, 512),  # a CPU dry run of the script
    "s": (1024, 12, 16, 2816, 32000),
    "m": (1536, 16, 12, 4096, 32000),
}


def random_llama(size: str, device: torch.device, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, heads, inter, vocab = SIZES[size]
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=heads, intermediate_size=inter, max_position_embeddings=4096,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2)
    return LlamaForCausalLM(config).to(device)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn):
    """(result, seconds) of ``fn()`` between two device syncs."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def rollout(engine: TorchEngine, vocab: int, groups: int, group_size: int, prompt_len: int, new_tokens: int,
            rng: random.Random) -> tuple[list[Trajectory], dict]:
    prompts = [[rng.randrange(3, vocab) for _ in range(prompt_len)] for _ in range(groups)]
    batch = [p for p in prompts for _ in range(group_size)]  # a group shares its prompt
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, stop_token_ids=[], seed=0)
    engine.generate(batch[:2], SamplingParams(max_new_tokens=4, stop_token_ids=[]))  # kernels, allocator
    completions, r_s = timed(engine.device, lambda: engine.generate(batch, params))
    trajs = [
        Trajectory(id=i, group=i // group_size, step=0, input_ids=batch[i] + c.token_ids,
                   loss_mask=[0] * prompt_len + [1] * len(c.token_ids),
                   behavior_logprobs=[0.0] * prompt_len + c.logprobs, reward=rng.random(),
                   turn_versions=[0], turn_spans=[(prompt_len, prompt_len + len(c.token_ids))])
        for i, c in enumerate(completions)
    ]
    tokens = sum(len(c.token_ids) for c in completions)
    return trajs, {"rollout_s": r_s, "tokens_out": tokens, "tokens_per_s": tokens / r_s}


def learner_step(model, trajs: list[Trajectory], algo: AlgorithmConfig, rng: random.Random) -> dict:
    device = next(model.parameters()).device
    # one trajectory's backward at a time, as it arrives: what this check times
    learner = StreamingLearner(model, algo, options=LearnerOptions(path="per-trajectory"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    backward, close = [], []

    def on_phase(kind, t0, t1, traj, group):
        if kind == Kind.GROUP_CLOSE:
            close.append(t1 - t0)

    learner.begin_batch(dict(Counter(t.group for t in trajs)))
    for traj in rng.sample(trajs, len(trajs)):  # rewards arrive in any order
        closed_before = len(close)
        _, s = timed(device, lambda: learner.on_trajectory(traj, on_phase))
        backward.append(s - sum(close[closed_before:]))

    def barrier():
        out = learner.finish_batch()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out

    finished, opt_s = timed(device, barrier)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return {
        "n_traj": len(trajs), "n_tokens": finished["n_tokens"], "peak_group_buffers": finished["peak_buffers"],
        "backward_ms_median": 1e3 * statistics.median(backward), "backward_ms_p90": 1e3 * pct(backward, 0.9),
        "backward_ms_first": 1e3 * backward[0], "close_ms_median": 1e3 * statistics.median(close),
        "finish_clip_adamw_ms": 1e3 * opt_s, "learner_s": sum(backward) + sum(close) + opt_s,
        "tail_learner_s": backward[-1] + (close[-1] if close else 0.0) + opt_s, "peak_device_gib": peak,
    }


def publish(model, engine: TorchEngine) -> dict:
    """A GPU learner's store page-locks its shared host tensors (``WeightStore.pin``); a store
    made from host tensors is left pageable, which is what the pinning is measured against."""
    device = next(model.parameters()).device
    named = dict(model.named_parameters())
    out = {}
    for label, store in (("pageable", WeightStore({n: t.cpu() for n, t in named.items()})),
                         ("", WeightStore(named))):
        assert all(t.device.type == "cpu" and t.is_shared() for t in store.tensors.values())  # the wire is host memory
        _, pub_s = timed(device, lambda: store.publish(named, 1))
        _, load_s = timed(engine.device, lambda: engine.load_weights(store.tensors, 1))
        suffix = f"_{label}" if label else ""
        out.update({f"publish{suffix}_ms": 1e3 * pub_s, f"publish{suffix}_gb_s": store.nbytes / pub_s / 1e9,
                    f"engine_load{suffix}_ms": 1e3 * load_s, "weights_mib": store.nbytes / 2**20})
    return out


def exactness(model, trajs: list[Trajectory], algo: AlgorithmConfig, rng: random.Random) -> dict:
    learner = StreamingLearner(model, algo)
    learner.begin_batch(dict(Counter(t.group for t in trajs)))
    for traj in rng.sample(trajs, len(trajs)):
        learner.on_trajectory(traj)
    learner.finish_batch()
    streamed = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    ref = reference_gradient(model, trajs, algo)
    return {"exact_n_traj": len(trajs), "rel_error_vs_reference": relative_error(streamed, ref)}


def check_size(size: str, device: torch.device, args: argparse.Namespace) -> dict:
    rng = random.Random(f"gpu-check/{size}")
    model = random_llama(size, device)
    engine = TorchEngine(random_llama(size, device), pad_id=0)
    vocab = SIZES[size][4]
    algo = AlgorithmConfig(objective="grpo", loss_agg_mode="token-mean")
    trajs, out = rollout(engine, vocab, args.groups, args.group_size, args.prompt_len, args.new_tokens, rng)
    out.update(params_m=sum(p.numel() for p in model.parameters()) / 1e6)
    learner_step(model, trajs[: 2 * args.group_size], algo, rng)  # warm-up: kernels, allocator, AdamW state
    out.update(learner_step(model, trajs, algo, rng))
    out.update(publish(model, engine))
    small = [t for t in trajs if t.group < args.exact_groups]
    short = [Trajectory(**{**t.__dict__, "input_ids": t.input_ids[: args.prompt_len + 32],
                           "loss_mask": t.loss_mask[: args.prompt_len + 32]}) for t in small]
    out.update(exactness(model, short, algo, rng))
    pub_s = out["publish_ms"] / 1e3
    r, l_s = out["rollout_s"], out["learner_s"]
    out.update(derived_sync_step_s=r + l_s + pub_s,
               derived_streaming_step_s=max(r, l_s - out["tail_learner_s"]) + out["tail_learner_s"] + pub_s)
    out["derived_speedup"] = out["derived_sync_step_s"] / out["derived_streaming_step_s"]
    del model, engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default="s,m", help=f"comma-separated, of {', '.join(SIZES)}")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=384)
    ap.add_argument("--exact-groups", type=int, default=2, help="groups in the exactness batch")
    ap.add_argument("--tf32", action="store_true", help="TF32 matmuls (off: exact fp32, the default)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": args.device,
           "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
           "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "workload": {k: v for k, v in vars(args).items() if k != "json"}}
    print(json.dumps(env))
    results = {}
    for size in args.sizes.split(","):
        results[size] = check_size(size, device, args)
        print(json.dumps({size: results[size]}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "sizes": results}, indent=1))
    cols = ["params_m", "rollout_s", "tokens_per_s", "backward_ms_median", "backward_ms_p90", "close_ms_median",
            "finish_clip_adamw_ms", "learner_s", "publish_pageable_ms", "engine_load_pageable_ms", "publish_ms", "publish_gb_s", "engine_load_ms", "peak_device_gib",
            "rel_error_vs_reference", "derived_sync_step_s", "derived_streaming_step_s", "derived_speedup"]
    for c in cols:
        print(f"{c:26}" + "".join(f"{results[s][c]:>12.4g}" for s in results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
