"""Builds the rollout engine a config asks for (imported inside worker processes)."""

from __future__ import annotations

from learner.config import RunConfig
from learner.placement import rollout_device


def engine_dtype(cfg: RunConfig) -> str:
    """The rollout engine's weight dtype: ``rollout.dtype``, or ``model.dtype`` when unset."""
    return cfg.rollout.dtype or cfg.model.dtype


def make_engine(cfg: RunConfig, policy_dir: str, tokenizer, replica: int):
    """The rollout engine ``rollout.engine`` names (learner.registries.engines), on its device."""
    return BUILDERS[cfg.rollout.engine](cfg, policy_dir, tokenizer, replica)


def vllm_engine(cfg: RunConfig, policy_dir: str, tokenizer, replica: int):
    from learner.rollout.vllm_backend.vllm_engine import VllmEngine  # optional dependency

    return VllmEngine(cfg, policy_dir, tokenizer, replica)


def torch_engine(cfg: RunConfig, policy_dir: str, tokenizer, replica: int):
    import torch

    from learner.rollout.engine.torch_engine import TorchEngine
    from learner.models.loading import load_model

    dtype = getattr(torch, engine_dtype(cfg))
    if cfg.rollout.captured_decode:  # docs/gpu.md: a static KV cache, a CUDA graph per call on a GPU
        from learner.rollout.engine.captured import CapturedEngine

        return CapturedEngine(load_model(policy_dir, dtype).to(rollout_device(cfg, replica)), pad_id=tokenizer.pad_token_id)
    return TorchEngine(load_model(policy_dir, dtype).to(rollout_device(cfg, replica)), pad_id=tokenizer.pad_token_id,
                       continuous_batching=cfg.rollout.continuous_batching, reuse_kv=cfg.rollout.reuse_kv)


# One builder per registered rollout engine (learner.registries.engines.ROLLOUT_ENGINES).
BUILDERS = {"torch": torch_engine, "vllm": vllm_engine}
