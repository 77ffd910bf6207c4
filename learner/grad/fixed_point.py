"""An order-independent gradient sum: fixed point in two int64 limbs (docs/learner.md, "Deterministic mode").

Float addition is not associative, so a float sum of contributions that arrive in a
timing-dependent order (streaming) differs in its last bits from run to run. Integer
addition is associative: each contribution x is rounded once onto a fixed grid and the
integers are summed exactly, so the sum is the same whatever the order.

    y  = x · 2^16                   exact (a power of two)
    hi = round(y)                   |x| ≤ 2^32, so |hi| ≤ 2^48: 2^15 such contributions fit in int64
    lo = round((y − hi) · 2^44)     y − hi is exact (the fractional part), |lo| ≤ 2^43: 2^20 fit

x ≈ hi · 2^-16 + lo · 2^-60: the one rounding is at 2^-61 absolute per contribution and
element (float32 itself rounds at 2^-24 relative, coarser for every |x| > 2^-37; float64's
2^-53 relative is coarser for every |x| > 2^-8). A batch's micro-batches are far fewer than
2^15. At the barrier the limbs become float64 (hi · 2^-16 + lo · 2^-60), are multiplied by the
batch normaliser and cast to the parameter dtype. Memory: 16 bytes per trainable parameter
(four float32 gradient copies) for the one global sum G, whatever the number of open groups.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Grads = Sequence["torch.Tensor | None"]
HI_BITS, LO_BITS = 16, 44
LIMIT = 2.0**32  # the largest |element| of one contribution


class FixedPointSum:
    """G = Σ contributions, exactly, in fixed point; the ``GradAccumulator`` interface without
    group sums (the deterministic learner learns a group only once it is complete)."""

    def __init__(self, params: Sequence[torch.nn.Parameter]):
        self.params = list(params)
        if not self.params:
            raise ValueError("params: the accumulator needs at least one trainable parameter")
        self.names = [f"parameter {i} {tuple(p.shape)}" for i, p in enumerate(self.params)]
        self._hi = [torch.zeros_like(p, dtype=torch.int64) for p in self.params]
        self._lo = [torch.zeros_like(p, dtype=torch.int64) for p in self.params]

    @property
    def open_groups(self) -> list:
        return []  # never any running sums

    def buffer_count(self) -> int:
        """Two int64 limbs: four float32-gradient-sized buffers."""
        return 4

    def buffer_bytes(self) -> int:
        """Bytes of one float32 gradient (``buffer_count`` counts in those)."""
        return sum(p.numel() * 4 for p in self.params)

    def add_direct(self, grads: Grads, scale: float = 1.0) -> None:
        """G += scale · grads, each element rounded once onto the grid (ValueError naming the
        parameter for an element that is not finite or beyond ±2^32)."""
        if len(grads) != len(self.params):
            raise ValueError(f"grads: {len(grads)} gradients for {len(self.params)} parameters")
        for i, g in enumerate(grads):
            if g is None:
                continue
            y = (g if scale == 1.0 else g * scale).detach() * 2.0**HI_BITS
            biggest = float(y.abs().max()) if y.numel() else 0.0
            if not biggest <= LIMIT * 2.0**HI_BITS:
                raise ValueError(f"learner.deterministic: the gradient of {self.names[i]} has an element of "
                                 f"{biggest / 2.0**HI_BITS:.3g}, not a finite number within ±{LIMIT:.3g} "
                                 "(the fixed-point range)")
            hi = torch.round(y)
            self._hi[i] += hi.to(torch.int64)
            self._lo[i] += torch.round((y - hi) * 2.0**LO_BITS).to(torch.int64)

    def value(self, i: int) -> torch.Tensor:
        """Parameter ``i``'s sum as float64."""
        return self._hi[i].double() * 2.0**-HI_BITS + self._lo[i].double() * 2.0**-(HI_BITS + LO_BITS)

    def reset(self) -> None:
        torch._foreach_zero_(self._hi)
        torch._foreach_zero_(self._lo)

    def finalize(self, normaliser: float) -> None:
        """Barrier: p.grad = normaliser · G in the parameter dtype, then G = 0."""
        for i, p in enumerate(self.params):
            p.grad = (self.value(i) * normaliser).to(p.dtype)
        self.reset()
