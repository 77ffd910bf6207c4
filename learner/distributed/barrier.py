"""The barrier's one integer all-reduce (docs/distributed.md).

Each rank first checks itself (no open group, no error while learning), then all ranks sum

    [tokens, trajectories, scored tokens, open groups, error ranks]

in one int64 all-reduce. Every rank then holds the same batch normaliser terms (1/N_tokens,
1/B: a normaliser computed from one rank's share would be the 1/W bug), and an open group or an
error on any rank is seen by every rank, which all raise: none is left waiting in the gradient
reduction for a rank that stopped. ``error ranks`` is Σ 2^rank over failing ranks, so the sum
names them. The collective's timeout is the process group's (``ranks.init_rank``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

MAX_RANKS = 62  # error ranks travel as bits of one int64


class DistributedBatchError(RuntimeError):
    """An open group or an error on some rank: raised on every rank at the barrier."""


@dataclass(frozen=True)
class BatchCounts:
    tokens: int = 0  # every token of the rank's trajectories (prompt and observations included)
    trajectories: int = 0  # B: members of the rank's groups
    scored_tokens: int = 0  # N_tokens: tokens the loss scores (the token-mean normaliser)
    open_groups: int = 0
    error_ranks: int = 0  # Σ 2^rank of ranks that failed while learning this batch

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor([self.tokens, self.trajectories, self.scored_tokens, self.open_groups, self.error_ranks],
                            dtype=torch.int64)

    @classmethod
    def from_tensor(cls, t: torch.Tensor) -> "BatchCounts":
        return cls(*(int(x) for x in t.tolist()))


def failing_ranks(mask: int) -> list[int]:
    return [r for r in range(MAX_RANKS) if mask >> r & 1]


def exchange_counts(local: BatchCounts, rank: int, local_error: str | None = None) -> BatchCounts:
    """Sum ``local`` over all ranks (one all-reduce); raise on every rank if any rank has an open
    group or failed. ``local_error``: this rank's own failure, named first in its message."""
    if rank >= MAX_RANKS:
        raise ValueError(f"learner.world_size: at most {MAX_RANKS} ranks")
    t = local.as_tensor()
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    total = BatchCounts.from_tensor(t)
    if total.open_groups or total.error_ranks:
        parts = []
        if total.open_groups:
            parts.append(f"{total.open_groups} group(s) still open across ranks ({local.open_groups} on rank {rank})")
        if total.error_ranks:
            parts.append(f"rank(s) {', '.join(map(str, failing_ranks(total.error_ranks)))} failed while learning")
        own = f"; rank {rank}: {local_error}" if local_error else ""
        raise DistributedBatchError(f"barrier: {'; '.join(parts)}; no optimizer step taken{own}")
    return total
