"""The reference every exactness check measures against: the full-batch gradient written
straight from the formulas of docs/math.md."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from learner.config import AlgorithmConfig
from learner.grad.learners.common import batch_advantages, check_ref
from learner.grad.batching.microbatch import Row, check_trajectory, forward, per_position
from learner.grad.objectives import agg_weights, batch_normaliser, opd_token_loss, pg_token_loss
from learner.trajectory import Trajectory
from learner.registries.objectives import objective as objective_of


def reference_gradient(
    model: torch.nn.Module, trajs: Sequence[Trajectory], algo: AlgorithmConfig, ref_model: torch.nn.Module | None = None
) -> dict[str, torch.Tensor]:
    """Batch-synchronous on-policy gradient straight from the formulas: one loss over the batch, one backward.

    loss = normaliser · Σ_i Σ_t w_{i,t} (ℓ_{i,t} + aux_{i,t}), ℓ = −A_i ρ (GRPO, advantages up front)
    or (stopgrad logp − logp^T) ρ (OPD); no accumulators, no group sums. Each trajectory's forward
    runs at its own length (no padding), as the learner's does, so that in float32 the comparison
    measures the learner's algebra (running sums, buckets, micro-batches) against the plainest
    form; its padding costs float32 ~3e-7 at most (docs/learner.md). The independent audit in
    ``learner.audit`` uses a padded batch. Does not touch p.grad.
    """
    check_ref(algo, ref_model)
    if not trajs:
        raise ValueError("trajs: a batch needs at least one trajectory")
    adv_by_traj = batch_advantages(trajs, algo.advantage) if objective_of(algo.objective).group_advantage else {}
    traj_losses, n_tokens = [], 0
    for traj in trajs:
        check_trajectory(traj)
        fwd = forward(model, ref_model, algo, [Row(traj.id, traj.group, traj.input_ids, traj.loss_mask)])
        logp, mask = fwd.logp[0], fwd.mask[0]  # (T,) each: one row, nothing padded
        if objective_of(algo.objective).group_advantage:
            terms = pg_token_loss(logp, adv_by_traj[traj.id])
        else:
            teacher = per_position(traj.teacher_logprobs, traj.loss_mask, "teacher_logprobs", f"trajectory {traj.id}")
            terms = opd_token_loss(logp, torch.tensor(teacher, dtype=logp.dtype, device=logp.device))
        if fwd.aux is not None:
            terms = terms + fwd.aux[0]
        traj_losses.append((agg_weights(mask, algo.loss_agg_mode, dtype=logp.dtype) * terms).sum())
        n_tokens += traj.n_scored
    normaliser = batch_normaliser(algo.loss_agg_mode, n_tokens, len(trajs), algo.loss_scale_constant)
    loss = normaliser * torch.stack(traj_losses).sum()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return {n: (torch.zeros_like(p) if g is None else g) for (n, p), g in zip(named, grads)}
