"""The tiny random models the exactness checks run on (nothing is downloaded)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from learner.models.loading import widen_norms

VOCAB = 32
# Weight init std of the test models. HF's default 0.02 makes every next-token distribution
# nearly uniform, where the entropy and KL gradients are mostly cancellation (log p + H ≈ 0) and
# any two float32 evaluation orders differ by up to ~1e-6 (measured max 8.9e-7 in 180 cases);
# 0.1 gives peaked distributions, like a trained LM's (max 3.9e-7 in 540 cases).
INIT_STD = 0.1


def tiny_llama(dtype: torch.dtype, seed: int) -> LlamaForCausalLM:
    """A random 2-layer Llama (vocab 32, hidden 16) in ``dtype``, truly float64 when asked, in eval mode."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128, attn_implementation="sdpa",
        initializer_range=INIT_STD,
    )
    return widen_norms(LlamaForCausalLM(config).to(dtype).eval())


def tiny_lora_llama(dtype: torch.dtype, seed: int, target_modules: tuple[str, ...]) -> torch.nn.Module:
    """``tiny_llama`` with LoRA adapters (rank 4, alpha 8) on ``target_modules``, both factors
    random: B starts at 0 in peft (a no-op adapter, where A's gradient vanishes), which would
    leave half of what is checked at zero."""
    from learner.config import LoraSettings
    from learner.lora import with_lora

    model = with_lora(tiny_llama(dtype, seed), LoraSettings(rank=4, alpha=8.0, target_modules=list(target_modules)))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, INIT_STD)
    return model
