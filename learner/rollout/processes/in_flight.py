"""What each rollout worker has in flight, so that a worker that dies loses nothing: its
trajectories are dispatched again, in their dispatch batch, with the same ids and seeds
(docs/processes.md, "A rollout worker dies"); and which worker drafts which trajectory of a
later batch (docs/speculation.md): that batch's ``Work`` goes to it, the one holding the
draft, and a dead worker's drafts are forgotten, so their trajectories go out as normal work."""

from __future__ import annotations

from learner.rollout.processes.messages import Finished, Spans, WorkItem
from learner.trajectory import ScoredTurn, Trajectory


class InFlight:
    def __init__(self, workers: int):
        self.items: list[dict[int, tuple[int, WorkItem]]] = [{} for _ in range(workers)]  # traj -> (batch, item)
        self._owner: dict[int, int] = {}  # traj -> worker
        self._scored: dict[int, set[int]] = {}  # traj -> turns whose ScoredTurn arrived (OPD)
        self.drafts: list[set[int]] = [set() for _ in range(workers)]  # trajectories each worker drafts
        self._drafter: dict[int, int] = {}  # traj -> worker drafting it

    def spread_drafts(self, items: list[WorkItem], among: list[int]) -> dict[int, list[WorkItem]]:
        """Drafts spread evenly over the workers ``among``, recorded: worker -> its items."""
        per_worker: dict[int, list[WorkItem]] = {}
        for item in items:
            w = min(among, key=lambda w: len(self.drafts[w]))
            self.drafts[w].add(item.traj)
            self._drafter[item.traj] = w
            per_worker.setdefault(w, []).append(item)
        return per_worker

    def assign(self, batch: int, items: list[WorkItem], among: list[int]) -> dict[int, list[WorkItem]]:
        """Each item of dispatch batch ``batch`` to a worker of ``among``, recorded: worker -> its items."""
        per_worker: dict[int, list[WorkItem]] = {}
        for item in items:
            w = self._worker_for(item.traj, among)
            self.add(w, batch, item)
            per_worker.setdefault(w, []).append(item)
        return per_worker

    def _worker_for(self, traj: int, among: list[int]) -> int:
        """The worker that drafted ``traj`` (it continues the draft; no longer a draft from now
        on), else the least-loaded of ``among``."""
        w = self._drafter.pop(traj, None)
        if w is not None:
            self.drafts[w].discard(traj)
        return w if w is not None and w in among else self.least_loaded(among)

    def least_loaded(self, among: list[int] | None = None) -> int:
        return min(among if among else range(len(self.items)), key=lambda w: len(self.items[w]))

    def add(self, w: int, batch: int, item: WorkItem) -> None:
        self.items[w][item.traj] = (batch, item)
        self._owner[item.traj] = w

    def arrived(self, msg):
        """A message from a worker; returns what the driver should see. A finished trajectory
        leaves its worker's load; a scored turn that arrived before (its trajectory was
        sampled again after its worker died, same tokens) is not learnt twice: only its
        spans pass."""
        if isinstance(msg, Finished) and isinstance(msg.item, Trajectory):
            traj = msg.item.id
            w = self._owner.pop(traj, None)
            if w is not None:
                self.items[w].pop(traj, None)
            self._scored.pop(traj, None)
        elif isinstance(msg, Finished) and isinstance(msg.item, ScoredTurn):
            seen = self._scored.setdefault(msg.item.traj, set())
            if msg.item.turn in seen:
                return Spans(msg.spans)
            seen.add(msg.item.turn)
        return msg

    def take(self, w: int) -> dict[int, list[WorkItem]]:
        """Worker ``w``'s trajectories in flight (it died), by dispatch batch, in dispatch order;
        they are no longer its."""
        batches: dict[int, list[WorkItem]] = {}
        for batch, item in self.items[w].values():
            batches.setdefault(batch, []).append(item)
            self._owner.pop(item.traj, None)
        self.items[w] = {}
        for traj in self.drafts[w]:  # its drafts died with it: dispatched as normal work later
            self._drafter.pop(traj, None)
        self.drafts[w] = set()
        return batches
