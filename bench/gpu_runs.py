"""The trainer end to end on one device, for ``bench/gpu_check.py``: ``thundersync train`` on the
bench workload (configs/bench.yaml's task and batch shape) with a seeded random Llama policy, the
learner in the driver process and the rollout worker in its own process, both on the device
(on one GPU: ``placement`` colocated on GPU 0). One fresh run per arm, its first step dropped:

    sync                 the batch-synchronous baseline
    streaming            the streaming learner, the rollout's default engine (continuous batching)
    streaming-captured   streaming, the rollout on the captured-decode engine (rollout.captured_decode)

A random policy rarely calls the tool, so most trajectories are one turn of max_new_tokens: this
measures the cost of a step at this model size, not learning.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from learner.bench.measure import BenchError, load_events, measured_steps
from learner.timeline import Metric

ROOT = Path(__file__).resolve().parents[1]
# name -> (hidden, layers, heads, intermediate); the vocabulary is the built-in character tokenizer's
# (~100 tokens), so "s" widens the MLP to keep ~220M parameters (bench/gpu_check.py's size s)
RUN_SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (64, 2, 4, 128),
    "s": (1024, 12, 16, 4608),
    "m": (1536, 16, 12, 4096),
}
ARMS: dict[str, dict] = {
    "sync": {"train": {"schedule": "sync"}},
    "streaming": {"train": {"schedule": "streaming"}},
    "streaming-captured": {"train": {"schedule": "streaming"},
                           "rollout": {"captured_decode": True, "continuous_batching": False}},
}
KEPT = (Metric.STEP_S, Metric.LEARNER_S, Metric.GEN_S, Metric.TAIL_S, Metric.TRAINER_IDLE, Metric.ROLLOUT_IDLE,
        Metric.TOKENS, Metric.PEAK_LEARNER_MEMORY_MB)


def write_policy(out_dir: Path, size: str, seed: int = 0) -> float:
    """A seeded random Llama with the built-in tokenizer, as a Hugging Face directory; its parameters, in M."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from learner.models.loading import stop_token_ids
    from learner.tasks.char_tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    hidden, layers, heads, inter = RUN_SIZES[size]
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         num_key_value_heads=heads, intermediate_size=inter, max_position_embeddings=2048,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                         tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=stop_token_ids(tok), pad_token_id=tok.pad_token_id,
                                               bos_token_id=tok.bos_token_id)
    model.save_pretrained(out_dir)
    tok.save_pretrained(out_dir)
    return sum(p.numel() for p in model.parameters()) / 1e6


def run_config(policy: Path, device: str, arm: str, steps: int, prompts: int, group_size: int) -> dict:
    cfg = yaml.safe_load((ROOT / "configs" / "bench.yaml").read_text())
    cfg["model"] = {"policy": str(policy), "device": device}
    cfg["train"].update(steps=steps, prompts_per_step=prompts, group_size=group_size)
    for section, values in ARMS[arm].items():
        cfg.setdefault(section, {}).update(values)
    if device == "cuda":  # learner and rollout worker share the one GPU: said, not assumed
        cfg["placement"] = {"learner": [0], "rollout": [0], "colocated": True}
    return cfg


def train_once(cfg: dict, work: Path, timeout_s: float) -> dict:
    """One ``thundersync train`` process; its measured steps' medians, or the error that stopped it."""
    name = f"{cfg['train']['schedule']}-{'captured' if cfg.get('rollout', {}).get('captured_decode') else 'eager'}"
    config_path, events = work / f"{name}.yaml", work / f"{name}.jsonl"
    config_path.write_text(yaml.safe_dump(cfg))
    cmd = [sys.executable, "-m", "learner.cli", "train", "--config", str(config_path), "--events", str(events), "--quiet"]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
    except subprocess.TimeoutExpired:
        return {"error": f"ran past {timeout_s:g} s", "wall_s": time.monotonic() - t0}
    out: dict = {"wall_s": time.monotonic() - t0, "returncode": proc.returncode}
    out["devices"] = [line for line in proc.stderr.splitlines() if line.startswith("boot: devices:")]
    if proc.returncode != 0:
        out["error"] = " | ".join(proc.stderr.strip().splitlines()[-4:])
        return out
    try:
        steps = measured_steps(load_events(events), warmup=1)
    except (BenchError, OSError, ValueError) as exc:  # the run ended without a measured step
        out["error"] = str(exc).splitlines()[0]
        return out
    out["steps_measured"] = len(steps)
    for key in KEPT:
        values = [s[key] for s in steps if key in s]
        if values:
            out[f"{key}_median"] = statistics.median(values)
    out["step_s_all"] = [s[Metric.STEP_S] for s in steps]
    return out


def trainer_runs(device: str, size: str, arms: list[str], steps: int, prompts: int, group_size: int,
                 work: Path, timeout_s: float) -> dict:
    """Each arm on a fresh process; the sync/streaming ratios of their median steps."""
    work.mkdir(parents=True, exist_ok=True)
    policy = work / f"policy-{size}"
    out: dict = {"size": size, "params_m": write_policy(policy, size), "steps": steps,
                 "prompts_per_step": prompts, "group_size": group_size}
    for arm in arms:
        out[arm] = train_once(run_config(policy, device, arm, steps, prompts, group_size), work, timeout_s)
        print(json.dumps({f"run/{arm}": out[arm]}), flush=True)
    sync_s = out.get("sync", {}).get(f"{Metric.STEP_S}_median")
    for arm in arms:
        step_s = out[arm].get(f"{Metric.STEP_S}_median")
        if sync_s and step_s and arm != "sync":
            out[f"speedup_{arm}_vs_sync"] = sync_s / step_s
    return out
