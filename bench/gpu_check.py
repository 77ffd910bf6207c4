"""GPU check: the streaming learner and the torch rollout engine on one CUDA device.

    python -m bench.gpu_check [--device cuda] [--sizes s,m] [--json F] [--runs sync,streaming,streaming-captured]

Per model size, a seeded random Llama (token ids are drawn, so no tokenizer is needed):
  1. rollout: ``TorchEngine.generate`` of one GRPO batch (P prompts x G samples, fixed length,
     prefill shared per prompt): the call's time R and output tokens/s;
  2. learner: those completions fed to ``StreamingLearner.on_trajectory`` in a random order
     (rewards drawn: this checks cost, not learning), each call between two device syncs:
     learner.backward ms per trajectory (median, p90), group close ms, then finish_batch +
     clip + AdamW; L = their sum; peak device memory and most group-sum buffers open;
     ``--learner grouped`` (or ``both``): the same batch learnt in grouped micro-batches of
     ``--grouped-chunk`` arrivals (learner/grad/batching/grouped.py), per-trajectory learner cost both ways;
  3. publish: ``WeightStore.publish`` (device -> shared host memory, what every step pays) and
     ``TorchEngine.load_weights`` (host -> device), page-locked (as a GPU learner's store is) and
     pageable;
  4. exactness: the streamed gradient of a smaller batch against the batch-synchronous
     reference (``reference_gradient``, all graphs held at once) on the same device, fp32.
  5. engines: the eager fixed-batch engine and the captured-decode engine (``rollout/engine/captured.py``:
     static KV cache, the decode step a CUDA graph) on the same batch and seeds: tokens/s of each and
     how many rows sampled the same tokens (all of them, or the captured engine is wrong);
then, once (``bench/gpu_runs.py``): real ``thundersync train`` runs of the bench workload, learner
and rollout worker as separate processes on the device, sync and streaming (first step dropped).
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
import tempfile
import time
from collections import Counter
from pathlib import Path

import torch

from bench.gpu_runs import ARMS, trainer_runs
from learner.config import AlgorithmConfig
from learner.checks.exactness import relative_error
from learner.grad.learners.common import LearnerOptions
from learner.grad.learners.on_policy import StreamingLearner
from learner.grad.reference import reference_gradient
from learner.rollout.engine.captured import CapturedEngine
from learner.rollout.engine.torch_engine import SamplingParams, TorchEngine
from learner.rollout.processes.weights import WeightStore
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

    finished, opt_s = timed(device, lambda: barrier_step(learner, model, opt))
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return {
        "n_traj": len(trajs), "n_tokens": finished["n_tokens"], "peak_group_buffers": finished["peak_buffers"],
        "backward_ms_median": 1e3 * statistics.median(backward), "backward_ms_p90": 1e3 * pct(backward, 0.9),
        "backward_ms_first": 1e3 * backward[0], "close_ms_median": 1e3 * statistics.median(close),
        "finish_clip_adamw_ms": 1e3 * opt_s, "learner_s": sum(backward) + sum(close) + opt_s,
        "tail_learner_s": backward[-1] + (close[-1] if close else 0.0) + opt_s, "peak_device_gib": peak,
    }


def barrier_step(learner: StreamingLearner, model, opt) -> dict:
    """The batch's barrier as the trainer runs it: finish_batch, clip, optimizer step, zero_grad."""
    out = learner.finish_batch()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out


def grouped_learner_step(model, trajs: list[Trajectory], algo: AlgorithmConfig, rng: random.Random,
                         chunk: int) -> dict:
    """The same batch learnt in grouped micro-batches (learner/grad/batching/grouped.py): arrivals in random
    order, ``chunk`` at a time; after each chunk the adaptive learner's idle work learns everything
    waiting (open groups' members and known rows) in one grouped backward. Per-trajectory learner cost:
    the forwards and backwards, the closes and the barrier, over the trajectories."""
    device = next(model.parameters()).device
    budget = chunk * max(len(t.input_ids) for t in trajs)
    learner = StreamingLearner(model, algo, options=LearnerOptions(
        path="adaptive", micro_batch_tokens=budget, drain_policy="finished-groups-first", speculate_zero_variance=True))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    order = rng.sample(trajs, len(trajs))
    learner.begin_batch(dict(Counter(t.group for t in trajs)))
    work = 0.0

    def arrive(items):
        learner.learn(items)
        while learner.idle_work():  # the driver's idle calls, while the rollout would run
            pass

    for k in range(0, len(order), chunk):
        work += timed(device, lambda: arrive(order[k:k + chunk]))[1]

    finished, opt_s = timed(device, lambda: barrier_step(learner, model, opt))
    return {"grouped_learner_s": work + opt_s, "grouped_ms_per_traj": 1e3 * (work + opt_s) / len(trajs),
            "grouped_micro_batches": finished["micro_batches"], "grouped_open_rows": finished["open_rows"],
            "grouped_backwards": finished["grouped_micro_batches"]}


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


def engines(model, vocab: int, groups: int, group_size: int, prompt_len: int, new_tokens: int,
            rng: random.Random) -> dict:
    """Eager vs captured decode, one fixed batch each, the same prompts and seeds (a group shares its
    prompt: prefill shared in both). A failure of either is recorded, not raised: the rest stands."""
    device = next(model.parameters()).device
    prompts = [[rng.randrange(3, vocab) for _ in range(prompt_len)] for _ in range(groups)]
    batch = [p for p in prompts for _ in range(group_size)]
    params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0, stop_token_ids=[], seed=0)
    out, completions = {}, {}
    for name, make in (("eager", lambda: TorchEngine(model, pad_id=0, continuous_batching=False)),
                       ("captured", lambda: CapturedEngine(model, pad_id=0))):
        try:
            engine = make()
            engine.generate(batch[:2], SamplingParams(max_new_tokens=4, stop_token_ids=[]))  # kernels, allocator
            completions[name], s = timed(device, lambda: engine.generate(batch, params))
        except Exception as exc:  # e.g. a capture this torch/transformers cannot do
            out[f"{name}_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            continue
        tokens = sum(len(c.token_ids) for c in completions[name])
        out.update({f"{name}_s": s, f"{name}_tokens_per_s": tokens / s})
        if isinstance(engine, CapturedEngine):  # did the graph replay, or the static step run eagerly?
            out["captured_graph"] = engine.capture and engine.capture_error is None
            if engine.capture_error:
                out["captured_capture_error"] = engine.capture_error
    if len(completions) == 2:
        pairs = list(zip(completions["eager"], completions["captured"]))
        out["captured_rows_same_tokens"] = sum(a.token_ids == b.token_ids for a, b in pairs)
        out["engine_rows"] = len(pairs)
        out["captured_logprob_max_abs_diff"] = max(abs(x - y) for a, b in pairs for x, y in zip(a.logprobs, b.logprobs))
        out["captured_speedup"] = out["eager_s"] / out["captured_s"]
    return out


def check_size(size: str, device: torch.device, args: argparse.Namespace) -> dict:
    rng = random.Random(f"gpu-check/{size}")
    model = random_llama(size, device)
    engine = TorchEngine(random_llama(size, device), pad_id=0)
    vocab = SIZES[size][4]
    algo = AlgorithmConfig(objective="grpo", loss_agg_mode="token-mean")
    trajs, out = rollout(engine, vocab, args.groups, args.group_size, args.prompt_len, args.new_tokens, rng)
    out.update(params_m=sum(p.numel() for p in model.parameters()) / 1e6)
    learner_step(model, trajs[: 2 * args.group_size], algo, rng)  # warm-up: kernels, allocator, AdamW state
    way, chunk = getattr(args, "learner", "per-trajectory"), getattr(args, "grouped_chunk", 16)
    if way in ("per-trajectory", "both"):
        out.update(learner_step(model, trajs, algo, rng))
        out["per_trajectory_ms_per_traj"] = 1e3 * out["learner_s"] / len(trajs)
    if way in ("grouped", "both"):
        grouped_learner_step(model, trajs[: 2 * args.group_size], algo, rng, chunk)  # warm-up
        out.update(grouped_learner_step(model, trajs, algo, rng, chunk))
        out.setdefault("learner_s", out["grouped_learner_s"])  # grouped alone: the derived steps use it
        out.setdefault("tail_learner_s", out["grouped_learner_s"] * min(1.0, chunk / len(trajs)))
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
    del model
    out.update(engines(engine.model, vocab, args.groups, args.group_size, args.prompt_len, args.new_tokens, rng))
    del engine
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def arm_list(text: str) -> str:
    """--runs: a comma list of ``ARMS`` names, or '' for none."""
    unknown = [a for a in text.split(",") if a and a not in ARMS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown run {unknown[0]!r} (choose from {', '.join(ARMS)})")
    return ",".join(a for a in text.split(",") if a)


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
    ap.add_argument("--learner", choices=("per-trajectory", "grouped", "both"), default="per-trajectory",
                    help="how the learner step learns the batch: one backward per trajectory as it arrives, "
                         "grouped micro-batches of --grouped-chunk arrivals (learner/grad/batching/grouped.py), or both")
    ap.add_argument("--grouped-chunk", type=int, default=16, help="arrivals per grouped micro-batch")
    ap.add_argument("--runs", default="sync,streaming,streaming-captured", type=arm_list,
                    help=f"thundersync train runs of the bench workload, of {', '.join(ARMS)} ('' for none)")
    ap.add_argument("--run-size", help="their policy's size (default: the first of --sizes)")
    ap.add_argument("--run-steps", type=int, default=4, help="steps per run, the first dropped as warm-up")
    ap.add_argument("--run-prompts", type=int, default=32, help="prompts per step (the bench workload: 32)")
    ap.add_argument("--run-group-size", type=int, default=8, help="trajectories per prompt (the bench workload: 8)")
    ap.add_argument("--run-timeout", type=float, default=150.0, help="seconds one run may take")
    args = ap.parse_args()
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": args.device,
           "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
           "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "workload": {k: v for k, v in vars(args).items() if k != "json"}}
    print(json.dumps(env))
    runs = {}
    if args.runs:  # first: fresh processes, before this one holds models and caches on the device
        try:
            with tempfile.TemporaryDirectory(prefix="gpu-check-runs-") as work:
                runs = trainer_runs(args.device, args.run_size or args.sizes.split(",")[0], args.runs.split(","),
                                    args.run_steps, args.run_prompts, args.run_group_size, Path(work),
                                    args.run_timeout)
        except Exception as exc:  # recorded: the sizes still run
            runs = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
    results = {}
    for size in args.sizes.split(","):
        try:
            results[size] = check_size(size, device, args)
        except Exception as exc:  # recorded: the other sizes and the runs still reach the JSON
            results[size] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
        print(json.dumps({size: results[size]}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "sizes": results, "runs": runs}, indent=1))
    cols = ["params_m", "rollout_s", "tokens_per_s", "per_trajectory_ms_per_traj", "grouped_ms_per_traj",
            "grouped_backwards", "backward_ms_median", "backward_ms_p90", "close_ms_median",
            "finish_clip_adamw_ms", "learner_s", "publish_pageable_ms", "engine_load_pageable_ms", "publish_ms", "publish_gb_s", "engine_load_ms", "peak_device_gib",
            "rel_error_vs_reference", "derived_sync_step_s", "derived_streaming_step_s", "derived_speedup",
            "eager_tokens_per_s", "captured_tokens_per_s", "captured_speedup", "captured_rows_same_tokens",
            "engine_rows", "captured_logprob_max_abs_diff"]
    for c in cols:
        print(f"{c:30}" + "".join(f"{results[s].get(c, float('nan')):>12.4g}" for s in results))
    for arm in ARMS:
        if arm in runs:
            print(f"run {arm:26}" + f"step_s median {runs[arm].get('timing_s/step_median', float('nan')):.3f}  "
                  f"{runs[arm].get('error', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
