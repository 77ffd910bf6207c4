"""Builds the rollout engine a config asks for (imported inside worker processes)."""

from __future__ import annotations

from learner.config import RunConfig


def make_engine(cfg: RunConfig, policy_dir: str, tokenizer, replica: int):
    if cfg.rollout.engine == "vllm":
        from learner.rollout.vllm_engine import VllmEngine  # optional dependency

        return VllmEngine(cfg, policy_dir, tokenizer, replica)
    from learner.rollout.engine import TorchEngine
    from learner.rollout.models import load_model

    return TorchEngine(load_model(policy_dir).to(cfg.model.device), pad_id=tokenizer.pad_token_id,
                       continuous_batching=cfg.rollout.continuous_batching, reuse_kv=cfg.rollout.reuse_kv)
