"""One data-parallel streaming step on the cluster's learner ranks, checked against the
single-process gradient: ``streaming_step`` runs inside every learner rank's actor (after
``ClusterRun.join_process_group``); rank 0 returns the comparison.

The step is ``check-exactness``'s (``learner.checks.distributed_exactness``): the same seeded batch on
every rank, each rank streaming the groups it owns in its own shuffled order, the barrier's
counts, the torch engine's gradient all-reduce and clipped AdamW step (lr 0); rank 0 compares
the reduced gradient with ``reference_gradient`` of the whole batch in one process. float32, as
on a GPU: tolerance 1e-6 relative.
"""

from __future__ import annotations

from dataclasses import dataclass
from learner.registries.objectives import objective as objective_of


def _float32_setup():
    import torch

    from learner.checks.distributed_exactness import EngineSetup

    @dataclass(frozen=True)
    class TorchFloat32(EngineSetup):
        @property
        def dtype(self) -> torch.dtype:
            return torch.float32

    return TorchFloat32("torch")


def streaming_step(seed: int = 0, objective: str = "grpo", mode: str = "token-mean") -> dict | None:
    """Run one case on this rank (its process group joined); rank 0 returns the result row
    (``rel_error``, ``passed``, the groups and trajectories per rank), the others None."""
    import torch
    import torch.distributed as dist

    from learner.distributed.engines import make_learner_engine
    from learner.checks.distributed_exactness import DistCase, _run_case, exactness_model
    from learner.checks.exactness import tiny_llama

    rank, world = dist.get_rank(), dist.get_world_size()
    setup = _float32_setup()
    model = exactness_model(torch.float32, seed).train()
    ref_model = tiny_llama(torch.float32, seed + 1)
    engine = make_learner_engine("torch", model, lr=0.0, weight_decay=0.0, grad_clip=1.0)
    std = "unbiased" if objective_of(objective).group_advantage else "none"
    return _run_case(rank, world, setup, DistCase(objective, mode, std), seed, model, ref_model, engine)
