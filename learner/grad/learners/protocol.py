"""What the driver loop asks of a learner, whichever schedule and process layout it serves
(docs/learner.md, docs/architecture.md "Driver seams").

One batch, one optimizer step:

    learner.begin_batch({group_id: group_size, ...})
    learner.learn(items, on_phase)      # everything waiting, any order, any number of calls
    learner.idle_work(on_phase)         # nothing waits: True if it learnt something
    stats = learner.finish_batch(on_phase)   # the batch gradient is complete
    norm = learner.step()               # clip it, one optimizer step, gradients cleared

``StreamingLearner`` and ``DeterministicLearner`` (sync, streaming) learn as items arrive;
``OffPolicyLearner`` (async, fully-async) keeps them and trains the whole batch in
``finish_batch``; ``DataParallelLearner`` routes them to the rank that owns their group and
reduces the ranks' shares in ``step``. Each owns its clipping and its optimizer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from learner.grad.learners.common import LogprobLedger, PhaseCallback
from learner.trajectory import ScoredTurn, Trajectory


class Learner(Protocol):
    logprobs: LogprobLedger  # the learner's own log-probs, read by the barrier's mismatch metric

    @property
    def path(self) -> str:
        """How it batches its work (``learner.path``; ``deterministic``)."""

    @property
    def pids(self) -> list[int]:
        """Process ids of the learner's own processes (data-parallel ranks 1..W−1)."""

    @property
    def ref_model(self) -> torch.nn.Module | None:
        """The frozen KL reference, if any (the audit dump recomputes the KL term against it)."""

    def begin_batch(self, group_sizes: Mapping[int, int]) -> None:
        """Start the batch of these groups; nothing of an earlier batch is left in the gradient."""

    def learn(self, items: Sequence[Trajectory | ScoredTurn], on_phase: PhaseCallback | None = None) -> dict:
        """Take everything waiting; the learner decides when and how to back-propagate it."""

    def idle_work(self, on_phase: PhaseCallback | None = None) -> bool:
        """Nothing waits: run deferred work; True if there was some."""

    def finish_batch(self, on_phase: PhaseCallback | None = None) -> dict:
        """The batch is complete: its gradient (times the batch normaliser) is ready; returns stats."""

    def batch_gradient(self) -> dict[str, torch.Tensor]:
        """The finished batch's gradient by parameter name (the audit dump)."""

    def step(self) -> float:
        """Clip the batch gradient, one optimizer step, gradients cleared; the norm before clipping."""

    def metrics(self, spans: list[dict], t_start: float, t_end: float) -> dict[str, float]:
        """What this learner adds to the step's metrics (per rank for data-parallel ranks)."""

    def close(self) -> None:
        """Release what the learner holds beyond this process (rank processes)."""
