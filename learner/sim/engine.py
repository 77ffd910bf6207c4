"""Discrete-event simulation of the four schedules (docs/schedules.md) on a ``Workload``.

Every schedule decision (dispatch gate, group admission, freshness and drops, staleness)
is made by the driver's own rule functions and group pool (``driver/rules.py``,
``driver/pipeline.py``); what is modelled here is time: slots, durations, the learner's
ranks.

Resources: ``rollout_slots`` slots (a trajectory holds one for its rollout duration;
dispatch is FIFO onto the lowest free slot) and ``learner_ranks`` ranks (each runs its
backward passes one after another; a group closes on the rank that finished its last
member, right after it; at the barrier one reduction, the optimizer step and the weight
publish run on every rank). Policy version v = number of published optimizer steps; a
trajectory samples with the newest version at its start and is trained at step j, so its
staleness is j - v (per-turn version updates inside a trajectory are not modelled).

What differs between schedules (``k``: how many versions the rollout may run ahead):
- sync, streaming: dispatch batch d starts once version d is published (k = 0).
  sync trains the batch after its last reward; streaming runs each trajectory's backward
  as soon as its reward arrives (and a rank is free).
- async: batch d starts once version d-1 is published and batch d-1's rollout has
  finished (one generate call per batch), so it overlaps training of batch d-1 (k = 1).
- fully-async, the driver's policy (``driver/pipeline.py:GroupPool``): no batch barrier. A group
  may start while the groups started so far and not dropped fit in the batches up to
  version ``now + max_staleness``; the learner takes the first ``prompts`` groups to complete; a
  group sampled more than ``max_staleness`` versions ago when it completes, or when a step
  forms without it, is dropped (measured, never trained), which bounds every trained
  trajectory's staleness by ``max_staleness``.

A rollout takes its recorded or drawn duration whatever else runs: slots model latency, not a
shared throughput. That is the recording's own truth for sync, streaming and async, which load
the engine as the recorded run did (one batch at a time). fully-async does not: it runs up to
``max_staleness + 1`` batches' groups at once and drains its engine at every publish, so with an
engine model (``Workload.engine``, ``sim/shared_engine.py``) its generate turns run on a shared
engine whose decode step slows with the rows it carries. Without one, fast trajectories freeing
their slots make fully-async look faster than a compute-bound engine lets it run. Limits: OPD's per-turn
streaming is modelled per trajectory (backward after the whole trajectory), which
understates streaming; async samples with the newest published version, so its staleness
is 1 only when the learner is the bottleneck (0 when training finishes first).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass, field

from learner.distributed.assignment import assign_owners
from learner.driver import rules
from learner.driver.pipeline import GroupPool
from learner.sim.rollout_clock import RolloutClock
from learner.sim.shared_engine import ENGINE_SCHEDULES, Fleet
from learner.sim.workload import BatchWork, TrajWork, Workload
from learner.timeline import Kind, Span
from learner.registries.schedules import schedule_kind

ASSIGN_POLICIES = ("least-loaded", "round-robin", "group-affinity")


@dataclass
class SimTraj:
    traj: int  # global id in the simulated run
    group: int  # global group id
    dispatch: int  # dispatch batch (index into the workload's batches)
    work: TrajWork
    slot: int = -1
    start: float = math.nan
    end: float = math.nan  # reward time
    version: int = -1  # policy version it sampled with
    step: int = -1  # learner step that trained it
    drawn: list = field(default_factory=list)  # with an engine model: (kind, t0, t1, turn, tokens) as simulated


@dataclass
class StepRecord:
    step: int
    t_start: float  # previous publish end (0 for the first step)
    t_end: float  # this step's publish end
    last_reward: float
    grad_ready: float  # all backward + closes + reduction done
    trajs: list[SimTraj]

    @property
    def staleness(self) -> list[int]:
        return [rules.staleness(self.step, t.version) for t in self.trajs]


@dataclass
class SimRun:
    schedule: str
    steps: list[StepRecord]
    spans: list[Span] = field(default_factory=list)
    unfinished: list[SimTraj] = field(default_factory=list)  # started, never trained
    dropped_groups: int = 0  # fully-async: groups too stale to train
    # In order, the inputs ("reward", traj, group, sampled version), ("publish", version) and
    # the decisions ("dispatch", batch, version), ("admit", group, version), ("complete",
    # group), ("drop", group, version), ("received", batch), ("step", j, groups):
    # tests/learner/test_rules_agreement.py replays the inputs through the driver's pipeline.
    decisions: list[tuple] = field(default_factory=list)


@dataclass
class LearnerPass:
    grad_ready: float
    publish_end: float
    spans: list[Span]


def train_batch(
    members: list[SimTraj], ready: list[float], start: float, batch: BatchWork,
    workload: Workload, step: int, assign: str,
) -> LearnerPass:
    """One learner step: backward passes from ``ready`` times on, closes, then the barrier.

    ``batch`` supplies the optimizer and publish costs; a group's close cost comes from the
    batch it was dispatched in (fully-async mixes groups of several dispatch batches).

    ``members`` are in dispatch order; round-robin shards them by that index (static
    data-parallel sharding), least-loaded hands each ready trajectory to the rank free
    first, group-affinity learns every member of a group on its owner rank, the data-parallel
    learner's map (``learner.distributed.assignment``, docs/distributed.md). A group closes on
    the rank that finished its last backward, right after it.
    """
    ranks = workload.learner_ranks
    owners = assign_owners(dict(Counter(m.group for m in members)), ranks) if assign == "group-affinity" else {}
    free = [start] * ranks
    spans: list[Span] = []
    left: dict[int, int] = {}
    for m in members:
        left[m.group] = left.get(m.group, 0) + 1
    last: dict[int, tuple[float, int]] = {}  # group -> (latest backward end, its rank)
    for i in sorted(range(len(members)), key=lambda i: (ready[i], i)):
        m = members[i]
        if assign == "group-affinity":
            r = owners[m.group]
        else:
            r = min(range(ranks), key=lambda k: (free[k], k)) if assign == "least-loaded" else i % ranks
        t0 = end = max(ready[i], free[r])
        if m.work.backward_s > 0:  # (a tied group's member has none: advantage 0, skipped)
            free[r] = end = t0 + m.work.backward_s
            spans.append(Span(step, Kind.BACKWARD, t0, free[r], f"learner/{r}", m.traj, m.group,
                              policy_version=step))
        if end >= last.get(m.group, (-math.inf, 0))[0]:  # a skipped member still closes its group on arrival
            last[m.group] = (end, r)
        left[m.group] -= 1
        if left[m.group] == 0:  # all rewards in and every member's backward assigned
            # the rank that finished the group's last backward is free exactly then
            done_at, rc = last[m.group]
            c0 = max(free[rc], done_at)
            free[rc] = c0 + workload.batch(m.dispatch).group_close_s[m.work.group]
            if free[rc] > c0:  # (a tied group's close costs nothing: none recorded, none drawn)
                spans.append(Span(step, Kind.GROUP_CLOSE, c0, free[rc], f"learner/{rc}", group=m.group,
                                  policy_version=step))
    barrier = max(free)
    grad_ready = barrier + workload.reduce_s
    opt_end = grad_ready + batch.optimizer_s
    publish_end = opt_end + batch.publish_s
    for r in range(ranks):  # the reduction is drawn inside the optimizer span, as recorded runs do
        spans.append(Span(step, Kind.OPTIMIZER, barrier, opt_end, f"learner/{r}", policy_version=step))
        spans.append(Span(step, Kind.PUBLISH, opt_end, publish_end, f"learner/{r}", policy_version=step + 1))
    return LearnerPass(grad_ready, publish_end, spans)


def rollout_alone_s(workload: Workload, step: int) -> float:
    """R: makespan of one batch on the slots with nothing else running."""
    batch = workload.batch(step)
    free = [0.0] * min(workload.rollout_slots, len(batch.trajs))
    for t in batch.trajs:
        heapq.heapreplace(free, free[0] + t.rollout_s)
    return max(free, default=0.0)


def learner_alone_s(workload: Workload, step: int, assign: str) -> float:
    """L: the learner's wall time for one batch with every reward in hand at time 0."""
    batch = workload.batch(step)
    members = [SimTraj(i, t.group, step, t) for i, t in enumerate(batch.trajs)]
    return train_batch(members, [0.0] * len(members), 0.0, batch, workload, step, assign).publish_end


def numbered_batch(batch: BatchWork, d: int, first_traj: int, first_group: int) -> list[SimTraj]:
    """Dispatch batch ``d``'s trajectories with run-wide ids: numbered on from ``first_traj``, their
    groups from ``first_group`` in order of first appearance."""
    gids: dict[int, int] = {}
    return [SimTraj(first_traj + i, gids.setdefault(w.group, first_group + len(gids)), d, w)
            for i, w in enumerate(batch.trajs)]


class _Run:
    """Mutable state of one simulation; ``run()`` is the event loop."""

    def __init__(self, workload: Workload, schedule: str, steps: int, max_staleness: int, assign: str):
        self.w, self.schedule, self.n_steps, self.assign = workload, schedule, steps, assign
        self.follows_latest, self.k = schedule_kind(schedule).follows_latest, rules.lead(schedule, max_staleness)
        self.now = 0.0
        self.events: list[tuple[float, int, int, object]] = []  # the publishes: (time, 0, seq, None)
        self.seq = 0
        self.free_slots: list[int] = []  # slots given back (a heap); slots are numbered on as needed
        self.slots_used = 0
        self.queue: list[SimTraj] = []  # waiting for a slot, FIFO (head at index qhead)
        self.qhead = 0
        self.next_dispatch = 0  # next dispatch batch to enqueue
        self.n_traj = self.n_group = 0
        self.batches: list[list[SimTraj]] = []  # by dispatch batch
        self.done_count: list[int] = []
        self.publish: list[float] = []  # publish end of step j
        self.formed = 0  # learner steps formed (fully-async) / started
        self.records: list[StepRecord] = []
        self.spans: list[Span] = []
        self.pool = GroupPool(max_staleness, steps, self.groups_through)  # fully-async
        self.admitted: set[int] = set()  # fully-async: groups admitted (started)
        self.opened = 0  # batches whose dispatch gate has opened
        self.decisions: list[tuple] = []
        use_engine = workload.engine is not None and schedule in ENGINE_SCHEDULES
        self.rollouts = RolloutClock(Fleet(workload.engine) if use_engine else None)

    def run(self) -> SimRun:
        self.dispatch()
        while len(self.publish) < self.n_steps:
            reward_at = self.rollouts.next_time()
            if self.events and self.events[0][0] <= reward_at:  # a publish first, at a tie
                self.now, _, _, _ = heapq.heappop(self.events)
                self.publish.append(self.now)
                self.decisions.append(("publish", len(self.publish)))
                if self.follows_latest:
                    self.rollouts.drain()  # the worker's turns follow the newest weights
            elif reward_at < math.inf:
                self.now = reward_at
                for t in self.rollouts.advance(self.now):
                    self.on_reward(t)
            else:
                raise RuntimeError(f"{self.schedule}: simulation stalled at t={self.now}")
            self.try_train()
            self.dispatch()
        unfinished = [t for b in self.batches for t in b if t.step < 0 and not math.isnan(t.start)]
        for t in unfinished:
            t.drawn = t.drawn or self.rollouts.drawn_so_far(t)
        return SimRun(self.schedule, self.records, self.spans, unfinished, self.pool.dropped, self.decisions)

    def enqueue_batch(self) -> None:
        d = self.next_dispatch
        trajs = numbered_batch(self.w.batch(d), d, self.n_traj, self.n_group)
        self.n_traj, self.n_group = self.n_traj + len(trajs), self.n_group + len({t.group for t in trajs})
        self.batches.append(trajs)
        self.done_count.append(0)
        if self.follows_latest:  # the driver dispatches a group's members together
            trajs = sorted(trajs, key=lambda t: t.group)
        self.queue.extend(trajs)
        self.next_dispatch += 1

    def batch_gate_open(self, d: int) -> bool:
        """sync/streaming/async: may dispatch batch ``d`` start now?"""
        received = d == 0 or self.done_count[d - 1] == len(self.batches[d - 1])
        return rules.batch_may_start(d, len(self.publish), self.k, received)

    def groups_through(self, step: int) -> int:
        """Groups in the batches of steps 0..step."""
        return sum(self.w.batch(j).n_groups for j in range(step + 1))

    def dispatch(self) -> None:
        while self.free_slots or self.slots_used < self.w.rollout_slots:
            if self.qhead == len(self.queue):
                # keep the pipeline as full as in a longer run: async's rollout of step
                # n_steps overlaps the last training step (fully-async is bounded by admission)
                if not self.follows_latest and self.next_dispatch >= self.n_steps + self.k:
                    return
                self.enqueue_batch()
            t = self.queue[self.qhead]
            if self.follows_latest:
                if t.group not in self.admitted:
                    if not self.pool.may_admit(len(self.publish)):
                        return
                    size = sum(1 for w in self.w.batch(t.dispatch).trajs if w.group == t.work.group)
                    self.pool.admit(t.group, size)
                    self.admitted.add(t.group)
                    self.decisions.append(("admit", t.group, len(self.publish)))
            elif not self.batch_gate_open(t.dispatch):
                return
            elif t.dispatch == self.opened:
                self.decisions.append(("dispatch", t.dispatch, len(self.publish)))
                self.opened += 1
            self.qhead += 1
            if self.free_slots:  # the lowest free slot: those given back are below the unused ones
                t.slot = heapq.heappop(self.free_slots)
            else:
                t.slot, self.slots_used = self.slots_used, self.slots_used + 1
            t.start, t.version = self.now, len(self.publish)
            self.rollouts.start(self.now, t)

    def on_reward(self, t: SimTraj) -> None:
        self.decisions.append(("reward", t.traj, t.group, t.version))
        heapq.heappush(self.free_slots, t.slot)
        self.done_count[t.dispatch] += 1
        if self.follows_latest:
            gone = self.pool.add(t.group, t, t.version, len(self.publish))
            self.decisions += [("drop", g, len(self.publish)) for g in gone]
            if t.group in self.pool.complete:
                self.decisions.append(("complete", t.group))
        elif self.done_count[t.dispatch] == len(self.batches[t.dispatch]):
            self.decisions.append(("received", t.dispatch))

    def try_train(self) -> None:
        j = self.formed
        if j >= self.n_steps or len(self.publish) < j:
            return  # learner still busy with step j-1, or all steps trained
        if self.follows_latest:
            members = self.take_groups(j)
            if members is None:
                return
            ready = [self.now] * len(members)
        else:
            if j >= len(self.batches) or self.done_count[j] < len(self.batches[j]):
                return
            members = self.batches[j]
            last = max(t.end for t in members)
            # OPD's per-turn streaming is modelled per trajectory (see the module's limits)
            on_arrival = rules.learns_on_arrival(self.schedule, "grpo", is_turn=False)
            ready = [t.end for t in members] if on_arrival else [last] * len(members)
        self.formed += 1
        self.decisions.append(("step", j, tuple(sorted({t.group for t in members}))))
        start = self.publish[j - 1] if j else 0.0
        p = train_batch(members, ready, start, self.w.batch(j), self.w, j, self.assign)
        for t in members:
            t.step = j
        self.records.append(StepRecord(j, start, p.publish_end, max(t.end for t in members), p.grad_ready, members))
        self.spans.extend(p.spans)
        heapq.heappush(self.events, (p.publish_end, 0, self.seq, None))  # the publishes are the only events
        self.seq += 1

    def take_groups(self, j: int) -> list[SimTraj] | None:
        """The first groups to complete, once a batch of them is in; None to wait."""
        # one version later than when they completed
        self.decisions += [("drop", g, len(self.publish)) for g in self.pool.refresh(len(self.publish))]
        chosen = self.pool.take(self.w.batch(j).n_groups)
        if chosen is None:
            return None
        # members in start order (round-robin sharding follows it)
        return [t for g in chosen for t in sorted(self.pool.pop_members(g), key=lambda t: t.traj)]


def run_schedule(workload: Workload, schedule: str, steps: int, max_staleness: int = 2,
                 assign: str = "group-affinity") -> SimRun:
    """Simulate ``steps`` optimizer steps of ``schedule``; deterministic for a given workload."""
    return _Run(workload, schedule, steps, max_staleness, assign).run()
