"""An exactly equivalent serving layout for Llama checkpoints whose head size vLLM's CPU
attention kernels do not support (the built-in tiny policy has head_dim 16; the CPU
kernels take 32, 64, 80, ...).

Each attention head of size d is zero-padded to size P >= d:

    q' = sqrt(P/d) · [q, 0]    k' = [k, 0]    v' = [v, 0]    o'(x) = o(x[:d])

so q'·k' / sqrt(P) = q·k / sqrt(d) (same scores), the padded value lanes are zero and the
output projection ignores them. RoPE keeps acting on the first d lanes only, with the
frequencies of a d-dimensional rotary embedding (``partial_rotary_factor = d/P`` makes vLLM
build rotary_dim = d, inv_freq_i = base^(-2i/d), neox halves (i, i + d/2) as in HF).
The only numerical difference is the rounding of sqrt(P/d)·W_q in float32 (~1e-7 relative).

``pad_heads`` is applied to the config once (``serving_dir``) and to every weight publish
(``HeadPadding.transform``), so the engine always holds the padded image of the learner's
weights.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

import torch

# vLLM 0.32 CPU_ATTN (vllm/v1/attention/backends/cpu_attn.py get_supported_head_sizes)
CPU_HEAD_SIZES: tuple[int, ...] = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)


@dataclass(frozen=True)
class HeadPadding:
    head_dim: int  # d, the checkpoint's head size
    padded: int  # P, the served head size
    num_heads: int
    num_kv_heads: int

    @property
    def q_scale(self) -> float:
        return math.sqrt(self.padded / self.head_dim)

    def _pad_rows(self, w: torch.Tensor, heads: int, scale: float = 1.0) -> torch.Tensor:
        """(heads*d, in) -> (heads*P, in): each head's d output rows, then P-d zero rows."""
        d, P = self.head_dim, self.padded
        out = w.new_zeros(heads, P, *w.shape[1:])
        out[:, :d] = w.reshape(heads, d, *w.shape[1:]) * scale
        return out.reshape(heads * P, *w.shape[1:])

    def _pad_cols(self, w: torch.Tensor) -> torch.Tensor:
        """o_proj (hidden, heads*d) -> (hidden, heads*P) with zero columns for the padded lanes."""
        d, P, H = self.head_dim, self.padded, self.num_heads
        out = w.new_zeros(w.shape[0], H, P)
        out[:, :, :d] = w.reshape(w.shape[0], H, d)
        return out.reshape(w.shape[0], H * P)

    def transform(self, named: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named tensors -> the same names in the padded layout (other tensors pass through)."""
        for name, w in named.items():
            if name.endswith("self_attn.q_proj.weight") or name.endswith("self_attn.q_proj.bias"):
                yield name, self._pad_rows(w, self.num_heads, self.q_scale)
            elif any(name.endswith(f"self_attn.{p}.{k}") for p in ("k_proj", "v_proj") for k in ("weight", "bias")):
                yield name, self._pad_rows(w, self.num_kv_heads)
            elif name.endswith("self_attn.o_proj.weight"):
                yield name, self._pad_cols(w)
            else:
                yield name, w


def head_padding_for(config: dict, supported: tuple[int, ...] = CPU_HEAD_SIZES) -> HeadPadding | None:
    """The padding a Llama ``config.json`` needs, or None when its head size is served as is."""
    if config.get("model_type") != "llama":
        return None
    heads = config["num_attention_heads"]
    d = config.get("head_dim") or config["hidden_size"] // heads
    if d in supported:
        return None
    rope = config.get("rope_parameters") or {}
    if rope.get("partial_rotary_factor", 1.0) != 1.0 or rope.get("rope_type", "default") != "default":
        raise ValueError(f"model config: head_dim {d} is not served by vLLM on CPU ({supported}) and only "
                         "full default RoPE can be padded; use a supported head size")
    P = min(s for s in supported if s >= d)
    return HeadPadding(d, P, heads, config.get("num_key_value_heads") or heads)


def serving_dir(policy_dir: str | Path, out_dir: str | Path) -> tuple[Path, HeadPadding | None]:
    """The directory vLLM should load: ``policy_dir`` itself, or a padded copy under ``out_dir``.

    The copy holds the padded config, the tokenizer files and padded weights (so vLLM starts
    on the real weights; every publish then overwrites them anyway).
    """
    policy_dir = Path(policy_dir)
    config = json.loads((policy_dir / "config.json").read_text())
    pad = head_padding_for(config)
    if pad is None:
        return policy_dir, None
    from safetensors.torch import load_file, save_file

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for f in policy_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "config.json":
            shutil.copy2(f, out / f.name)
    rope = dict(config.get("rope_parameters") or {"rope_type": "default", "rope_theta": config.get("rope_theta", 10000.0)})
    rope["partial_rotary_factor"] = pad.head_dim / pad.padded
    config.update(head_dim=pad.padded, rope_parameters=rope)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for shard in sorted(policy_dir.glob("*.safetensors")):
        save_file({n: t.contiguous() for n, t in pad.transform(load_file(str(shard)))}, str(out / shard.name),
                  metadata={"format": "pt"})
    return out, pad
