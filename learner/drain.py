"""What the on-policy GRPO learner learns next: the drain policy (docs/learner.md).

Pure bookkeeping, no tensors. The learner hands ``DrainPlanner.drain`` every trajectory that
is waiting and executes the tasks it returns, in order:

    Close(g, μ, d)        group g is complete: fold its running sums into G
    Known(g, trajs, A)    members of a complete group, their advantages known: straight into G
    Bucket(g, r, trajs)   members of an open group that share reward r: one summed gradient
                          into g's running sums (equal rewards give equal advantages)

Policy ``finished-groups-first``:
  1. every group that is now complete is closed and its not-yet-learnt members are learnt
     with their final advantages (all in one pool of micro-batches);
  2. then open groups, oldest first: a group holding running sums learns its waiting members
     by (group, reward) bucket; a group without sums gets them if fewer than K groups hold
     sums, otherwise its members wait for the group's close (step 1 learns them then);
  3. zero-variance deferral (``defer_equal``): a group whose rewards so far are all equal is
     not given sums yet: if it closes all-equal, A = 0 for every member and its policy-gradient
     backward is skipped outright. Deferral costs overlap only if the learner would otherwise
     idle, so ``idle`` (called when nothing else is waiting) hands such a group its sums and
     learns its members speculatively: at worst it spends time that was idle anyway.

``per-trajectory`` (the earlier learner) is the same policy with one trajectory per bucket, in
arrival order, and no deferral. Every path is exact: a member is learnt once, either into
running sums (folded with the whole group's μ, σ at close) or with its final advantage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from learner.config import AdvantageConfig
from learner.objectives import group_stats
from learner.trajectory import Trajectory


@dataclass
class Close:
    group: int
    mu: float
    denom: float


@dataclass
class Known:
    group: int
    trajs: list[Trajectory]
    advantages: list[float]


@dataclass
class Bucket:
    group: int
    reward: float
    trajs: list[Trajectory]
    speculative: bool = False  # a zero-variance candidate learnt in idle time


Task = Close | Known | Bucket


@dataclass
class _Group:
    size: int
    arrived: list[Trajectory] = field(default_factory=list)
    waiting: list[Trajectory] = field(default_factory=list)  # arrived, not learnt yet
    has_sums: bool = False
    closed: bool = False

    def all_equal_so_far(self) -> bool:
        return len({t.reward for t in self.arrived}) < 2


class DrainPlanner:
    """Group bookkeeping of one batch and the ``finished-groups-first`` policy."""

    name = "finished-groups-first"

    def __init__(self, group_sizes: Mapping[int, int], adv: AdvantageConfig, max_open_groups: int | None,
                 bucket_by_reward: bool, defer_equal: bool):
        self.groups = {g: _Group(size) for g, size in group_sizes.items()}
        self.adv = adv
        self.cap = max_open_groups
        self.bucket_by_reward, self.defer_equal = bucket_by_reward, defer_equal
        self.order: list[int] = []  # groups in order of first arrival
        self.seen: set[int] = set()

    @property
    def open_sums(self) -> int:
        return sum(g.has_sums for g in self.groups.values())

    def _free(self) -> bool:
        return self.cap is None or self.open_sums < self.cap

    def admit(self, traj: Trajectory) -> None:
        """Record an arrival; ValueError naming the trajectory if it does not belong here."""
        owner = f"trajectory {traj.id}"
        group = self.groups.get(traj.group)
        if group is None:
            raise ValueError(f"{owner}: group {traj.group} is not in this batch's group_sizes")
        if traj.id in self.seen:
            raise ValueError(f"{owner}: already fed in this batch")
        if len(group.arrived) >= group.size:
            raise ValueError(f"{owner}: group {traj.group} already has its {group.size} trajectories")
        self.seen.add(traj.id)
        if not group.arrived:
            self.order.append(traj.group)
        group.arrived.append(traj)
        group.waiting.append(traj)

    def drain(self, trajs: Sequence[Trajectory]) -> list[Task]:
        """Admit ``trajs`` (everything waiting) and plan what to learn now."""
        for traj in trajs:
            self.admit(traj)
        tasks: list[Task] = []
        for g in self.order:
            group = self.groups[g]
            if not group.closed and len(group.arrived) == group.size:
                tasks += self._close(g, group)
        for g in self.order:
            group = self.groups[g]
            if group.closed or not group.waiting:
                continue
            if not group.has_sums:
                if (self.defer_equal and group.all_equal_so_far()) or not self._free():
                    continue
                group.has_sums = True
            tasks += self._buckets(g, group)
        return tasks

    def idle(self) -> list[Task]:
        """Nothing else waits: learn one deferred zero-variance candidate speculatively, if sums are free."""
        for g in self.order:
            group = self.groups[g]
            if group.closed or not group.waiting or group.has_sums or not self._free():
                continue
            group.has_sums = True
            tasks = self._buckets(g, group)
            for task in tasks:
                task.speculative = True
            return tasks
        return []

    def pending_groups(self) -> list[int]:
        return [g for g in self.order if not self.groups[g].closed] + [
            g for g, group in self.groups.items() if not group.arrived]

    def _close(self, g: int, group: _Group) -> list[Task]:
        mu, denom = group_stats([t.reward for t in group.arrived], self.adv.std, self.adv.eps)
        tasks: list[Task] = []
        if group.has_sums:
            tasks.append(Close(g, mu, denom))
            group.has_sums = False
        if group.waiting:
            tasks.append(Known(g, group.waiting, [(t.reward - mu) / denom for t in group.waiting]))
        group.waiting, group.closed = [], True
        return tasks

    def _buckets(self, g: int, group: _Group) -> list[Task]:
        waiting, group.waiting = group.waiting, []
        if not self.bucket_by_reward:
            return [Bucket(g, t.reward, [t]) for t in waiting]
        by_reward: dict[float, list[Trajectory]] = {}
        for t in waiting:
            by_reward.setdefault(t.reward, []).append(t)
        return [Bucket(g, r, members) for r, members in by_reward.items()]
