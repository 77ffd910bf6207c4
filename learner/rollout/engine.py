"""Rollout engines: the ``Engine`` protocol and the torch engine.

An engine samples continuations for a batch of token sequences and reports the behavior
log-prob of every sampled token. Behavior log-probs are those of the model's own
distribution (temperature 1, no top-p), i.e. exactly what the learner recomputes; with
temperature/top-p != 1 sampling is from a modified distribution and the learner's ratio
corrects it in the off-policy schedules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Protocol

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


@dataclass
class EngineStats:
    tokens_out: int = 0
    calls: int = 0
    weight_loads: int = 0
    seconds_loading: float = 0.0
    extra: dict = field(default_factory=dict)


class Engine(Protocol):
    version: int  # policy version of the weights the engine samples with

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 seeds: list[int] | None = None) -> list[Completion]:
        """``seeds``: one per prompt; the same (prompt, seed, weights) samples the same tokens."""
        ...

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None: ...

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """log pi(token_t | tokens_<t) for t >= 1 (entry 0 is 0.0), for mismatch checks."""
        ...

    def close(self) -> None: ...


def sample_next(logits: torch.Tensor, temperature: float, top_p: float, u: torch.Tensor) -> torch.Tensor:
    """Sample one token per row of logits (B, V) with temperature and nucleus (top-p) by
    inverse CDF on the uniforms ``u`` (B,): each row's draw depends only on its own
    random stream, so a trajectory samples the same tokens whatever batch it lands in."""
    probs = torch.softmax(logits / temperature, dim=-1)  # (B, V)
    sorted_p, idx = probs.sort(dim=-1, descending=True)
    if top_p < 1.0:
        sorted_p = sorted_p * (sorted_p.cumsum(-1) - sorted_p < top_p)  # keeps the top token
    cdf = sorted_p.cumsum(-1)  # (B, V)
    choice = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp(max=cdf.shape[-1] - 1)  # (B, 1)
    return idx.gather(-1, choice).squeeze(-1)


class TorchEngine:
    """Batched sampling on a Hugging Face causal LM with a KV cache.

    Prompts are left-padded into one batch; each step feeds one token per row with the
    cache, so the cost per step is O(batch) regardless of context length.
    """

    def __init__(self, model: torch.nn.Module, pad_id: int):
        self.model = model.eval()
        self.pad_id = pad_id
        self.version = 0
        self.stats = EngineStats()

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 seeds: list[int] | None = None) -> list[Completion]:
        if not prompts:
            return []
        B, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.full((B, width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, width), dtype=torch.long)
        for b, p in enumerate(prompts):  # left padding keeps every row's last token at -1
            ids[b, width - len(p):] = torch.tensor(p)
            attn[b, width - len(p):] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        seeds = seeds if seeds is not None else [params.seed + b for b in range(B)]
        gens = [torch.Generator().manual_seed(s) for s in seeds]
        stop = torch.tensor(params.stop_token_ids, dtype=torch.long)
        out_tokens: list[list[int]] = [[] for _ in range(B)]
        out_logp: list[list[float]] = [[] for _ in range(B)]
        done = torch.zeros(B, dtype=torch.bool)
        stopped = torch.zeros(B, dtype=torch.bool)
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        cache, logits = out.past_key_values, out.logits[:, -1].float()  # (B, V)
        next_pos = pos[:, -1:] + 1
        for _ in range(params.max_new_tokens):
            u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in gens])  # (B,)
            tok = sample_next(logits.double(), params.temperature, params.top_p, u)  # (B,)
            logp = torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)  # (B,)
            for b in (~done).nonzero().flatten().tolist():
                out_tokens[b].append(int(tok[b]))
                out_logp[b].append(float(logp[b]))
            hit = torch.isin(tok, stop) & ~done
            stopped |= hit
            done |= hit
            if bool(done.all()):
                break
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            attn = torch.cat([attn, (~done).long()[:, None]], dim=1)
            out = self.model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos,
                             past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[:, -1].float()
            next_pos = next_pos + 1
        self.stats.calls += 1
        self.stats.tokens_out += sum(len(t) for t in out_tokens)
        return [Completion(t, lp, bool(s)) for t, lp, s in zip(out_tokens, out_logp, stopped.tolist())]

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, t in named_tensors.items():
                params[name].copy_(t)
        self.version = version
        self.stats.weight_loads += 1

    @torch.no_grad()
    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        result = []
        for seq in sequences:  # unpadded, one at a time: exact and simple; used off the hot path
            ids = torch.tensor([seq])
            logits = self.model(input_ids=ids).logits.float()[0]  # (T, V)
            lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
            result.append([0.0] + lp.tolist())
        return result

    def close(self) -> None:
        pass
