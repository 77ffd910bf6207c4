"""Shared-prompt backward: a GRPO group's prompt forwarded and back-propagated once (docs/learner.md).

The G members of a group start with the same prompt tokens p = x_{<P}. Their losses depend on
the prompt only through its keys and values KV(p; θ) at every layer (causal attention: a prompt
token never attends to a completion), so with ℓ_i member i's weighted loss

    ∇_θ Σ_i ℓ_i = Σ_i ∂ℓ_i/∂θ |_KV  +  J_KV(θ)ᵀ · Σ_i ∂ℓ_i/∂KV.

The learner forwards the prompt once per group (with its graph kept), forwards each member's
completion x_{≥P} against those keys/values held as leaf tensors (positions continuing at P,
the prompt slots masked per row in a micro-batch mixing groups), and sums the cotangents
∂ℓ_i/∂KV per group. A member learnt into its group's running sums adds its cotangent to the
prompt's own two sums (S = Σ ∂ℓ_i/∂KV, T' = Σ (r_i − c) ∂ℓ_i/∂KV, c the first reward), exactly
as ``learner.grad.accumulator`` does for the parameters; known-advantage members and the
reward-independent terms (KL, entropy) go to its direct sum. When every member of the group is
learnt (μ, σ known), the prompt is back-propagated once with the cotangent
direct + (T' − (μ − c) S)/(σ + ε), straight into G.

P is one less than the position of the group's first scored token: the completion forward
starts at the last prompt token, whose logits predict the first scored token, so a multi-turn
trajectory shares its first prompt only. A member whose first P tokens differ, or
a group whose prompt would take the kept prompts past ``max_tokens`` (the bound on the prompt
activations held at once), is learnt the ordinary way: exact either way.

Under LoRA (``model.lora``) only the adapters train, so a layer whose keys/values the prompt
reaches through frozen weights alone (layer 0's keys when ``k_proj`` has no adapter) carries no
gradient: its leaf gets no cotangent and the prompt's backward skips it (a prompt none of whose
keys/values depends on an adapter gets no backward at all); G is the adapters' gradient only.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from learner.grad.objectives import compute_dtype

_PLAIN = None  # a group learnt the ordinary way


@dataclass
class PromptKV:
    """One group's shared prompt: its graph-connected KV, the leaves completions attend to, and
    the cotangent sums (direct, S, T')."""

    ids: tuple[int, ...]
    outputs: list[torch.Tensor] = field(default_factory=list)  # k, v of every layer, with the prompt's graph
    leaves: list[torch.Tensor] = field(default_factory=list)  # the same values, detached, requires_grad
    ref: list[torch.Tensor] = field(default_factory=list)  # the reference model's k, v (no graph)
    direct: list[torch.Tensor] | None = None
    s: list[torch.Tensor] | None = None
    t: list[torch.Tensor] | None = None
    shift: float | None = None
    off_shift: bool = False
    close: tuple[float, float] | None = None  # (μ, σ + ε) once the group closed

    def live(self) -> list[torch.Tensor]:
        """The leaves that depend on a trainable parameter (all of them without LoRA), in order:
        the sums and the cotangent are over these."""
        return [t for t in self.leaves if t.requires_grad]

    def live_outputs(self) -> list[torch.Tensor]:
        return [t for t in self.outputs if t.requires_grad]

    def add_direct(self, grads: Sequence[torch.Tensor]) -> None:
        self.direct = _added(self.direct, grads)

    def add_to_group(self, reward: float, grads: Sequence[torch.Tensor]) -> None:
        if self.shift is None:
            self.shift = reward
        self.s = _added(self.s, grads)
        if reward != self.shift:
            self.off_shift = True
            self.t = _added(self.t, grads, reward - self.shift)

    def cotangent(self) -> list[torch.Tensor] | None:
        """direct + (T' − (μ − c) S)/(σ + ε), the order of ``GradAccumulator.close_group``."""
        cot = self.direct
        if self.shift is not None:
            mu, denom = self.close
            if self.off_shift or mu != self.shift:
                t = self.t if self.t is not None else [torch.zeros_like(x) for x in self.s]
                torch._foreach_add_(t, self.s, alpha=-(mu - self.shift))
                torch._foreach_div_(t, denom)
                cot = t if cot is None else torch._foreach_add(cot, t)
        return cot


def _added(acc: list[torch.Tensor] | None, grads: Sequence[torch.Tensor], alpha: float = 1.0) -> list[torch.Tensor]:
    grads = [g.to(compute_dtype(g.dtype)) for g in grads]
    if acc is None:
        return [g * alpha for g in grads] if alpha != 1.0 else [g.clone() for g in grads]
    torch._foreach_add_(acc, grads, alpha=alpha)
    return acc


def prompt_cut(ids: Sequence[int], mask: Sequence[int]) -> int:
    """P: tokens before the position whose logits predict the first scored token (0: none)."""
    first = next((t for t, m in enumerate(mask) if m), None)
    return 0 if first is None else first - 1


def decoder_kv(model: torch.nn.Module, ids: Sequence[int]) -> list[torch.Tensor]:
    """k, v of every layer for ``ids`` (one row), in the grad mode of the caller."""
    device = next(model.parameters()).device
    x = torch.tensor([list(ids)], dtype=torch.long, device=device)
    cache = model.get_decoder()(input_ids=x, use_cache=True).past_key_values
    return [t for layer in cache.layers for t in (layer.keys, layer.values)]


@dataclass
class PastInputs:
    """A micro-batch's prompt keys/values and the model inputs that go with them."""

    cache: DynamicCache
    ref_cache: DynamicCache | None
    prompt_mask: torch.Tensor  # (B, Lmax) 1 on each row's prompt slots
    offsets: torch.Tensor  # (B,) the position of each row's first token


def _stacked(states: list[PromptKV], which: str, index: torch.Tensor, width: int) -> DynamicCache:
    layers = []
    tensors = [getattr(s, which) for s in states]
    for j in range(0, len(tensors[0]), 2):
        k = torch.cat([F.pad(t[j], (0, 0, 0, width - t[j].shape[2])) for t in tensors])[index]
        v = torch.cat([F.pad(t[j + 1], (0, 0, 0, width - t[j + 1].shape[2])) for t in tensors])[index]
        layers.append((k, v))
    return DynamicCache(ddp_cache_data=layers)


class SharedPrompts:
    """The batch's shared prompts: which groups share one, under the ``max_tokens`` bound; their
    KV for a micro-batch; the members learnt; the back-propagation through a finished prompt."""

    def __init__(self, model: torch.nn.Module, ref_model: torch.nn.Module | None, max_tokens: int):
        self.model, self.ref_model, self.max_tokens = model, ref_model, max_tokens
        self.begin({})

    def begin(self, group_sizes: dict[int, int]) -> None:
        self.sizes, self.done = dict(group_sizes), dict.fromkeys(group_sizes, 0)
        self.states: dict[int, PromptKV | None] = {}
        self.kept_tokens = 0
        self.shared_groups = self.shared_rows = 0

    def cut(self, row):
        """``row`` (a ``learner.grad.batching.microbatch.Row``, not imported: that module imports this one)
        without its group's shared prompt (``row.prompt`` = P), or unchanged."""
        if row.group not in self.states:
            p = prompt_cut(row.ids, row.mask)
            fits = p >= 1 and self.kept_tokens + p <= self.max_tokens
            self.states[row.group] = PromptKV(tuple(row.ids[:p])) if fits else _PLAIN
            self.kept_tokens += p if fits else 0
            self.shared_groups += fits
        state = self.states[row.group]
        p = 0 if state is None else len(state.ids)
        if state is None or len(row.ids) <= p or tuple(row.ids[:p]) != state.ids or any(row.mask[:p + 1]):
            return row
        self.shared_rows += 1
        extra = {f: getattr(row, f)[p:] for f in ("teacher", "behavior") if getattr(row, f) is not None}
        return replace(row, ids=row.ids[p:], mask=row.mask[p:], prompt=p, **extra)

    def _state(self, group: int) -> PromptKV:
        state = self.states[group]
        if not state.leaves:  # the prompt's forward, once per group, at its first micro-batch
            state.outputs = decoder_kv(self.model, state.ids)
            # an output without graph (LoRA: frozen weights only) gets a leaf without a cotangent
            state.leaves = [t.detach().requires_grad_(t.requires_grad) for t in state.outputs]
            if self.ref_model is not None:
                with torch.no_grad():
                    state.ref = decoder_kv(self.ref_model, state.ids)
        return state

    def past(self, rows: Sequence, with_ref: bool) -> tuple[PastInputs, list[int]]:
        """The KV of ``rows`` (all cut), padded to the longest prompt; and the groups, in the
        order of ``leaves``."""
        groups = list(dict.fromkeys(r.group for r in rows))
        states = [self._state(g) for g in groups]
        device = states[0].leaves[0].device
        width = max(len(s.ids) for s in states)
        index = torch.tensor([groups.index(r.group) for r in rows], device=device)
        mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for b, r in enumerate(rows):
            mask[b, :r.prompt] = 1
        offsets = torch.tensor([r.prompt for r in rows], device=device)
        ref = _stacked(states, "ref", index, width) if with_ref else None
        return PastInputs(_stacked(states, "leaves", index, width), ref, mask, offsets), groups

    def leaves(self, groups: Sequence[int]) -> list[torch.Tensor]:
        return [t for g in groups for t in self.states[g].live()]

    def add(self, groups: Sequence[int], grads: Sequence[torch.Tensor], reward: float | None = None) -> None:
        """Per group, its slice of ``grads`` (in ``leaves`` order): into the direct sum, or with
        ``reward`` into the running sums."""
        n = len(self.states[groups[0]].live())  # the same layers in every group: one model
        if n == 0:  # no prompt key/value depends on a trainable parameter: nothing to back-propagate
            return
        for k, g in enumerate(groups):
            part = [x if x is not None else torch.zeros_like(leaf)
                    for x, leaf in zip(grads[k * n:(k + 1) * n], self.states[g].live())]
            state = self.states[g]
            state.add_direct(part) if reward is None else state.add_to_group(float(reward), part)

    def learnt(self, group: int, n: int = 1) -> None:
        if group in self.done:
            self.done[group] += n

    def closed(self, group: int, mu: float, denom: float) -> None:
        state = self.states.get(group)
        if state is not None:
            state.close = (mu, denom)

    def release(self, acc, params: Sequence[torch.nn.Parameter], on_close=None) -> float:
        """Back-propagate every prompt whose members are all learnt (and whose group closed if
        it holds sums) into G; returns the seconds spent."""
        spent = 0.0
        for g, state in list(self.states.items()):
            if state is None or self.done[g] < self.sizes[g] or (state.shift is not None and state.close is None):
                continue
            t0 = time.monotonic()
            cot = state.cotangent()
            outputs = state.live_outputs()
            if cot is not None and outputs:
                cot = [c.to(o.dtype) for c, o in zip(cot, outputs)]
                acc.add_direct(list(torch.autograd.grad(outputs, params, grad_outputs=cot, allow_unused=True)))
            self.states[g] = _PLAIN
            self.kept_tokens -= len(state.ids)
            t1 = time.monotonic()
            spent += t1 - t0
            if on_close is not None:
                on_close(t0, t1, g)
        return spent

    def stats(self) -> dict:
        return {"shared_prompt_groups": self.shared_groups, "shared_prompt_rows": self.shared_rows}

    def pending(self) -> list[int]:
        return [g for g, s in self.states.items() if s is not None]
