"""One object per schedule: what sync, streaming, async and fully-async do differently in the
driver loop (docs/schedules.md).

    sync        dispatch batch s -> wait for its last reward -> learn -> step -> publish
    streaming   dispatch batch s -> learn each trajectory (GRPO) / turn (OPD) as it arrives
                -> barrier -> step -> publish                              (staleness 0)
    async       batch s+1 rolls out with weights s while the learner trains batch s (staleness 1)
    fully-async rollout never waits: workers pick up new weights between turns; the learner
                steps whenever a batch of groups is complete (staleness <= max_staleness)

Each decides through ``driver/rules.py`` and the plain state of ``driver/pipeline.py``, which
the simulator shares, so ``driver/loop.py`` reads top to bottom:

    schedule.dispatch(run)        what may roll out now: whole batches in order (BatchGate), or
                                  single groups within the staleness bound (GroupPool)
    held = schedule.collect(run)  the step's trajectories; learnt on arrival where the schedule
                                  does, the rest held for the barrier
    schedule.after_publish(run)   on-policy: the next batch rolls out while the metrics are made
    schedule.end(run)             off-policy: every replica loads the final weights

and a checkpoint asks it what it keeps (``restore``, ``next_numbers``, ``keeps_behavior``).
"""

from __future__ import annotations

from functools import partial
from typing import Protocol

from learner.checkpoint import RunState
from learner.config import RunConfig
from learner.driver import rules
from learner.driver.metrics import StepRecord
from learner.driver.pipeline import BatchGate, GroupPool
from learner.driver.recorder import Recorder
from learner.driver.resume import Checkpointer
from learner.driver.rollouts import Rollouts
from learner.grad.learners.common import PhaseCallback
from learner.grad.learners.protocol import Learner
from learner.trajectory import ScoredTurn, Trajectory
from learner.registries.objectives import objective as objective_of


class Driver(Protocol):
    """What a schedule reads and drives of the run it serves (``driver/loop.py``'s ``Trainer``)."""

    version: int  # the policy version being trained
    rec: StepRecord  # the step being formed
    rollouts: Rollouts
    learner: Learner
    checkpoints: Checkpointer
    recorder: Recorder  # the span stream
    on_phase: PhaseCallback  # the learner's phases become spans

    def learn(self, items: list[Trajectory | ScoredTurn]) -> None: ...


class Schedule(Protocol):
    name: str
    off_policy: bool  # trains with importance ratios against behaviour log-probs (the learner's kind)
    publish_waits: bool  # a publish ends once every replica loaded the new weights
    keeps_behavior: bool  # a checkpoint holds the weights the batch in flight is sampled with

    def dispatch(self, run: Driver) -> None: ...

    def collect(self, run: Driver) -> list[Trajectory | ScoredTurn]: ...

    def after_publish(self, run: Driver) -> None: ...

    def end(self, run: Driver) -> None: ...

    def restore(self, state: RunState) -> None: ...

    def next_numbers(self, rollouts: Rollouts, steps_done: int) -> tuple[int, int]: ...


class BatchSchedule:
    """sync, streaming, async: dispatch batches in order as ``rules.batch_may_start`` opens them;
    a step is its dispatch batch, every trajectory of it back."""

    name: str
    keeps_behavior = False  # a checkpoint holds the weights the batch in flight is sampled with

    def __init__(self, cfg: RunConfig):
        t = cfg.train
        self.prompts, self.group_size, self.objective = t.prompts_per_step, t.group_size, cfg.algorithm.objective
        self.off_policy = rules.off_policy(self.name)
        self.publish_waits = not self.off_policy  # does a publish end once every replica loaded it
        self.gate = BatchGate(rules.lead(self.name, t.max_staleness), t.steps)
        self.batch_groups: dict[int, list[int]] = {}  # dispatch batch -> its groups

    def dispatch(self, run: Driver) -> None:
        for batch in self.gate.open_batches(run.version):
            version = run.checkpoints.dispatch_version(batch)  # the newest, but async's replayed batch
            if batch > 0 and self.off_policy:
                run.rollouts.ensure_version(version)  # replicas are idle now: they take those weights
            self.batch_groups[batch] = run.rollouts.new_groups(self.prompts, batch, version)
            run.rollouts.draft_ahead(batch)  # rollout.speculation: the next batches, drafted meanwhile
            run.checkpoints.dispatched(batch)

    def collect(self, run: Driver) -> list[Trajectory | ScoredTurn]:
        """Receive the step's dispatch batch; learn on arrival where the schedule does; returns
        what is held for the barrier."""
        objective, rec = self.objective, run.rec
        streams = rules.learns_on_arrival(self.name, objective, objective_of(objective).teacher_scored)
        run.learner.begin_batch({g: self.group_size for g in self.batch_groups.pop(rec.step)})
        held: list = []
        idle = partial(run.learner.idle_work, on_phase=run.on_phase) if streams else None  # docs/learner.md
        while len(rec.trajs) < self.prompts * self.group_size:
            arrived: list = []
            for item in run.rollouts.receive_waiting(on_idle=idle, everything=streams):
                is_turn = isinstance(item, ScoredTurn)
                if not is_turn:
                    rec.trajs.append(item)
                elif self.off_policy:
                    continue  # the off-policy learner trains whole trajectories
                (arrived if rules.learns_on_arrival(self.name, objective, is_turn) else held).append(item)
            run.learn(arrived)
        self.gate.received += 1
        return held

    def restore(self, state: RunState) -> None:
        """A resumed run dispatches the batch after the checkpoint's boundary again."""
        self.gate.next_batch = self.gate.received = state.steps_done

    def next_numbers(self, rollouts: Rollouts, steps_done: int) -> tuple[int, int]:
        """(next trajectory, next group) a checkpoint after ``steps_done`` steps keeps: the batch
        after the boundary is dispatched again, so its numbers as before its dispatch."""
        return steps_done * self.prompts * self.group_size, steps_done * self.prompts


class Sync(BatchSchedule):
    """Dispatch batch s, wait for its last reward, learn it, step, publish."""

    name = "sync"

    def after_publish(self, run: Driver) -> None:
        self.dispatch(run)  # the next batch's first turn generates while this step's metrics are made

    def end(self, run: Driver) -> None:
        """Every publish already waited for every replica."""


class Streaming(Sync):
    """Dispatch batch s, learn each trajectory (GRPO) / turn (OPD) as it arrives, then the barrier."""

    name = "streaming"


class Async(BatchSchedule):
    """Batch s+1 rolls out with weights s while the learner trains batch s (staleness 1)."""

    name = "async"
    keeps_behavior = True

    def after_publish(self, run: Driver) -> None:
        """The next batch went out before this step trained (``dispatch`` after ``collect``)."""

    def end(self, run: Driver) -> None:
        run.rollouts.settle(run.version)


class FullyAsync:
    """Rollout never waits: groups start within the staleness bound, workers pick up new weights
    between turns, and the learner steps whenever ``prompts_per_step`` groups are complete."""

    name = "fully-async"
    off_policy = True
    publish_waits = False
    keeps_behavior = False  # admitted groups are dropped on resume and new ones admitted

    def __init__(self, cfg: RunConfig):
        t = cfg.train
        self.prompts, self.group_size = t.prompts_per_step, t.group_size
        self.pool = GroupPool(t.max_staleness, t.steps, lambda j: (j + 1) * t.prompts_per_step)

    def dispatch(self, run: Driver) -> None:
        while self.pool.may_admit(run.version):
            self.pool.admit(run.rollouts.new_groups(1, -1, run.version)[0], self.group_size)

    def collect(self, run: Driver) -> list[Trajectory]:
        """The first ``prompts_per_step`` groups to complete, fresh at this version; keeps the
        fleet fed within the bound while waiting. All of it is held: the off-policy learner
        trains the whole batch."""
        rec = run.rec
        rec.dropped_groups += len(self.pool.refresh(run.version))
        while (chosen := self.pool.take(self.prompts)) is None:
            self.dispatch(run)
            item = run.rollouts.receive()
            if isinstance(item, Trajectory):
                rec.dropped_groups += len(self.pool.add(item.group, item, item.min_version(), run.version))
        run.learner.begin_batch({g: self.group_size for g in chosen})
        for g in chosen:
            for t in self.pool.pop_members(g):
                t.step = rec.step
                rec.trajs.append(t)
        run.recorder.assign(rec.step, rec.trajs)  # their rollout spans were stamped -1
        return list(rec.trajs)

    def after_publish(self, run: Driver) -> None:
        """Groups start whenever the bound allows (``dispatch`` inside ``collect``)."""

    def end(self, run: Driver) -> None:
        run.rollouts.settle(run.version)

    def restore(self, state: RunState) -> None:
        """A resumed run admits new groups in place of those in flight at the checkpoint."""
        self.pool.admitted = state.schedule.get("groups_taken", 0)

    def next_numbers(self, rollouts: Rollouts, steps_done: int) -> tuple[int, int]:
        """Admitted groups are dropped on resume: numbers are never reused."""
        return rollouts.next_traj, rollouts.next_group


SCHEDULE_CLASSES: dict[str, type[Schedule]] = {cls.name: cls for cls in (Sync, Streaming, Async, FullyAsync)}


def make_schedule(cfg: RunConfig) -> Schedule:
    return SCHEDULE_CLASSES[cfg.train.schedule](cfg)
