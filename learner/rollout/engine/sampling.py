"""What an engine call samples with and returns, and the keyed sampler every torch path
shares (``rollout/engine/torch_engine.py``, ``rollout/engine/continuous.py``, ``rollout/speculation/token_verify.py``).

The sampler is a Gumbel-max (exponential race) whose noise is a counter-based hash of
(stream, position in the stream, token): the token a row draws at a position is a function
of that position's logits and its key alone, so it does not depend on the batch, on when the
row joined, or on whether the logits came from a decode step or a prefill forward, and it can
be recomputed later from logits alone (the verification of a draft, docs/speculation.md).
docs/math.md, "Sampling", says why the race samples softmax(logits / T) restricted to top-p.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

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


class Stream(NamedTuple):
    """A row's random stream: ``seed`` (a turn's), and the position its first sampled token has
    in it (0 for a turn that starts; n for a turn continued after n tokens already kept)."""

    seed: int
    start: int = 0


def stream_of(seed: "int | Stream") -> Stream:
    return seed if isinstance(seed, Stream) else Stream(seed, 0)


# on_done(i, completion): prompt i's completion is final (called once per prompt)
OnDone = Callable[[int, Completion], None]
# admit(min_rows): (prompt, seed) or (prompt, seed, key) rows to join a running generate call
# (continuous batching), none unless at least min_rows are ready; seed: an int or a Stream; the
# k-th row admitted in a call is row len(prompts) + k for on_done and in the returned list;
# key: as generate's ``keys``
Admit = Callable[[int], list[tuple]]

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_C1 = 0xBF58476D1CE4E5B9 - (1 << 64)  # splitmix64's multipliers as signed int64
_C2 = 0x94D049BB133111EB - (1 << 64)


def _signed(x: int) -> int:
    x &= _MASK64
    return x - (1 << 64) if x >> 63 else x


def _srl(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 (torch's ``>>`` is arithmetic)."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (multiplication wraps mod 2^64, exact on every device)."""
    x = x ^ _srl(x, 30)
    x = x * _C1
    x = x ^ _srl(x, 27)
    x = x * _C2
    return x ^ _srl(x, 31)


def row_keys(streams: list[Stream], offsets: list[int], device) -> torch.Tensor:
    """One 64-bit key per row: its stream's seed, then the position ``start + offset`` in it."""
    seeds = torch.tensor([_signed(s.seed) for s in streams], dtype=torch.int64, device=device)
    at = torch.tensor([s.start + o for s, o in zip(streams, offsets, strict=True)], dtype=torch.int64, device=device)
    return _mix(_mix(seeds) + at * _signed(_GOLDEN))


def race_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """Gumbel noise (B, V) float64: one independent uniform per (row key, token), -log(-log u)."""
    tokens = torch.arange(1, vocab + 1, dtype=torch.int64, device=keys.device) * _signed(_GOLDEN)
    h = _mix(_mix(keys[:, None] ^ tokens[None, :]))
    u = (_srl(h, 11).double() + 0.5) * (1.0 / (1 << 53))  # in (0, 1)
    return -torch.log(-torch.log(u))


def keyed_sample(logits: torch.Tensor, temperature: float, top_p: float, keys: torch.Tensor) -> torch.Tensor:
    """One token per row of ``logits`` (B, V): argmax over the nucleus of logits / T + Gumbel
    noise keyed by ``keys`` (``row_keys``). ``temperature`` 0 is greedy (eval, learner.evaluation)."""
    if temperature == 0.0:
        return logits.argmax(dim=-1)
    scores = logits.double() / temperature
    if top_p < 1.0:
        probs = torch.softmax(scores, dim=-1)
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p >= top_p  # keeps the top token
        scores = scores.masked_fill(torch.zeros_like(outside).scatter(-1, idx, outside), float("-inf"))
    return (scores + race_noise(keys, logits.shape[-1])).argmax(dim=-1)
