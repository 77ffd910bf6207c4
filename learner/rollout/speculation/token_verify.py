"""Keyed verification of drafts (docs/speculation.md): one prefill-shaped forward over each draft
under the new weights recomputes, at every sampled position, the token the keyed sampler
(``rollout/engine/sampling.py``) draws there; the draft is kept up to the first position where the
drafted token differs, and that position takes the new weights' token.

Pure functions of (model, token sequences, streams): no worker state, so the same code checks
itself against direct sampling (``learner/checks/exactness.py``). With ``keep`` the forward's keys
and values of each rejected draft's kept prefix go to the engine's prefix store
(``rollout/engine/prefix_store.py``, ``kv_keep.py``), so the remainder does not prefill its context again
(nor does an unfinished draft kept whole).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from learner.rollout.engine.kv_keep import KeepKV, keep_contexts
from learner.rollout.engine.sampling import Stream, keyed_sample, row_keys

LOGIT_ELEMENTS_PER_FORWARD = 1 << 26  # rows x length x vocab of one verification forward (256 MB of fp32 logits)


@dataclass
class Sampled:
    """A draft as verification sees it: its tokens and, in order, the sampled positions with
    the stream each was drawn from (its turn's seed and its index in the turn)."""

    ids: list[int]
    positions: list[int]
    streams: list[Stream]  # Stream(turn seed, index in the turn) of each position


@dataclass
class Verdict:
    kept: int  # sampled positions kept, from the first (== len(positions): the whole draft)
    logprobs: list[float]  # new weights' log-prob of each kept token, then of ``token``
    token: int | None  # the new weights' token at the first differing position (None: all kept)
    kv_tokens: int = 0  # context tokens whose keys/values went to ``keep``'s store (rollout/engine/kv_keep.py)


@torch.no_grad()
def verify(model: torch.nn.Module, drafts: list[Sampled], temperature: float, top_p: float,
           pad_id: int, share_prefix: bool = True, keep: KeepKV | None = None) -> list[Verdict]:
    """The verdict of each draft under ``model``, in batched forwards (longest first, bounded
    by ``LOGIT_ELEMENTS_PER_FORWARD``). ``share_prefix`` off only to measure what sharing
    saves (``bench/decisions/verify_cost.py``). ``keep``: where the rejected drafts' kept keys/values go
    (``keep.keys[i]``: draft i's key in the store)."""
    verdicts: list[Verdict | None] = [None] * len(drafts)
    order = sorted(range(len(drafts)), key=lambda i: -len(drafts[i].ids))
    vocab = model.get_output_embeddings().weight.shape[0]
    start = 0
    while start < len(order):
        width = len(drafts[order[start]].ids)
        rows = max(1, LOGIT_ELEMENTS_PER_FORWARD // max(1, width * vocab))
        index = order[start:start + rows]
        chunk = [drafts[i] for i in index]
        shared = share_prefix and all(_prefix_length(d) > 0 for d in chunk)
        at, cache, columns = (_shared_prefix_logits if shared else _whole_logits)(model, chunk, pad_id)
        chunk_verdicts = _verdicts(chunk, at, temperature, top_p)
        if keep is not None:
            unfinished = [bool(keep.unfinished and keep.unfinished[i]) for i in index]
            keep_contexts(keep, [keep.keys[i] for i in index], unfinished, chunk, chunk_verdicts, cache, columns)
        for i, v in zip(index, chunk_verdicts):
            verdicts[i] = v
        start += rows
    return verdicts  # type: ignore[return-value]


def _prefix_length(d: Sampled) -> int:
    """Tokens before the one whose logits draw the first sampled token: the first prompt but
    its last token, the same for every draft of a GRPO group."""
    return (d.positions[0] if d.positions else len(d.ids)) - 1


def _whole_logits(model, drafts: list[Sampled], pad_id: int):
    """(N, V): the logits each sampled token was drawn from, from one right-padded forward
    over every draft's whole context; with the forward's cache and where in it row b's first n
    positions are (``columns(b, n)``: position p at column p)."""
    dev = next(model.parameters()).device
    width = max(len(d.ids) for d in drafts)
    ids = torch.full((len(drafts), width), pad_id, dtype=torch.long, device=dev)
    attn = torch.zeros((len(drafts), width), dtype=torch.long, device=dev)
    for b, d in enumerate(drafts):  # right padding: every token keeps its position 0..n-1
        ids[b, :len(d.ids)] = torch.tensor(d.ids)
        attn[b, :len(d.ids)] = 1
    out = model(input_ids=ids, attention_mask=attn, use_cache=True)
    logits = out.logits.float()  # (B, W, V)
    rows = torch.tensor([b for b, d in enumerate(drafts) for _ in d.positions], dtype=torch.long, device=dev)
    cols = torch.tensor([j - 1 for d in drafts for j in d.positions], dtype=torch.long, device=dev)
    return logits[rows, cols], out.past_key_values, lambda b, n: list(range(n))


def _shared_prefix_logits(model, drafts: list[Sampled], pad_id: int):
    """(N, V) as ``_whole_logits``, with each distinct prefix (``_prefix_length``) forwarded
    once and its keys/values given to every draft that shares it (as the engine's prefill
    shares a group's prompt), then each draft's remainder forwarded on that cache; the output
    embedding is applied only at the positions whose logits draw a sampled token. Row b's cache:
    its prefix (c tokens) right-aligned in the first ``lead`` columns, its remainder from column
    ``lead`` on (``columns``)."""
    dev = next(model.parameters()).device
    cuts = [_prefix_length(d) for d in drafts]
    first: dict[tuple[int, ...], int] = {}
    select = torch.tensor([first.setdefault(tuple(d.ids[:c]), len(first)) for d, c in zip(drafts, cuts)], device=dev)
    lead = max(len(p) for p in first)
    pre_ids = torch.full((len(first), lead), pad_id, dtype=torch.long, device=dev)
    pre_attn = torch.zeros((len(first), lead), dtype=torch.long, device=dev)
    for u, p in enumerate(first):  # left padding: every prefix ends at the last column
        pre_ids[u, lead - len(p):] = torch.tensor(p)
        pre_attn[u, lead - len(p):] = 1
    decoder = model.get_decoder()
    cache = decoder(input_ids=pre_ids, attention_mask=pre_attn, position_ids=(pre_attn.cumsum(-1) - 1).clamp(min=0),
                    use_cache=True).past_key_values
    cache.batch_select_indices(select)
    width = max(len(d.ids) - c for d, c in zip(drafts, cuts))
    ids = torch.full((len(drafts), width), pad_id, dtype=torch.long, device=dev)
    attn = torch.zeros((len(drafts), width), dtype=torch.long, device=dev)
    for b, (d, c) in enumerate(zip(drafts, cuts)):  # right padding after the prefix
        ids[b, :len(d.ids) - c] = torch.tensor(d.ids[c:])
        attn[b, :len(d.ids) - c] = 1
    pos = torch.tensor(cuts, device=dev)[:, None] + torch.arange(width, device=dev)
    out = decoder(input_ids=ids, attention_mask=torch.cat([pre_attn[select], attn], 1), position_ids=pos,
                  past_key_values=cache, use_cache=True)
    hidden, cache = out.last_hidden_state, out.past_key_values  # (B, W, H); the cache now holds every column
    rows = torch.tensor([b for b, d in enumerate(drafts) for _ in d.positions], dtype=torch.long, device=dev)
    cols = torch.tensor([j - 1 - c for d, c in zip(drafts, cuts) for j in d.positions], dtype=torch.long, device=dev)

    def columns(b: int, n: int) -> list[int]:
        c = min(cuts[b], n)
        return list(range(lead - cuts[b], lead - cuts[b] + c)) + list(range(lead, lead + n - c))
    return model.get_output_embeddings()(hidden[rows, cols]).float(), cache, columns


def _verdicts(drafts: list[Sampled], at: torch.Tensor, temperature: float, top_p: float) -> list[Verdict]:
    """Redraw every sampled token from ``at`` (its logits, in order) with its own key; each
    draft is kept up to its first redrawn token that differs."""
    dev = at.device
    streams = [s for d in drafts for s in d.streams]
    drawn = keyed_sample(at, temperature, top_p, row_keys(streams, [0] * len(streams), dev)).tolist()
    logp = torch.log_softmax(at, -1).gather(-1, torch.tensor(drawn, device=dev)[:, None]).squeeze(-1).tolist()
    out, n = [], 0
    for d in drafts:
        drafted = [d.ids[j] for j in d.positions]
        mine, mine_logp = drawn[n:n + len(drafted)], logp[n:n + len(drafted)]
        n += len(drafted)
        kept = next((k for k, (a, b) in enumerate(zip(drafted, mine)) if a != b), len(drafted))
        token = mine[kept] if kept < len(drafted) else None
        out.append(Verdict(kept, mine_logp[:kept + (token is not None)], token))
    return out
