"""The step's loss curves (policy loss, entropy, KL to the reference) from the forwards the
learner ran anyway: detached sums per micro-batch, kept on the model's device and read once at
the barrier (one host sync per step, no extra forward).

Policy loss: the value of the loss whose gradient the barrier applies, normaliser · Σ w·pg.
A micro-batch of known advantages (or OPD / off-policy rows) adds its own value; a running-sum
bucket of an open group was forwarded with coefficient 1 (its A is unknown until the group
closes), so its value waits, per group, and is weighted by A = (r − μ)/(σ + ε) at the close,
which is what the group's sums get (``learner.grad.accumulator``). A trajectory skipped with
A = 0 and no KL/entropy term adds 0 to the loss and has no forward, so its tokens are not in
the entropy / KL means: those are over the scored tokens the learner forwarded (the entropy on
at most ``ENTROPY_POSITIONS`` of them per forward, evenly strided: ``detached_entropy``)."""

from __future__ import annotations

from collections import defaultdict

import torch

from learner.grad.batching.microbatch import Forward


class LossTally:
    """One batch's detached loss sums; ``stats(normaliser)`` at the barrier."""

    def __init__(self) -> None:
        self.pg: torch.Tensor | float = 0.0
        self.entropy: torch.Tensor | float = 0.0
        self.kl: torch.Tensor | float = 0.0
        self.tokens: torch.Tensor | float = 0.0  # positions the entropy was taken at
        self.kl_tokens = 0
        self._open: dict[int, list[tuple[float, torch.Tensor]]] = defaultdict(list)

    def add(self, fwd: Forward, pg: torch.Tensor | None, group: int | None = None,
            reward: float | None = None) -> None:
        """A micro-batch's forward and its policy-loss term ``pg`` (None: leave it out); ``group``
        and ``reward``: a running-sum bucket, whose ``pg`` was taken with coefficient 1."""
        with torch.no_grad():
            scored = sum(r.n_scored for r in fwd.rows)
            if fwd.entropy is not None:
                self.entropy = self.entropy + torch.nansum(fwd.entropy)
                self.tokens = self.tokens + (~fwd.entropy.isnan()).sum()
            if fwd.kl is not None:
                self.kl = self.kl + (fwd.mask * fwd.kl).sum()
                self.kl_tokens += scored
            if pg is None:
                return
            if group is None:
                self.pg = self.pg + pg.detach()
            else:
                self._open[group].append((float(reward), pg.detach()))

    def add_bucket(self, group: int, reward: float, value: torch.Tensor) -> None:
        """A bucket's policy-loss value from a grouped micro-batch (its entropy and KL came with ``add``)."""
        self._open[group].append((float(reward), value.detach()))

    def close(self, group: int, mu: float, denom: float) -> None:
        """An open group closed with its μ and σ + ε: its buckets' values weighted by their A."""
        for reward, value in self._open.pop(group, []):
            self.pg = self.pg + value * ((reward - mu) / denom)

    def stats(self, normaliser: float) -> dict[str, float]:
        """``pg_loss`` (normalised as the gradient is), ``entropy`` and ``kl_ref`` (per scored
        token forwarded; absent when no token was), with the token counts they are means over
        (data-parallel ranks' means combine by them: ``learner.driver.curves``)."""
        out = {"pg_loss": normaliser * float(self.pg)}
        tokens = float(self.tokens)
        if tokens:
            out["entropy"], out["entropy_tokens"] = float(self.entropy) / tokens, tokens
        if self.kl_tokens:
            out["kl_ref"], out["kl_tokens"] = float(self.kl) / self.kl_tokens, float(self.kl_tokens)
        return out
