"""What the on-policy GRPO learner learns next: the drain policy (docs/learner-drain.md).

Pure bookkeeping, no tensors. The learner hands ``DrainPlanner.drain`` every trajectory that
is waiting and executes the tasks it returns, in order:

    Close(g, μ, d)        group g is complete: fold its running sums into G
    Known(g, trajs, A)    members of a complete group, their advantages known: straight into G
    Bucket(g, r, trajs)   members of an open group that share reward r: one summed gradient
                          into g's running sums (equal rewards give equal advantages)

Policy ``finished-groups-first`` (adaptive):
  1. ``drain``: every group that is now complete is closed and its not-yet-learnt members are
     learnt with their final advantages, all in one pool of micro-batches (rows of any group
     share a backward: their weights are known);
  2. ``idle`` (called when nothing else is waiting): one (group, reward) bucket of an open
     group, the largest first. A backward of a bucket cannot be shared with another group's
     (each goes to its own running sums), so open-group work waits until the learner would
     otherwise idle: meanwhile its buckets grow, and members whose group closes join the
     shared known-advantage micro-batches instead. A group without sums gets them only while
     fewer than K groups hold them; otherwise its members wait for the close (step 1);
  3. zero-variance deferral: a group whose rewards so far are all equal is a candidate for
     A = 0. ``idle`` prefers every other bucket; if it closes all-equal, the members' backward
     is skipped outright. By default a candidate's members wait for a second distinct reward
     (then they are one bucket) or the close (all-equal: skipped; else known-advantage rows): no
     backward is spent on a group that ends zero-variance. With ``speculate`` (the earlier rule)
     ``idle`` learns them when nothing else is left (its sums are exact either way), which on a
     shared machine is not free: measured in docs/learner-drain.md.

``per-trajectory`` (the earlier learner) learns every arrival at once, one trajectory per
bucket, into its group's sums (its group's close: with the final advantage); no deferral. Every path is exact: a member is learnt once, either into
running sums (folded with the whole group's μ, σ at close) or with its final advantage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from learner.config import AdvantageConfig
from learner.grad.objectives import group_stats
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
                 lazy: bool, speculate: bool = False):
        """``lazy`` (adaptive): open groups learn in ``idle``, by (group, reward) bucket, zero-variance
        candidates last and only with ``speculate``; otherwise (per-trajectory) every arrival at
        once, one per bucket."""
        self.groups = {g: _Group(size) for g, size in group_sizes.items()}
        self.adv = adv
        self.cap = max_open_groups
        self.lazy = lazy
        self.speculate = speculate
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
        """Admit ``trajs`` (everything waiting) and plan what to learn now: the closes and
        known-advantage members (adaptive), and every arrival at once (per-trajectory)."""
        for traj in trajs:
            self.admit(traj)
        tasks: list[Task] = []
        for g in self.order:
            group = self.groups[g]
            if not group.closed and len(group.arrived) == group.size:
                tasks += self._close(g, group)
        if not self.lazy:
            for g in self.order:
                group = self.groups[g]
                if not group.closed and group.waiting and (group.has_sums or self._free()):
                    group.has_sums = True
                    tasks += self._buckets(g, group)
        return tasks

    def all_arrived(self) -> bool:
        return all(len(g.arrived) == g.size for g in self.groups.values())

    def idle(self, accept: Callable[[Bucket], bool] | None = None) -> list[Task]:
        """Nothing else waits: the largest bucket of an open group that holds (or may take) sums;
        zero-variance candidates only with ``speculate``, last, marked speculative; [] when there
        is none, or when ``accept`` (the ``cost-aware`` policy's judgement, learner/grad/batching/cost_model.py)
        says the largest does not pay now."""
        best: tuple | None = None
        for g in self.order:
            group = self.groups[g]
            if group.closed or not group.waiting or not (group.has_sums or self._free()):
                continue
            candidate = group.all_equal_so_far()
            if candidate and not self.speculate:
                continue
            for bucket in self._group_buckets(g, group.waiting):
                key = (not candidate, len(bucket.trajs))
                if best is None or key > best[0]:
                    best = (key, g, bucket, candidate)
        if best is None or (accept is not None and not accept(best[2])):
            return []
        _, g, bucket, candidate = best
        group = self.groups[g]
        group.has_sums = True
        taken = {t.id for t in bucket.trajs}
        group.waiting = [t for t in group.waiting if t.id not in taken]
        bucket.speculative = candidate
        return [bucket]

    def open_waiting(self) -> list[Bucket]:
        """The grouped backward's pool (learner/grad/batching/grouped.py): every bucket of the open groups that
        hold sums or may take them (groups without sums in order of first arrival, while fewer than
        K would hold them), zero-variance candidates only with ``speculate`` (marked speculative).
        Nothing is taken until ``take``."""
        free = None if self.cap is None else self.cap - self.open_sums
        out: list[Bucket] = []
        for g in self.order:
            group = self.groups[g]
            if group.closed or not group.waiting:
                continue
            candidate = group.all_equal_so_far()
            if candidate and not self.speculate:
                continue
            if not group.has_sums:
                if free is not None and free <= 0:
                    continue
                free = None if free is None else free - 1
            for bucket in self._group_buckets(g, group.waiting):
                bucket.speculative = candidate
                out.append(bucket)
        return out

    def take(self, group_id: int, trajs: Sequence[Trajectory]) -> None:
        """``trajs`` of open group ``group_id`` are learnt now into its sums (which it holds from now)."""
        group = self.groups[group_id]
        group.has_sums = True
        taken = {t.id for t in trajs}
        group.waiting = [t for t in group.waiting if t.id not in taken]

    def waiting_tokens(self) -> int:
        """Tokens of the arrived members of open groups not learnt yet."""
        return sum(len(t.input_ids) for g in self.groups.values() if not g.closed for t in g.waiting)

    def _close(self, g: int, group: _Group) -> list[Task]:
        # in trajectory order, not arrival order: μ, σ and the known rows' order (hence their
        # micro-batches) are then a function of the group alone (learner/grad/learners/deterministic.py)
        mu, denom = group_stats([t.reward for t in sorted(group.arrived, key=_by_id)], self.adv.std, self.adv.eps)
        tasks: list[Task] = []
        if group.has_sums:
            tasks.append(Close(g, mu, denom))
            group.has_sums = False
        if group.waiting:
            waiting = sorted(group.waiting, key=_by_id)
            tasks.append(Known(g, waiting, [(t.reward - mu) / denom for t in waiting]))
        group.waiting, group.closed = [], True
        return tasks

    def _buckets(self, g: int, group: _Group) -> list[Task]:
        waiting, group.waiting = group.waiting, []
        return self._group_buckets(g, waiting)

    def _group_buckets(self, g: int, waiting: list[Trajectory]) -> list[Bucket]:
        if not self.lazy:
            return [Bucket(g, t.reward, [t]) for t in waiting]
        by_reward: dict[float, list[Trajectory]] = {}
        for t in waiting:
            by_reward.setdefault(t.reward, []).append(t)
        return [Bucket(g, r, members) for r, members in by_reward.items()]


def _by_id(traj: Trajectory) -> int:
    return traj.id
