"""Streaming's deterministic learner: a batch's gradient as a function of its data alone (docs/learner.md).

The adaptive learner's result depends on when trajectories arrive: which rows share a padded
micro-batch (a batched backward of rows {a, b} is not bitwise the backward of a plus that of
b), whether a member enters its group's running sums or is learnt with its final advantage,
and the order of the float additions into the sums. Two streaming runs of one config then
differ in the last bits of their weights, and so does a run resumed from a checkpoint.

``DeterministicLearner`` (``learner.deterministic``) removes each dependence:

- GRPO: a group is learnt when its last member arrives, its members in trajectory-id order
  with their final advantages (μ, σ from the rewards in that order), in micro-batches of that
  group only, planned from those rows alone. No running sums, no idle-time buckets.
- OPD: each scored turn is its own row and its own micro-batch.
- Every micro-batch's gradient goes into G through ``FixedPointSum``: rounded once onto a
  fixed grid and summed in int64, so the order in which groups close does not matter.

What it gives up against the adaptive learner: a group's members are learnt only at its
close (no work on open groups while the learner would idle), and rows of different groups
never share a backward. Sync, async and fully-async learn whole batches in trajectory order
and are deterministic without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from learner.config import AlgorithmConfig
from learner.grad.learners.common import LearnerOptions, OptimizerStep, PhaseCallback
from learner.grad.learners.on_policy import StreamingLearner
from learner.trajectory import ScoredTurn, Trajectory


class DeterministicLearner(StreamingLearner):
    """The on-policy learner of ``learner.deterministic``: the micro-batched learner with K = 0
    (a member waits for its group's close), handed one item at a time so that what shares a
    micro-batch is one group's members (GRPO) or one turn (OPD), over a fixed-point G."""

    def __init__(self, model: torch.nn.Module, algo: AlgorithmConfig, ref_model: torch.nn.Module | None = None,
                 options: LearnerOptions | None = None, optimizer: OptimizerStep | None = None):
        options = replace(options or LearnerOptions(), path="micro-batched", max_open_groups=0, deterministic=True)
        super().__init__(model, algo, ref_model, options, optimizer)

    @property
    def path(self) -> str:
        return "deterministic"

    def begin_batch(self, group_sizes) -> None:
        super().begin_batch(group_sizes)
        self._batch.peak_buffers = self.acc.buffer_count()  # the int64 limbs, as float32 gradients

    def learn(self, items: Sequence[Trajectory | ScoredTurn], on_phase: PhaseCallback | None = None) -> dict:
        """Each item on its own: a trajectory that completes its group learns that group alone,
        a scored turn is learnt alone; returns the summed counts."""
        if not items:
            return super().learn(items, on_phase)
        total: dict = {}
        for item in items:
            for key, n in super().learn([item], on_phase).items():
                total[key] = total.get(key, 0) + n
        return total


def on_policy_learner(model: torch.nn.Module, algo: AlgorithmConfig, ref_model: torch.nn.Module | None = None,
                      options: LearnerOptions | None = None,
                      optimizer: OptimizerStep | None = None) -> StreamingLearner:
    """The learner of sync and streaming for ``options``: deterministic or not."""
    cls = DeterministicLearner if options is not None and options.deterministic else StreamingLearner
    return cls(model, algo, ref_model, options, optimizer)
