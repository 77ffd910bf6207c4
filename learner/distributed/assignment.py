"""Group → owner rank: deterministic and load-balanced, so every rank computes the same map.

Every member of a group is learnt on its owner rank, so a group's running sums and its
statistics μ_k, σ_k never cross ranks before the barrier (docs/distributed.md). The map is a
longest-processing-time greedy over group sizes: groups by size (largest first, then id), each
to the rank with the fewest trajectories so far (ties: the lowest rank). It depends only on the
batch's ``{group: size}``, not on arrival order, so the driver, every rank and the simulator
agree without talking.
"""

from __future__ import annotations

from collections.abc import Mapping


def assign_owners(group_sizes: Mapping[int, int], world_size: int) -> dict[int, int]:
    """``{group: owner rank}`` for one batch's groups."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"learner.world_size: must be an integer >= 1, got {world_size!r}")
    load = [0] * world_size
    owners: dict[int, int] = {}
    for group, size in sorted(group_sizes.items(), key=lambda kv: (-kv[1], kv[0])):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        owners[group] = rank
        load[rank] += size
    return owners
