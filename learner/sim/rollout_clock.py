"""When each running trajectory's reward comes, for the schedule simulator (learner/sim/engine.py):
after its recorded (or drawn) duration, or, on an engine model, when its phases have run on the
shared engine (learner/sim/shared_engine.py)."""

from __future__ import annotations

import heapq
import math

from learner.sim.shared_engine import Fleet, phases


class RolloutClock:
    """The rollouts in flight. ``start`` one at dispatch; ``next_time`` says when the next reward
    (or, on the engine model, the next phase change) is due; ``advance`` to that time returns the
    trajectories whose reward it is, their ``end`` (and the spans the model drew) set."""

    def __init__(self, fleet: Fleet | None):
        self.fleet = fleet
        self.ends: list[tuple[float, int, object]] = []  # recorded durations: (reward time, seq, trajectory)
        self.seq = 0
        self.running: dict[int, object] = {}  # on the engine model: by trajectory id

    def start(self, now: float, t) -> None:
        if self.fleet is None:
            t.end = now + t.work.rollout_s
            heapq.heappush(self.ends, (t.end, self.seq, t))
            self.seq += 1
            return
        self.running[t.traj] = t
        self.fleet.start(now, t.traj, phases(t.work), t.slot)

    def next_time(self) -> float:
        if self.fleet is None:
            return self.ends[0][0] if self.ends else math.inf
        return self.fleet.next_time()

    def advance(self, now: float) -> list:
        """The rewards due at ``now``: one trajectory at a time on recorded durations (as events
        were), every one due on the engine model (a phase change can end several at once)."""
        if self.fleet is None:
            return [heapq.heappop(self.ends)[2]] if self.ends and self.ends[0][0] <= now else []
        done = []
        for traj in self.fleet.advance(now):
            t = self.running.pop(traj)
            t.end, t.drawn = now, self.fleet.drawn.pop(traj)
            done.append(t)
        return done

    def drain(self) -> None:
        """A new policy version, under fully-async: the engines let their calls drain first."""
        if self.fleet is not None:
            self.fleet.drain()

    def drawn_so_far(self, t) -> list:
        """The spans the engine model drew of a trajectory still running (none on recorded durations)."""
        return self.fleet.drawn.get(t.traj, []) if self.fleet is not None and t.traj in self.running else []
