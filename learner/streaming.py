"""Gradient accumulators of streaming GRPO: per-group running sums, group close, barrier (docs/math.md).

For trajectory i of group k the learner back-propagates h_i = ∇ Σ_t w_{i,t}(−ρ_{i,t}) as
soon as r_i is known. The group's contribution Σ_i A_i h_i rearranges into

    (T_k − μ_k S_k)/(σ_k + ε),   S_k = Σ_i h_i,   T_k = Σ_i r_i h_i,

so only the two sums are kept while the group is open. To avoid catastrophic cancellation in
float32 when rewards carry a large common offset (100 + noise), T is kept shifted by
c_k = the reward of the group's first arrival: T'_k = Σ_i (r_i − c_k) h_i, and at close

    G += (T'_k − (μ_k − c_k) S_k)/(σ_k + ε),

which is exactly 0 when all rewards are equal. Reward-independent terms (KL, entropy, OPD
turns) go straight into G. Accumulators are float32 whatever the model dtype (float64 for a
float64 model). Memory: 1 + 2·(open groups) gradient copies.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

from learner.objectives import compute_dtype, group_stats


class OpenGroupError(RuntimeError):
    """The barrier was reached while some groups still wait for trajectories."""


@dataclass
class _GroupSums:
    shift: float  # c_k: reward of the first trajectory that arrived
    s: list[torch.Tensor]  # S_k = Σ h_i, one tensor per parameter
    t: list[torch.Tensor]  # T'_k = Σ (r_i − c_k) h_i
    rewards: list[float] = field(default_factory=list)  # arrival order


class GradAccumulator:
    """Consumes ``p.grad`` after each backward into per-group sums or the global sum G."""

    def __init__(self, params: Sequence[torch.nn.Parameter]):
        self.params = list(params)
        if not self.params:
            raise ValueError("params: the accumulator needs at least one trainable parameter")
        widest = torch.float64 if any(p.dtype == torch.float64 for p in self.params) else torch.float32
        self.dtype = compute_dtype(widest)
        self._global = [torch.zeros_like(p, dtype=self.dtype) for p in self.params]
        self._groups: dict[Hashable, _GroupSums] = {}

    @property
    def open_groups(self) -> list[Hashable]:
        return list(self._groups)

    def buffer_count(self) -> int:
        """Gradient-sized buffers held now: G plus (S_k, T'_k) per open group."""
        return 1 + 2 * len(self._groups)

    def _zeros(self) -> list[torch.Tensor]:
        return [torch.zeros_like(g) for g in self._global]

    def _take_grads(self) -> tuple[list[int], list[torch.Tensor]]:
        """Move p.grad out of the parameters (leaving None); params without a grad contribute 0."""
        indices, grads = [], []
        for i, p in enumerate(self.params):
            if p.grad is not None:
                indices.append(i)
                grads.append(p.grad.to(self.dtype))
                p.grad = None
        return indices, grads

    def open_group(self, group: Hashable) -> None:
        if group in self._groups:
            raise ValueError(f"group: {group!r} is already open")
        self._groups[group] = _GroupSums(shift=float("nan"), s=self._zeros(), t=self._zeros())

    def add_to_group(self, group: Hashable, reward: float) -> None:
        """S_k += h_i, T'_k += (r_i − c_k) h_i with h_i = the current p.grad."""
        sums = self._groups.get(group)
        if sums is None:
            raise ValueError(f"group: {group!r} is not open")
        reward = float(reward)
        if not sums.rewards:
            sums.shift = reward
        sums.rewards.append(reward)
        indices, grads = self._take_grads()
        torch._foreach_add_([sums.s[i] for i in indices], grads)
        if reward != sums.shift:  # (r_i − c_k) = 0 adds nothing to T'
            torch._foreach_add_([sums.t[i] for i in indices], grads, alpha=reward - sums.shift)

    def add_direct(self, scale: float = 1.0) -> None:
        """G += scale · p.grad (reward-independent terms, OPD turns, off-policy losses)."""
        indices, grads = self._take_grads()
        torch._foreach_add_([self._global[i] for i in indices], grads, alpha=scale)

    def close_group(self, group: Hashable, std: str, eps: float) -> tuple[float, float]:
        """G += (T'_k − (μ_k − c_k) S_k)/(σ_k + ε); frees the group's buffers; returns (μ_k, denom)."""
        sums = self._groups.get(group)
        if sums is None:
            raise ValueError(f"group: {group!r} is not open")
        if not sums.rewards:
            raise ValueError(f"group: {group!r} has no trajectory yet")
        mu, denom = group_stats(sums.rewards, std, eps)
        # All-equal rewards: T' = 0 and μ = c exactly, so the group adds exactly nothing.
        if any(r != sums.shift for r in sums.rewards):
            torch._foreach_add_(sums.t, sums.s, alpha=-(mu - sums.shift))
            torch._foreach_div_(sums.t, denom)
            torch._foreach_add_(self._global, sums.t)
        del self._groups[group]
        return mu, denom

    def finalize(self, normaliser: float) -> None:
        """Barrier: p.grad = normaliser · G in the parameter dtype, then G = 0 for the next batch."""
        if self._groups:
            raise OpenGroupError(
                f"finalize: groups still open: {', '.join(map(repr, self._groups))}; "
                "an optimizer step now would drop their gradient"
            )
        if any(p.grad is not None for p in self.params):
            raise RuntimeError("finalize: p.grad holds a gradient no accumulator call consumed")
        for p, g in zip(self.params, self._global):
            p.grad = (g * normaliser).to(p.dtype)
        torch._foreach_zero_(self._global)
