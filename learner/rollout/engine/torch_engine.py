"""Rollout engines: the ``Engine`` protocol and the torch engine.

An engine samples continuations for a batch of token sequences and reports the behavior
log-prob of every sampled token. Behavior log-probs are those of the model's own
distribution (temperature 1, no top-p), i.e. exactly what the learner recomputes; with
temperature/top-p != 1 sampling is from a modified distribution and the learner's ratio
corrects it in the off-policy schedules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

import torch

from learner.rollout.engine.continuous import generate_continuous
from learner.rollout.engine.prefix_store import PrefixStore
from learner.rollout.engine.step_cost import StepCost
# re-exported: callers import the sampling types from here
from learner.rollout.engine.sampling import (Admit, Completion, OnDone, SamplingParams, Stream, keyed_sample,  # noqa: F401
                                      row_keys, stream_of)


@dataclass
class EngineStats:
    tokens_out: int = 0
    calls: int = 0
    weight_loads: int = 0
    seconds_loading: float = 0.0
    extra: dict = field(default_factory=dict)


def report_all(completions: list[Completion], on_done: OnDone | None) -> list[Completion]:
    """For engines that finish a batch at once: every row is final when the call returns."""
    if on_done is not None:
        for i, c in enumerate(completions):
            on_done(i, c)
    return completions


class Engine(Protocol):
    version: int  # policy version of the weights the engine samples with

    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 seeds: list[int | Stream] | None = None, on_done: OnDone | None = None) -> list[Completion]:
        """``seeds``: one per prompt (an int, or a ``Stream`` that starts at a later position: the
        rest of a turn, for at most max_new_tokens - start tokens); the same (prompt, seed, weights)
        samples the same tokens.
        ``on_done`` is called once per prompt as soon as its completion is final, so a caller
        can act on a finished row (run its tool, verify it, ship the trajectory) while the rest
        of the batch still decodes; engines that finish a batch at once call it on return.
        An engine with ``continuous_batching`` true also takes ``admit`` (``Admit``): called
        between decode steps, the rows it returns join the running call."""
        ...

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None: ...

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """log pi(token_t | tokens_<t) for t >= 1 (entry 0 is 0.0), for mismatch checks."""
        ...

    def close(self) -> None: ...


class Decode(Protocol):
    def step(self, tok: torch.Tensor, done: torch.Tensor, next_pos: torch.Tensor) -> torch.Tensor:
        """Feed each row's token ``tok`` (B,) at ``next_pos`` (B, 1) (a row ``done`` is masked from
        now on); the next logits (B, V), float32."""
        ...


class EagerDecode:
    """One forward per token over a cache that grows by a column per step."""

    def __init__(self, model: torch.nn.Module, cache, attn: torch.Tensor):
        self.model, self.cache, self.attn = model, cache, attn

    def step(self, tok: torch.Tensor, done: torch.Tensor, next_pos: torch.Tensor) -> torch.Tensor:
        self.attn = torch.cat([self.attn, (~done).long()[:, None]], dim=1)
        out = self.model(input_ids=tok[:, None], attention_mask=self.attn, position_ids=next_pos,
                         past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        return out.logits[:, -1].float()


class TorchEngine:
    """Batched sampling on a Hugging Face causal LM with a KV cache.

    Prompts are left-padded into one batch; each step feeds one token per row with the
    cache, so the cost per step is O(batch) regardless of context length.

    ``continuous_batching`` (``rollout.continuous_batching``, docs/architecture.md;
    ``rollout/engine/continuous.py``): rows that ended leave the batch, and rows handed in by the
    caller's ``admit`` hook between decode steps are prefilled and joined to the running
    batch, so an agent loop whose tool answered mid-call starts its next turn within a few
    decode steps instead of when the call's longest row ends. Off: one fixed batch per call,
    as before (kept to measure the difference).
    """

    def __init__(self, model: torch.nn.Module, pad_id: int, share_prefill: bool = True,
                 continuous_batching: bool = True, reuse_kv: bool = False):
        self.model = model.eval()
        self.device = next(model.parameters()).device  # CPU here; a CUDA model samples on its GPU
        self.pad_id = pad_id
        self.share_prefill = share_prefill  # off only to measure what sharing saves (bench/decisions/first_row.py)
        self.continuous_batching = continuous_batching
        # rollout.reuse_kv: a loop's next turn starts from its last turn's keys/values (continuous
        # batching only; an engine sharing a model that changes without load_weights must not)
        self.prefixes = PrefixStore() if reuse_kv and continuous_batching else None
        self.version = 0
        self.stats = EngineStats()
        self.step_cost = StepCost()  # learned from its forwards: where a draft fits (rollout/speculation/drafts.py)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: SamplingParams,
                 seeds: list[int | Stream] | None = None, on_done: OnDone | None = None,
                 admit: Admit | None = None, keys: list | None = None,
                 cut: Callable[[], list[int]] | None = None) -> list[Completion]:
        """``keys``: one per prompt (an agent loop's identity), under which the row's keys/values
        are kept for its next turn (``rollout.reuse_kv``); ignored without the prefix store.
        ``cut`` (continuous batching): rows to end early (``generate_continuous``)."""
        if self.continuous_batching:
            return generate_continuous(self, prompts, params, seeds, on_done, admit, keys, cut)
        if admit is not None:
            raise ValueError("admit: this engine runs with continuous_batching off; it cannot take rows mid-call")
        if not prompts:
            return []
        B, width, dev = len(prompts), max(len(p) for p in prompts), self.device
        ids = torch.full((B, width), self.pad_id, dtype=torch.long, device=dev)
        attn = torch.zeros((B, width), dtype=torch.long, device=dev)
        for b, p in enumerate(prompts):  # left padding keeps every row's last token at -1
            ids[b, width - len(p):] = torch.tensor(p)
            attn[b, width - len(p):] = 1
        pos = (attn.cumsum(-1) - 1).clamp(min=0)
        streams = [stream_of(s) for s in (seeds if seeds is not None else [params.seed + b for b in range(B)])]
        limit = torch.tensor([params.max_new_tokens - s.start for s in streams], device=dev)
        stop = torch.tensor(params.stop_token_ids, dtype=torch.long, device=dev)
        out_tokens: list[list[int]] = [[] for _ in range(B)]
        out_logp: list[list[float]] = [[] for _ in range(B)]
        done = torch.zeros(B, dtype=torch.bool, device=dev)
        stopped = torch.zeros(B, dtype=torch.bool, device=dev)
        cache, logits = self._prefill(prompts, ids, attn, pos)  # cache of B rows, (B, V)
        decode = self._decoder(cache, attn, int(limit.max()))
        next_pos = pos[:, -1:] + 1
        for n in range(int(limit.max())):
            # a row's draw depends on its key (stream, position) and its logits alone
            tok = keyed_sample(logits, params.temperature, params.top_p, row_keys(streams, [n] * B, dev))  # (B,)
            logp = torch.log_softmax(logits, -1).gather(-1, tok[:, None]).squeeze(-1)  # (B,)
            tok_row, logp_row = tok.tolist(), logp.tolist()  # one device read per token step, not 2B
            for b in (~done).nonzero().flatten().tolist():
                out_tokens[b].append(tok_row[b])
                out_logp[b].append(logp_row[b])
            hit = torch.isin(tok, stop) & ~done
            stopped |= hit
            done |= hit | (limit <= n + 1)
            if on_done is not None:  # a stopped row takes no more tokens: its completion is final
                for b in hit.nonzero().flatten().tolist():
                    on_done(b, Completion(out_tokens[b], out_logp[b], True))
            if bool(done.all()):
                break
            tok = torch.where(done, torch.full_like(tok, self.pad_id), tok)
            logits = decode.step(tok, done, next_pos)
            next_pos = next_pos + 1
        self.stats.calls += 1
        self.stats.tokens_out += sum(len(t) for t in out_tokens)
        result = [Completion(t, lp, bool(s)) for t, lp, s in zip(out_tokens, out_logp, stopped.tolist())]
        if on_done is not None:  # rows that ran to max_new_tokens end with the call
            for b in (~stopped).nonzero().flatten().tolist():
                on_done(b, result[b])
        return result

    def _decoder(self, cache, attn: torch.Tensor, steps: int) -> "Decode":
        """The fixed batch's decode step after the prefill (``cache``, ``attn``: the prompts');
        ``steps``: most tokens a row samples. Eager: the growing cache and mask of every forward;
        ``rollout/engine/captured.py``: a static cache and one captured graph."""
        return EagerDecode(self.model, cache, attn)

    def _prefill(self, prompts: list[list[int]], ids: torch.Tensor, attn: torch.Tensor, pos: torch.Tensor):
        """Forward the prompts once per distinct prompt, then give each row its copy of the KV
        cache: a GRPO group's trajectories share their first-turn prompt, so a batch of P
        groups of G prefills P rows, not P*G (prefix sharing, as vLLM's prefix cache and
        SGLang's radix cache do). The forward of a row does not depend on the other rows, so
        every row sees the same cache and logits as if it had been prefilled itself."""
        first: dict[tuple[int, ...], int] = {}
        rows = [first.setdefault(tuple(p), len(first)) for p in prompts]  # row -> distinct prompt
        if len(first) == len(prompts) or not self.share_prefill:
            out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
            return out.past_key_values, out.logits[:, -1].float()
        lead = torch.tensor([rows.index(u) for u in range(len(first))], device=self.device)  # a row per prompt
        out = self.model(input_ids=ids[lead], attention_mask=attn[lead], position_ids=pos[lead], use_cache=True)
        select = torch.tensor(rows, device=self.device)
        cache = out.past_key_values
        cache.batch_select_indices(select)
        self.stats.extra["prefill_rows_shared"] = self.stats.extra.get("prefill_rows_shared", 0) + len(rows) - len(first)
        return cache, out.logits[:, -1].float()[select]

    def load_weights(self, named_tensors: Mapping[str, torch.Tensor], version: int) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, t in named_tensors.items():
                params[name].copy_(t)
        if self.prefixes is not None:
            self.prefixes.clear()  # kept keys/values belong to the weights that computed them
        self.version = version
        self.stats.weight_loads += 1

    @torch.no_grad()
    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        result = []
        for seq in sequences:  # unpadded, one at a time: exact and simple; used off the hot path
            ids = torch.tensor([seq], device=self.device)
            logits = self.model(input_ids=ids).logits.float()[0]  # (T, V)
            lp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
            result.append([0.0] + lp.tolist())
        return result

    def close(self) -> None:
        pass
