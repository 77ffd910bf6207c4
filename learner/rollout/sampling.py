"""What an engine call samples with and returns, and the per-row sampler every torch path
shares (``rollout/engine.py``, ``rollout/continuous.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass
class SamplingParams:
    max_new_tokens: int
    stop_token_ids: list[int]
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]  # behavior log-prob of each sampled token
    stopped: bool  # ended on a stop token (False: hit max_new_tokens)


# on_done(i, completion): prompt i's completion is final (called once per prompt)
OnDone = Callable[[int, Completion], None]
# admit(min_rows): (prompt, seed) or (prompt, seed, key) rows to join a running generate call
# (continuous batching), none unless at least min_rows are ready; the k-th row admitted in a call
# is row len(prompts) + k for on_done and in the returned list; key: as generate's ``keys``
Admit = Callable[[int], list[tuple]]



def sample_next(logits: torch.Tensor, temperature: float, top_p: float, u: torch.Tensor) -> torch.Tensor:
    """Sample one token per row of logits (B, V) with temperature and nucleus (top-p) by
    inverse CDF on the uniforms ``u`` (B,): each row's draw depends only on its own
    random stream, so a trajectory samples the same tokens whatever batch it lands in.
    ``temperature`` 0 is greedy: the most likely token (eval, learner.evaluation)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / temperature, dim=-1)  # (B, V)
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    if top_p < 1.0:
        sorted_p = sorted_p * (sorted_p.cumsum(-1) - sorted_p < top_p)  # keeps the top token
    cdf = sorted_p.cumsum(-1)  # (B, V)
    choice = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp(max=cdf.shape[-1] - 1)  # (B, 1)
    return idx.gather(-1, choice).squeeze(-1)
