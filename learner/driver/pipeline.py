"""The schedule's plain state between the driver and the rollout fleet: which batches or
groups may be dispatched, which are complete, which are dropped (docs/schedules.md).

No torch, no processes: the driver loop (``driver/loop.py``) and the simulator
(``sim/engine.py``) hold one of these each and call the same methods, which decide only
through ``driver/rules.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from learner.driver import rules


@dataclass
class BatchGate:
    """sync, streaming, async: dispatch batches in order as ``rules.batch_may_start`` opens them."""

    k: int
    batches: int  # how many batches the run dispatches
    next_batch: int = 0
    received: int = 0  # batches whose every trajectory came back

    def open_batches(self, published: int) -> list[int]:
        """Batches that may start now (at most each once); marks them dispatched."""
        out = []
        while self.next_batch < self.batches and rules.batch_may_start(
                self.next_batch, published, self.k, self.received >= self.next_batch):
            out.append(self.next_batch)
            self.next_batch += 1
        return out


@dataclass
class GroupPool:
    """fully-async: groups admitted and not dropped, their members as they come back, the
    complete ones in completion order (a step takes the first to complete)."""

    max_staleness: int
    steps: int
    groups_through: Callable[[int], int]  # groups in the batches of steps 0..j
    admitted: int = 0
    dropped: int = 0
    sizes: dict[int, int] = field(default_factory=dict)
    members: dict[int, list[Any]] = field(default_factory=dict)
    oldest: dict[int, int] = field(default_factory=dict)  # group -> oldest sampled version seen
    complete: list[int] = field(default_factory=list)

    def may_admit(self, version: int) -> bool:
        return rules.may_admit_group(self.admitted - self.dropped, version, self.max_staleness, self.steps,
                                     self.groups_through)

    def admit(self, group: int, size: int) -> None:
        self.admitted += 1
        self.sizes[group] = size
        self.members[group] = []

    def add(self, group: int, item: Any, sampled_version: int, version: int) -> list[int]:
        """A member came back (sampled from ``sampled_version`` on); when it completes its
        group, the group is checked at ``version``. Returns the groups dropped."""
        self.members[group].append(item)
        self.oldest[group] = min(self.oldest.get(group, sampled_version), sampled_version)
        if len(self.members[group]) < self.sizes[group]:
            return []
        keep, gone = self._split_fresh([group], version)
        self.complete += keep
        return gone

    def refresh(self, version: int) -> list[int]:
        """Drop the complete groups no longer fresh at ``version`` (a group completed during
        the last step but not taken is trained one version later). Returns those dropped."""
        self.complete, gone = self._split_fresh(self.complete, version)
        return gone

    def take(self, want: int) -> list[int] | None:
        """The first ``want`` groups to complete, or None while fewer are in."""
        if len(self.complete) < want:
            return None
        chosen, self.complete = self.complete[:want], self.complete[want:]
        return chosen

    def pop_members(self, group: int) -> list[Any]:
        del self.sizes[group], self.oldest[group]
        return self.members.pop(group)

    def _split_fresh(self, groups: list[int], version: int) -> tuple[list[int], list[int]]:
        """(fresh, dropped) of ``groups`` at ``version``; the dropped are forgotten, never trained."""
        keep, gone = [], []
        for g in groups:
            (keep if rules.within_staleness(version, self.oldest[g], self.max_staleness) else gone).append(g)
        for g in gone:
            self.pop_members(g)
        self.dropped += len(gone)
        return keep, gone
