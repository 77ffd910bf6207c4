"""The head-padded serving layout the vLLM engine publishes into (no vLLM needed): padding a
Llama attention head from d to P lanes leaves the attention output unchanged."""

from __future__ import annotations

import json
import math

import pytest
import torch

from learner.models.loading import resolve_model_dir
from learner.rollout.vllm_backend.vllm_layout import HeadPadding, head_padding_for, serving_dir


def rope(x: torch.Tensor, rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    """Neox-style RoPE on the first ``rotary_dim`` lanes of x (T, H, D), as vLLM and HF Llama."""
    T = x.shape[0]
    inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)  # (r/2,)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq  # (T, r/2)
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]  # (T, 1, r/2)
    x1, x2 = x[..., :rotary_dim // 2], x[..., rotary_dim // 2:rotary_dim]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin, x[..., rotary_dim:]], dim=-1)


def attention(x: torch.Tensor, w: dict[str, torch.Tensor], heads: int, head_dim: int, rotary_dim: int) -> torch.Tensor:
    """Causal multi-head attention of x (T, hidden) with softmax scale 1/sqrt(head_dim)."""
    T = x.shape[0]
    q = rope((x @ w["q_proj.weight"].T).view(T, heads, head_dim), rotary_dim)  # (T, H, D)
    k = rope((x @ w["k_proj.weight"].T).view(T, heads, head_dim), rotary_dim)
    v = (x @ w["v_proj.weight"].T).view(T, heads, head_dim)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(head_dim)  # (H, T, T)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    out = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, heads * head_dim)
    return out @ w["o_proj.weight"].T  # (T, hidden)


def test_it_pads_heads_without_changing_the_attention_output():
    torch.manual_seed(0)
    hidden, heads, d = 64, 4, 16
    w = {f"{p}.weight": torch.randn(heads * d, hidden, dtype=torch.float64) / 8 for p in ("q_proj", "k_proj", "v_proj")}
    w["o_proj.weight"] = torch.randn(hidden, heads * d, dtype=torch.float64) / 8
    pad = HeadPadding(head_dim=d, padded=32, num_heads=heads, num_kv_heads=heads)
    named = {f"model.layers.0.self_attn.{n}": t for n, t in w.items()}
    padded = {n.removeprefix("model.layers.0.self_attn."): t for n, t in pad.transform(named)}
    assert padded["q_proj.weight"].shape == (heads * 32, hidden) and padded["o_proj.weight"].shape == (hidden, heads * 32)
    x = torch.randn(12, hidden, dtype=torch.float64)
    # served: P-lane heads, softmax scale 1/sqrt(P), RoPE on the first d lanes with d's frequencies
    served = attention(x, padded, heads, 32, rotary_dim=d)
    assert torch.allclose(served, attention(x, w, heads, d, rotary_dim=d), atol=1e-12)


def test_it_serves_supported_head_sizes_as_they_are():
    config = {"model_type": "llama", "num_attention_heads": 4, "hidden_size": 256}
    assert head_padding_for(config) is None


def test_it_refuses_to_pad_a_scaled_rope():
    config = {"model_type": "llama", "num_attention_heads": 4, "hidden_size": 64,
              "rope_parameters": {"rope_type": "llama3", "rope_theta": 10000.0}}
    with pytest.raises(ValueError, match="head_dim 16"):
        head_padding_for(config)


def test_serving_dir_holds_the_padded_image_of_the_policy(tmp_path):
    from safetensors.torch import load_file

    policy = resolve_model_dir("builtin:tiny")
    out, pad = serving_dir(policy, tmp_path)
    config = json.loads((out / "config.json").read_text())
    assert config["head_dim"] == pad.padded == 32
    assert config["rope_parameters"]["partial_rotary_factor"] == 0.5
    original = load_file(str(policy / "model.safetensors"))
    served = load_file(str(out / "model.safetensors"))
    assert served.keys() == original.keys()
    for name, t in pad.transform(original):
        assert torch.equal(served[name], t)
    assert (out / "tokenizer.json").is_file()
