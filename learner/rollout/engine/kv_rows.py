"""Rows of a Hugging Face KV cache joined, dropped and trimmed on the batch dimension, for the
torch engine's continuous batching (``rollout/engine/torch_engine.py``).

A running batch is left-padded: row b's cached keys/values sit at the right end of the time
axis, the padding columns before them have attention mask 0. Two batches of different widths
are joined by left-padding the narrower one with zero keys/values (masked, so they get exactly
zero attention weight); a finished row is dropped by selecting the others; columns that are
padding in every remaining row are cut from the left, so the batch does not keep attending over
the padding of rows that have left it.

Only ``DynamicCache`` with full-attention ``DynamicLayer``s (Llama, Qwen2 and the built-in
policy in the installed transformers 5.x: ``cache.layers[i].keys`` of shape (B, heads, T, dim))
is supported; a sliding-window or quantized layer keeps state that is not a plain (B, ..., T, ...)
tensor, and ``check_joinable`` names it instead of silently mis-joining it.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


def check_joinable(cache) -> None:
    if not isinstance(cache, DynamicCache) or not all(
            type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None])):
        kinds = sorted({type(layer).__name__ for layer in getattr(cache, "layers", [])}) or [type(cache).__name__]
        raise ValueError("rollout.continuous_batching: this model's KV cache (" + ", ".join(kinds) + ") cannot be "
                         "joined row by row (only full-attention DynamicLayer); set rollout.continuous_batching: false")


def _stack_right(a: torch.Tensor, b: torch.Tensor, dim: int) -> torch.Tensor:
    """Rows of ``a`` then ``b`` (batch dim 0), each right-aligned on ``dim`` in one new tensor
    of their wider width, zeros before the narrower: one copy of each, not a pad then a cat."""
    width = max(a.shape[dim], b.shape[dim])
    shape = list(a.shape)
    shape[0], shape[dim] = a.shape[0] + b.shape[0], width
    out = a.new_zeros(shape)
    out[: a.shape[0]].narrow(dim, width - a.shape[dim], a.shape[dim]).copy_(a)
    out[a.shape[0]:].narrow(dim, width - b.shape[dim], b.shape[dim]).copy_(b)
    return out


def join(a: DynamicCache, attn_a: torch.Tensor, b: DynamicCache, attn_b: torch.Tensor):
    """Rows of ``b`` after those of ``a`` (``a`` is updated in place and returned), with the
    joined 2-D attention mask. Widths may differ: the narrower side is left-padded."""
    for la, lb in zip(a.layers, b.layers, strict=True):
        la.keys = _stack_right(la.keys, lb.keys, 2)
        la.values = _stack_right(la.values, lb.values, 2)
    return a, _stack_right(attn_a, attn_b, 1)


def keep_rows(cache: DynamicCache, attn: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Keep only ``rows`` (in that order), then cut the columns that are padding in all of
    them; returns the new mask (the cache is updated in place)."""
    cache.batch_select_indices(rows)
    attn = attn[rows]
    first = int(attn.any(dim=0).long().argmax())  # the first column some row attends to
    if first > 0:
        for layer in cache.layers:
            layer.keys = layer.keys[:, :, first:]
            layer.values = layer.values[:, :, first:]
        attn = attn[:, first:]
    return attn
