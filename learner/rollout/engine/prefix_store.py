"""Keys and values of an agent loop's context, kept when its turn ends and reused when its next
turn joins a generate call (``rollout.reuse_kv``, docs/architecture.md "KV reuse across turns").

A loop's next prompt is its previous prompt, the tokens it just sampled and the tool's answer,
so every key and value of the previous turn is still right for the next one: only the new
tokens need a forward. Without this, a loop that rejoined was prefilled from scratch, its whole
context again (27% of the continuous-batching rollout's time in a profile, docs/bench-limits.md).

What is kept, per loop (the caller's key): the tokens the model was fed (the prompt and the
sampled tokens but the last, which was sampled, not fed) and, per layer, their keys and values,
copied out of the running batch when the row ends. It is used only when those tokens are a
prefix of the new prompt (else the prompt is prefilled as before), once (taken), and only under
the weights it was computed with: ``clear`` on every weight load, and an entry never outlives
``MAX_ENTRIES`` newer ones (a loop whose last turn ended never asks for its entry again).

Speculation's verification forward (``rollout/speculation/token_verify.py``) computes a rejected draft's keys
and values under the new weights; those of its kept prefix come here too (``keep_block``, tagged
``verified``), so its remainder's next turn forwards only the corrected token onwards
(docs/speculation-verify.md). ``held_tokens`` says what such blocks hold, padding included: the worker
counts it against the draft token budget.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import torch

MAX_ENTRIES = 4096
# Contexts shorter than this are not kept: their prefill is cheap, and on the bench workload
# (contexts of 20-60 tokens) the copies cost about what the forward saved (docs/architecture.md).
MIN_TOKENS = 64


@dataclass
class _Block:
    """Rows copied out of a running batch in one go (those that ended at one decode step)."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (rows, heads, W, dim) keys and values
    mask: torch.Tensor  # (rows, W) 1 where the row attends (its context), 0 on padding
    verified: bool = False  # computed by a verification forward (``keep_block``), not a running batch


@dataclass
class Prefix:
    tokens: list[int]  # the tokens whose keys/values these are, in order
    block: _Block
    row: int  # its row in ``block``


class PrefixStore:
    def __init__(self, max_entries: int = MAX_ENTRIES, min_tokens: int = MIN_TOKENS):
        self.max_entries, self.min_tokens = max_entries, min_tokens
        self._entries: dict[Hashable, Prefix] = {}
        self.hits = self.misses = self.tokens_reused = 0

    def __len__(self) -> int:
        return len(self._entries)

    def keep(self, keys: list[Hashable], tokens: list[list[int]], cache, rows: list[int], attn: torch.Tensor) -> None:
        """Copy rows ``rows`` of the running batch (their keys/values and mask ``attn[rows]``) out of
        ``cache``, one copy per layer for all of them; row k's context is ``tokens[k]``, kept under
        ``keys[k]``. A row whose mask does not count one column per token is not kept."""
        idx = torch.tensor(rows, device=attn.device)
        mask = attn.index_select(0, idx)
        self.keep_block(keys, tokens, [(layer.keys.index_select(0, idx), layer.values.index_select(0, idx))
                                       for layer in cache.layers], mask)

    def keep_block(self, keys: list[Hashable], tokens: list[list[int]], layers: list[tuple[torch.Tensor, torch.Tensor]],
                   mask: torch.Tensor, verified: bool = False) -> None:
        """Keep rows already copied out (per layer (rows, heads, W, dim) keys and values, their
        (rows, W) mask): row k's context is ``tokens[k]``, kept under ``keys[k]``; a row whose mask
        does not count one column per token is not kept."""
        block = _Block(layers, mask, verified)
        counts = mask.sum(1).tolist()
        for k, (key, toks) in enumerate(zip(keys, tokens)):
            self._entries.pop(key, None)
            if toks and counts[k] == len(toks):
                self._entries[key] = Prefix(list(toks), block, k)
        while len(self._entries) > self.max_entries:
            self._entries.pop(next(iter(self._entries)))

    def take(self, key: Hashable, prompt: list[int]) -> Prefix | None:
        """The entry of ``key`` if its tokens are a proper prefix of ``prompt`` (removed either way)."""
        entry = self._entries.pop(key, None)
        n = 0 if entry is None else len(entry.tokens)
        if entry is None or n >= len(prompt) or prompt[:n] != entry.tokens:
            self.misses += 1
            return None
        self.hits += 1
        self.tokens_reused += n
        return entry

    def drop(self, key: Hashable) -> Prefix | None:
        """Forget ``key``'s entry (its loop ended or its draft was dropped: nothing asks for it again); returns it."""
        return self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()

    def held_tokens(self) -> int:
        """Columns x rows of the verified blocks some entry still holds (a block is freed only when
        its last entry goes: its rows already taken still count)."""
        blocks = {id(e.block): e.block for e in self._entries.values() if e.block.verified}
        return sum(b.mask.numel() for b in blocks.values())


def past_cache(reuse: list[Prefix | None]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """The kept keys/values of a join's rows as one left-padded past: per layer (B, heads, Wp, dim)
    and the (B, Wp) mask, each row right-aligned (a row without an entry: all padding). Rows
    that came from the same block are copied together, one copy per layer per block."""
    blocks: dict[int, tuple[_Block, list[int], list[int]]] = {}
    for b, entry in enumerate(reuse):
        if entry is not None:
            blk, dest, src = blocks.setdefault(id(entry.block), (entry.block, [], []))
            dest.append(b)
            src.append(entry.row)
    Wp = max(blk.mask.shape[1] for blk, _, _ in blocks.values())
    some = next(iter(blocks.values()))[0]
    B, mask = len(reuse), some.mask.new_zeros((len(reuse), Wp))
    layers = [(k.new_zeros((B, k.shape[1], Wp, k.shape[3])), v.new_zeros((B, v.shape[1], Wp, v.shape[3])))
              for k, v in some.layers]
    for blk, dest, src in blocks.values():
        d, s, W = torch.tensor(dest), torch.tensor(src), blk.mask.shape[1]
        mask[d, Wp - W:] = blk.mask[s]
        for (keys, values), (bk, bv) in zip(layers, blk.layers):
            keys[d, :, Wp - W:] = bk[s]
            values[d, :, Wp - W:] = bv[s]
    return layers, mask
