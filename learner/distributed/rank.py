"""``RankLearner``: the streaming learner on one rank's groups, then the exact barrier.

    rl = RankLearner(StreamingLearner(model, algo, ref, options), rank, world_size)
    rl.begin_batch({group: size, ...})   # the whole batch; this rank keeps the groups it owns
    rl.learn(items)                      # only items of owned groups (else an error)
    stats = rl.finish_batch()            # own check + one integer all-reduce; p.grad = own share
    engine.reduce(); engine.step()       # learner.distributed.engines

An error while learning does not escape at once: the rank keeps going to the barrier with its
error bit set, so every rank raises there together instead of waiting for it (docs/distributed.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from learner.distributed.assignment import assign_owners
from learner.distributed.barrier_vote import BatchCounts, exchange_counts
from learner.grad.learners.common import PhaseCallback
from learner.grad.learners.on_policy import StreamingLearner
from learner.trajectory import ScoredTurn, Trajectory


class RankLearner:
    def __init__(self, learner: StreamingLearner, rank: int, world_size: int):
        self.learner, self.rank, self.world_size = learner, rank, world_size
        self.owners: dict[int, int] = {}
        self.mine: dict[int, int] = {}
        self._arrived: Counter = Counter()
        self._tokens = 0
        self._trajs: list[Trajectory] = []  # this batch's trajectories, as they arrived
        self.error: str | None = None

    def begin_batch(self, group_sizes: Mapping[int, int]) -> None:
        self.owners = assign_owners(group_sizes, self.world_size)
        self.mine = {g: s for g, s in group_sizes.items() if self.owners[g] == self.rank}
        self._arrived, self._tokens, self.error, self._trajs = Counter(), 0, None, []
        if self.mine:
            self.learner.begin_batch(self.mine)

    def owns(self, group: int) -> bool:
        return self.owners.get(group) == self.rank

    def learn(self, items: Sequence[Trajectory | ScoredTurn], on_phase: PhaseCallback | None = None) -> dict:
        if self.error is not None:
            return {}
        try:
            for item in items:
                if not self.owns(item.group):
                    raise ValueError(f"group {item.group}: owned by rank {self.owners.get(item.group)}, "
                                     f"handed to rank {self.rank}")
            stats = self.learner.learn(items, on_phase)
        except Exception as exc:  # reported at the barrier, on every rank
            self.error = f"{type(exc).__name__}: {exc}".splitlines()[0]
            return {}
        for item in items:
            if isinstance(item, Trajectory):
                self._arrived[item.group] += 1
                self._tokens += len(item.input_ids)
                self._trajs.append(item)
        return stats

    def idle_work(self, on_phase: PhaseCallback | None = None) -> bool:
        if self.error is not None or not self.mine:
            return False
        return self.learner.idle_work(on_phase)

    def local_counts(self) -> tuple[BatchCounts, str | None]:
        """This rank's terms of the barrier's all-reduce and its own failure, if any."""
        open_groups = {g: self._arrived[g] for g, size in self.mine.items() if self._arrived[g] < size}
        scored, trajs = self.learner.batch_counts() if self.mine else (0, 0)
        own = self.error
        if own is None and open_groups:
            own = "groups not complete: " + ", ".join(f"{g} ({n}/{self.mine[g]})" for g, n in open_groups.items())
        counts = BatchCounts(self._tokens, trajs, scored, len(open_groups), (1 << self.rank) if self.error else 0)
        return counts, own

    def finish_batch(self, on_phase: PhaseCallback | None = None) -> dict:
        """The barrier: p.grad = this rank's share × the whole batch's normaliser, or raise on every rank."""
        local, own = self.local_counts()
        try:
            total = exchange_counts(local, self.rank, own)
        except Exception:
            if self.mine:
                self.learner.abandon_batch()  # no step: the next begin_batch starts clean
            raise
        if self.mine:
            stats = self.learner.finish_batch(on_phase, totals=(total.scored_tokens, total.trajectories))
        else:  # a rank with no group this batch adds nothing to the sum
            for p in self.learner.acc.params:
                p.grad = torch.zeros_like(p)
            stats = {"n_tokens": total.scored_tokens, "n_traj": total.trajectories, "rows": 0, "micro_batches": 0,
                     "backward_s": 0.0, "learner": self.learner.path}
        return {**stats, "rank": self.rank, "rank_groups": len(self.mine), "rank_trajectories": local.trajectories,
                "rank_scored_tokens": local.scored_tokens, "rank_tokens": local.tokens, "tokens": total.tokens}

    def own_logprobs(self) -> dict[int, "np.ndarray | None"]:
        """This rank's log-probs of its own trajectories for the barrier's mismatch metric, after
        ``finish_batch`` and before the step (pre-step weights): the learner's own ledger, and a
        chunked recompute (``learner.grad.mismatch.learner_logprobs``) of any trajectory the
        ledger lacks whole; None for one the learner skipped (A = 0). Float64 arrays by
        trajectory id, small (T values each): rank 0 never forwards another rank's trajectory."""
        from learner.grad.mismatch import learner_logprobs

        known = self.learner.logprobs.take()
        missing = [t for t in self._trajs
                   if not (t.id in known and (known[t.id] is None or len(known[t.id]) == len(t.input_ids)))]
        if missing:
            known.update(zip((t.id for t in missing), learner_logprobs(self.learner.model, missing)))
        self._trajs = []
        return {i: None if lp is None else lp.double().cpu().numpy() for i, lp in known.items()}
