"""The off-policy learner (schedules ``async`` and ``fully-async``): the whole batch at once, in
micro-batches, clipped PPO against the behaviour log-probs (docs/learner.md).

Through the ``Learner`` protocol it keeps what ``learn`` hands it and trains it in
``finish_batch`` (its GRPO advantages and its normaliser are over the whole batch);
``train_batch(trajs)`` is that one pass on its own."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from learner.config import AlgorithmConfig
from learner.grad.learners.common import (
    LearnerOptions,
    InProcessLearner,
    LogprobLedger,
    OptimizerStep,
    PhaseCallback,
    batch_advantages,
    check_ref,
    memory_stats,
    padding_stats,
    report_micro_batch,
    trainable,
)
from learner.grad.batching.microbatch import forward, grads_of, off_policy_loss, off_policy_row, plan_micro_batches
from learner.grad.objectives import batch_normaliser
from learner.grad.learners.on_policy import _Batch
from learner.trajectory import ScoredTurn, Trajectory
from learner.registries.objectives import objective as objective_of


class OffPolicyLearner(InProcessLearner):
    """One optimizer step per batch of (possibly stale) trajectories: clipped PPO against behavior log-probs.

    GRPO: A_i from each group's members in the batch. OPD: per-token A_t = log π_T − log π_b.
    Same aggregation weights and batch normalisers as the on-policy learner; micro-batched
    under the token budget (``per-trajectory``: one trajectory per backward).
    """

    def __init__(self, model: torch.nn.Module, algo: AlgorithmConfig, ref_model: torch.nn.Module | None = None,
                 options: LearnerOptions | None = None, optimizer: OptimizerStep | None = None):
        check_ref(algo, ref_model)
        self.model, self.algo, self.ref_model, self.optimizer = model, algo, ref_model, optimizer
        self.options = options or LearnerOptions(path="micro-batched")
        self.acc = self.options.accumulator(trainable(model))
        self.logprobs = LogprobLedger()
        self._held: list[Trajectory] | None = None  # the batch handed over so far

    @property
    def path(self) -> str:
        return self.options.path

    def begin_batch(self, group_sizes: Mapping[int, int]) -> None:
        if self._held is not None:
            raise RuntimeError("begin_batch: the previous batch was not finished (call finish_batch first)")
        self._held = []

    def learn(self, items: Sequence[Trajectory | ScoredTurn], on_phase: PhaseCallback | None = None) -> dict:
        """Keep the trajectories for the batch's one pass (``finish_batch``)."""
        if self._held is None:
            raise RuntimeError("learn: call begin_batch first")
        for item in items:
            if isinstance(item, ScoredTurn):
                raise ValueError(f"turn {item.turn} of trajectory {item.traj}: the off-policy learner trains "
                                 "whole trajectories")
        self._held += items
        return {}

    def idle_work(self, on_phase: PhaseCallback | None = None) -> bool:
        return False  # nothing is learnt before the whole batch is in

    def finish_batch(self, on_phase: PhaseCallback | None = None) -> dict:
        """Train the batch handed over, in the order handed over (it reaches the float sums)."""
        if self._held is None:
            raise RuntimeError("finish_batch: call begin_batch first")
        trajs, self._held = self._held, None
        return self.train_batch(trajs, on_phase)


    def train_batch(self, trajs: Sequence[Trajectory], on_phase: PhaseCallback | None = None) -> dict:
        if not trajs:
            raise ValueError("trajs: a batch needs at least one trajectory")
        algo = self.algo
        adv_by_traj = batch_advantages(trajs, algo.advantage) if objective_of(algo.objective).group_advantage else {}
        for p in self.acc.params:
            p.grad = None
        rows, skipped = [], 0
        no_aux = algo.kl_coef == 0 and algo.entropy_coef == 0
        for traj in trajs:
            row = off_policy_row(traj, algo.objective)
            if objective_of(algo.objective).group_advantage:
                row.adv = adv_by_traj[traj.id]
                if row.adv == 0.0 and no_aux:  # −min(ρ·0, clip(ρ)·0) = 0: exactly no gradient
                    skipped += 1
                    self.logprobs.skip(traj.id)
                    continue
            rows.append(row)
        n_tokens, n_clipped = sum(t.n_scored for t in trajs), 0
        state = _Batch(group_sizes={}, planner=None)  # counters only
        for part in plan_micro_batches(rows, self.options.budget, self.options.pack_rows):
            t0 = time.monotonic()
            fwd = forward(self.model, self.ref_model, algo, part, part.line_width, stats=True)
            for b, row in enumerate(part):
                self.logprobs.keep(row.traj, fwd.row_logp(b))
            loss, clipped = off_policy_loss(fwd, algo.objective, algo.clip_ratio)
            state.tally.add(fwd, loss if fwd.aux is None else loss - (fwd.w * fwd.aux).sum())
            self.acc.add_direct(grads_of(loss, self.acc.params))
            n_clipped += clipped
            grid = fwd.layout
            del fwd, loss
            report_micro_batch(state, part, grid, t0, time.monotonic(), on_phase)
        normaliser = batch_normaliser(algo.loss_agg_mode, n_tokens, len(trajs), algo.loss_scale_constant)
        self.acc.finalize(normaliser)
        return {
            "n_tokens": n_tokens, "n_traj": len(trajs), "normaliser": normaliser,
            "clip_frac": n_clipped / max(n_tokens, 1), "backward_s": state.backward_s,
            "skipped_trajectories": skipped, "micro_batches": state.micro_batches, "rows": state.rows,
            **memory_stats(self.acc, 1), "learner": self.path, **padding_stats(state),
            **state.tally.stats(normaliser),
        }
