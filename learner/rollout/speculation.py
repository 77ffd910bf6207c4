"""Keyed verification of drafts (docs/speculation.md): one prefill-shaped forward over each draft
under the new weights recomputes, at every sampled position, the token the keyed sampler
(``rollout/sampling.py``) draws there; the draft is kept up to the first position where the
drafted token differs, and that position takes the new weights' token.

Pure functions of (model, token sequences, streams): no worker state, so the same code checks
itself against direct sampling (``learner/grad/exactness.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from learner.rollout.sampling import Stream, keyed_sample, row_keys

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


@torch.no_grad()
def verify(model: torch.nn.Module, drafts: list[Sampled], temperature: float, top_p: float,
           pad_id: int) -> list[Verdict]:
    """The verdict of each draft under ``model``, in batched forwards (longest first, bounded
    by ``LOGIT_ELEMENTS_PER_FORWARD``)."""
    verdicts: list[Verdict | None] = [None] * len(drafts)
    order = sorted(range(len(drafts)), key=lambda i: -len(drafts[i].ids))
    vocab = model.get_output_embeddings().weight.shape[0]
    start = 0
    while start < len(order):
        width = len(drafts[order[start]].ids)
        rows = max(1, LOGIT_ELEMENTS_PER_FORWARD // max(1, width * vocab))
        chunk = order[start:start + rows]
        for i, v in zip(chunk, _verify_chunk(model, [drafts[i] for i in chunk], temperature, top_p, pad_id)):
            verdicts[i] = v
        start += rows
    return verdicts  # type: ignore[return-value]


def _verify_chunk(model, drafts: list[Sampled], temperature: float, top_p: float, pad_id: int) -> list[Verdict]:
    dev = next(model.parameters()).device
    width = max(len(d.ids) for d in drafts)
    ids = torch.full((len(drafts), width), pad_id, dtype=torch.long, device=dev)
    attn = torch.zeros((len(drafts), width), dtype=torch.long, device=dev)
    for b, d in enumerate(drafts):  # right padding: every token keeps its position 0..n-1
        ids[b, :len(d.ids)] = torch.tensor(d.ids)
        attn[b, :len(d.ids)] = 1
    logits = model(input_ids=ids, attention_mask=attn).logits.float()  # (B, W, V)
    rows = torch.tensor([b for b, d in enumerate(drafts) for _ in d.positions], dtype=torch.long, device=dev)
    cols = torch.tensor([j - 1 for d in drafts for j in d.positions], dtype=torch.long, device=dev)
    at = logits[rows, cols]  # (N, V): the logits each sampled token was drawn from
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
