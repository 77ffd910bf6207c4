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

from contextlib import contextmanager
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


class CollectiveTimeout(RuntimeError):
    """A collective that did not complete within the process group's timeout (``learner.timeout_s``)."""


# NCCL's default on a timeout is its watchdog thread aborting the whole process (no Python
# error, no rank named). Blocking wait makes the collective's own call raise in the calling
# thread after the process group's timeout instead, as gloo's do; both env vars are read when
# the process group is made, so ranks call ``collectives_raise_on_timeout`` before joining it.
NCCL_RAISE_ENV = {"TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}


def collectives_raise_on_timeout() -> None:
    """Make a stuck NCCL collective raise within the process group's timeout instead of aborting
    the process (a value already set in the environment wins)."""
    import os

    for key, value in NCCL_RAISE_ENV.items():
        os.environ.setdefault(key, value)


@contextmanager
def named_collective(what: str):
    """Raise ``CollectiveTimeout`` naming this rank, the collective and ``learner.timeout_s`` when
    ``what`` fails inside: a peer that died, hung or never came (gloo raises on its own; NCCL
    does under ``collectives_raise_on_timeout``)."""
    try:
        yield
    except (RuntimeError, dist.DistError) as exc:
        if isinstance(exc, (DistributedBatchError, CollectiveTimeout)) or not dist.is_initialized():
            raise
        rank = dist.get_rank()
        timeout = _group_timeout_s()
        raise CollectiveTimeout(
            f"rank {rank}: {what} did not complete (learner.timeout_s = {timeout:g} s): a peer rank died, hung or "
            f"never joined; {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc


def _group_timeout_s() -> float:
    try:  # the CPU backend's (gloo) is the one every group has; NCCL's is set from the same timeout
        from torch.distributed.distributed_c10d import _get_default_group

        return _get_default_group()._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except Exception:  # private API: the timeout is only named in the message
        return float("nan")


def failing_ranks(mask: int) -> list[int]:
    return [r for r in range(MAX_RANKS) if mask >> r & 1]


def exchange_counts(local: BatchCounts, rank: int, local_error: str | None = None) -> BatchCounts:
    """Sum ``local`` over all ranks (one all-reduce); raise on every rank if any rank has an open
    group or failed. ``local_error``: this rank's own failure, named first in its message."""
    if rank >= MAX_RANKS:
        raise ValueError(f"learner.world_size: at most {MAX_RANKS} ranks")
    t = local.as_tensor()
    if dist.is_initialized():
        with named_collective("the barrier's count all-reduce"):
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
