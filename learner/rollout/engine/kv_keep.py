"""A rejected draft's keys/values, kept from its verification forward for its remainder
(docs/speculation-verify.md, "Verification's keys/values for the remainder").

Verification (``rollout/speculation/token_verify.py``) forwards every draft's whole context under the new
weights. A rejected draft goes on from its first differing position j: its next prompt is its
first j tokens, the new weights' token there, and whatever follows. The keys/values of those j
tokens are exactly what that forward computed (a row's forward does not depend on the others),
so they go to the engine's prefix store (``PrefixStore.keep_block``) under the loop's key, and the
remainder's next generate forwards only what follows them (``continuous._prefill_after``), as a
loop's next turn does after its last turn's keys/values were kept. Position j itself holds the
drafted token, not the new one: it is not kept. A draft kept whole that has not finished (cut
mid-turn, or its tool's answer comes next) goes on too: all its context but the last token
(fed with its next turn) is kept the same way.

The rows are gathered out of the forward's cache into one block, each row right-aligned (its
j columns last, the rest masked): in the shared-prefix forward a row's prompt and remainder are
two runs of columns with padding between, and the block must not carry that padding into the
batch the remainder joins. Memory: the store's verified blocks hold at most ``KeepKV.max_tokens``
columns x rows (padding included; the worker passes what the draft token budget leaves), rows
kept shortest first while they fit; rows shorter than the store's ``min_tokens`` are not kept
(their prefill is cheap, the same rule as a turn's). Entries go at the loop's next generate
(taken), when the loop ends (``worker.forget_kv``) and at every weight load (``PrefixStore.clear``).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Callable

import torch

from learner.rollout.engine.prefix_store import PrefixStore


@dataclass
class KeepKV:
    store: PrefixStore
    keys: list[Hashable]  # per draft given to ``verify``: its loop's key in the store
    max_tokens: int  # the store's verified blocks hold at most this many columns x rows
    # per draft: it goes on if kept whole (it has not finished: cut mid-turn, or a tool call's answer
    # next); then its whole context but the last token is kept (that token is fed with the next turn)
    unfinished: list[bool] | None = None


def keep_contexts(keep: KeepKV, keys: list[Hashable], unfinished: list[bool], drafts: list, verdicts: list, cache,
                  columns: Callable[[int, int], list[int]]) -> None:
    """Keep, of one verification forward (``cache``: its rows are ``drafts``; ``columns(b, n)``:
    the cache columns of row b's first n positions), each rejected draft's kept context (and an
    unfinished kept-whole draft's, ``KeepKV.unfinished``: ``unfinished[b]`` for row b); sets each
    kept verdict's ``kv_tokens``."""
    store = keep.store
    lengths = [d.positions[v.kept] if v.token is not None else len(d.ids) - 1 if unfinished[b] else 0
               for b, (d, v) in enumerate(zip(drafts, verdicts))]
    cand = sorted((n, b) for b, n in enumerate(lengths) if n >= max(store.min_tokens, 1))
    room, n = keep.max_tokens - store.held_tokens(), len(cand)
    while n and n * cand[n - 1][0] > room:  # (shortest first: the block is n rows x the longest of them)
        n -= 1
    if not n:
        return
    cand = cand[:n]
    width, dev = cand[-1][0], cache.layers[0].keys.device
    # right-aligned: row k's context ends at the last column (its padding gathers column 0, masked)
    index = torch.tensor([[0] * (width - length) + columns(b, length) for length, b in cand], device=dev)
    mask = torch.tensor([[0] * (width - length) + [1] * length for length, _ in cand], device=dev)
    rows = torch.tensor([b for _, b in cand], device=dev)
    layers = []
    for layer in cache.layers:
        layers.append(tuple(t.index_select(0, rows).gather(2, index[:, None, :, None].expand(n, t.shape[1], width, t.shape[3]))
                            for t in (layer.keys, layer.values)))
    store.keep_block([keys[b] for _, b in cand], [list(drafts[b].ids[:length]) for length, b in cand], layers, mask,
                     verified=True)
    for length, b in cand:
        verdicts[b].kv_tokens = length
