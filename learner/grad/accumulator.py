"""Gradient accumulators of streaming GRPO: per-group running sums, group close, barrier (docs/learner.md).

For trajectory i of group k the learner back-propagates h_i = ∇ Σ_t w_{i,t}(−ρ_{i,t}) as
soon as r_i is known. The group's contribution Σ_i A_i h_i rearranges into

    (T_k − μ_k S_k)/(σ_k + ε),   S_k = Σ_i h_i,   T_k = Σ_i r_i h_i,

so only the two sums are kept while the group is open. To avoid catastrophic cancellation in
float32 when rewards carry a large common offset (100 + noise), T is kept shifted by
c_k = the reward of the first trajectory added: T'_k = Σ_i (r_i − c_k) h_i, and at close

    G += (T'_k − (μ_k − c_k) S_k)/(σ_k + ε),

which is exactly 0 when all rewards are equal. μ_k and σ_k are the statistics of the whole
group, so members that never entered the sums (back-propagated after the close with their
known advantage, straight into G) are accounted for by the caller. Several members with the
same reward may enter as one summed gradient (a (group, reward) bucket). Reward-independent
terms (KL, entropy, OPD turns) and known-advantage micro-batches go straight into G.

Accumulators are float32 whatever the model dtype (float64 for a float64 model). Memory:
1 + 2·(open groups) gradient copies; the group sums can live in host memory
(``group_device="cpu"``, page-locked when the model is on a GPU) while G stays beside the model.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from learner.grad.objectives import compute_dtype

# One gradient per trainable parameter, None where the parameter took no gradient.
Grads = Sequence["torch.Tensor | None"]


class OpenGroupError(RuntimeError):
    """The barrier was reached while some groups still wait for trajectories."""


@dataclass
class _GroupSums:
    s: list[torch.Tensor]  # S_k = Σ h_i, one tensor per parameter
    t: list[torch.Tensor]  # T'_k = Σ (r_i − c_k) h_i
    shift: float | None = None  # c_k: reward of the first trajectory added
    any_off_shift: bool = False  # some added reward differs from c_k (else T'_k is exactly 0)


class GradAccumulator:
    """Adds explicit gradients (from ``torch.autograd.grad``) into per-group sums or the global sum G."""

    def __init__(self, params: Sequence[torch.nn.Parameter], group_device: str | torch.device | None = None):
        self.params = list(params)
        if not self.params:
            raise ValueError("params: the accumulator needs at least one trainable parameter")
        widest = torch.float64 if any(p.dtype == torch.float64 for p in self.params) else torch.float32
        self.dtype = compute_dtype(widest)
        self._global = [torch.zeros_like(p, dtype=self.dtype) for p in self.params]
        self.group_device = torch.device(group_device) if group_device is not None else self.params[0].device
        # page-locked host sums make the device<->host copies DMA transfers
        self._pin = self.group_device.type == "cpu" and self.params[0].device.type == "cuda"
        self._groups: dict[Hashable, _GroupSums] = {}

    @property
    def open_groups(self) -> list[Hashable]:
        return list(self._groups)

    def buffer_count(self) -> int:
        """Gradient-sized buffers held now: G plus (S_k, T'_k) per open group."""
        return 1 + 2 * len(self._groups)

    def buffer_bytes(self) -> int:
        """Bytes of one gradient-sized fp32 (fp64) buffer."""
        return sum(g.numel() * g.element_size() for g in self._global)

    def _zeros(self) -> list[torch.Tensor]:
        bufs = [torch.zeros(g.shape, dtype=self.dtype, device=self.group_device) for g in self._global]
        return [b.pin_memory() for b in bufs] if self._pin else bufs

    def _present(self, grads: Grads, where: str) -> tuple[list[int], list[torch.Tensor]]:
        if len(grads) != len(self.params):
            raise ValueError(f"grads: {len(grads)} gradients for {len(self.params)} parameters")
        indices = [i for i, g in enumerate(grads) if g is not None]
        device = self.group_device if where == "group" else self.params[0].device
        return indices, [grads[i].to(device=device, dtype=self.dtype) for i in indices]

    def open_group(self, group: Hashable) -> None:
        if group in self._groups:
            raise ValueError(f"group: {group!r} is already open")
        self._groups[group] = _GroupSums(s=self._zeros(), t=self._zeros())

    def add_to_group(self, group: Hashable, reward: float, grads: Grads) -> None:
        """S_k += h, T'_k += (r − c_k) h, where h is the summed gradient of members sharing reward r."""
        sums = self._groups.get(group)
        if sums is None:
            raise ValueError(f"group: {group!r} is not open")
        reward = float(reward)
        if sums.shift is None:
            sums.shift = reward
        indices, gs = self._present(grads, "group")
        torch._foreach_add_([sums.s[i] for i in indices], gs)
        if reward != sums.shift:  # (r − c_k) = 0 adds nothing to T'
            sums.any_off_shift = True
            torch._foreach_add_([sums.t[i] for i in indices], gs, alpha=reward - sums.shift)

    def add_direct(self, grads: Grads, scale: float = 1.0) -> None:
        """G += scale · grads (known-advantage micro-batches, KL/entropy, OPD turns, off-policy losses)."""
        indices, gs = self._present(grads, "global")
        torch._foreach_add_([self._global[i] for i in indices], gs, alpha=scale)

    def close_group(self, group: Hashable, mu: float, denom: float) -> None:
        """G += (T'_k − (μ_k − c_k) S_k)/denom with the whole group's μ_k and σ_k + ε; frees its buffers."""
        sums = self._groups.pop(group, None)
        if sums is None:
            raise ValueError(f"group: {group!r} is not open")
        if sums.shift is None:
            return  # opened, never added to: contributes nothing
        # All-equal rewards: T' = 0 and μ = c exactly, so the group adds exactly nothing.
        if sums.any_off_shift or mu != sums.shift:
            torch._foreach_add_(sums.t, sums.s, alpha=-(mu - sums.shift))
            torch._foreach_div_(sums.t, denom)
            device = self.params[0].device
            torch._foreach_add_(self._global, [t.to(device) for t in sums.t])

    def reset(self) -> None:
        """Forget every open group and G (a batch abandoned without a step)."""
        self._groups.clear()
        torch._foreach_zero_(self._global)

    def finalize(self, normaliser: float) -> None:
        """Barrier: p.grad = normaliser · G in the parameter dtype, then G = 0 for the next batch."""
        if self._groups:
            raise OpenGroupError(
                f"finalize: groups still open: {', '.join(map(repr, self._groups))}; "
                "an optimizer step now would drop their gradient"
            )
        for p, g in zip(self.params, self._global):
            p.grad = (g * normaliser).to(p.dtype)
        torch._foreach_zero_(self._global)
