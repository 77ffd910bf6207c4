"""The simulator and the driver decide with the same rules (docs/schedules.md).

The simulator logs, in order, its inputs (rewards, publishes) and every schedule decision it
made. Those inputs are replayed here through the driver's own pipeline objects
(``driver/pipeline.py``: ``BatchGate``, ``GroupPool``), called in the order
``driver/loop.py:Trainer.run`` calls them (after an input: form a step if the learner is free,
then dispatch what the rules allow), and the two logs must agree event by event. The fleet
has a slot per trajectory, as the driver's fleet takes every dispatched item at once.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from learner.driver import rules
from learner.driver.pipeline import BatchGate, GroupPool
from learner.sim.engine import run_schedule
from learner.sim.workload import BatchWork, TrajWork, Workload


@st.composite
def workloads(draw):
    prompts, group_size = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    n_batches = draw(st.integers(1, 3))
    durations = st.integers(1, 40).map(lambda x: x / 4)
    batches = []
    for _ in range(n_batches):
        trajs = [TrajWork(i, i // group_size, draw(durations), draw(durations) / 8)
                 for i in range(prompts * group_size)]
        trajs = draw(st.permutations(trajs))  # dispatch order within the batch
        batches.append(BatchWork(list(trajs), {g: 0.01 for g in range(prompts)}, draw(durations) / 4, 0.05))
    return Workload(batches, rollout_slots=10_000, learner_ranks=draw(st.integers(1, 2)))


def replay_batches(workload: Workload, schedule: str, steps: int, inputs: list[tuple]) -> list[tuple]:
    """The driver's decisions for sync, streaming and async on the simulator's inputs."""
    gate = BatchGate(rules.lead(schedule, 0), steps)
    sizes = [len(workload.batch(d).trajs) for d in range(steps)]
    got: dict[int, int] = {}
    batch_of: dict[int, int] = {}  # traj -> dispatch batch
    n_traj, version, formed = 0, 0, 0
    out: list[tuple] = []

    def dispatch() -> None:
        nonlocal n_traj
        for d in gate.open_batches(version):
            out.append(("dispatch", d, version))
            for _ in range(sizes[d]):
                batch_of[n_traj] = d
                n_traj += 1

    dispatch()
    for event in inputs:
        out.append(event)
        if event[0] == "reward":
            d = batch_of[event[1]]
            got[d] = got.get(d, 0) + 1
            if got[d] == sizes[d]:
                out.append(("received", d))
                gate.received += 1
        else:
            version = event[1]
            if version == steps:
                break  # the run ends at its last publish
        if formed < steps and formed == version and gate.received > formed:  # the learner is free
            groups = tuple(range(formed * workload.batch(0).n_groups, (formed + 1) * workload.batch(0).n_groups))
            out.append(("step", formed, groups))
            formed += 1
        dispatch()
    return out


def replay_groups(workload: Workload, steps: int, max_staleness: int, inputs: list[tuple]) -> list[tuple]:
    """The driver's fully-async decisions on the simulator's inputs."""
    P = workload.batch(0).n_groups
    pool = GroupPool(max_staleness, steps, lambda j: (j + 1) * P)
    sizes = [len(workload.batch(0).trajs) // P] * (P * (steps + max_staleness + 1))
    version, formed, next_group = 0, 0, 0
    out: list[tuple] = []

    def admit() -> None:
        nonlocal next_group
        while pool.may_admit(version):
            pool.admit(next_group, sizes[next_group])
            out.append(("admit", next_group, version))
            next_group += 1

    def drops(groups: list[int]) -> None:
        out.extend(("drop", g, version) for g in groups)

    admit()
    for event in inputs:
        out.append(event)
        if event[0] == "reward":
            _, _, group, sampled = event
            drops(pool.add(group, event[1], sampled, version))
            if group in pool.complete:
                out.append(("complete", group))
        else:
            version = event[1]
            if version == steps:
                break  # the run ends at its last publish
        if formed < steps and formed == version:  # the learner is free: does a step form now?
            drops(pool.refresh(version))
            chosen = pool.take(P)
            if chosen is not None:
                for g in chosen:
                    pool.pop_members(g)
                out.append(("step", formed, tuple(sorted(chosen))))
                formed += 1
        admit()
    return out


@settings(max_examples=60, deadline=None)
@given(workload=workloads(), schedule=st.sampled_from(["sync", "streaming", "async"]), steps=st.integers(1, 5))
def test_batch_schedules_decide_alike_in_simulator_and_driver(workload, schedule, steps):
    run = run_schedule(workload, schedule, steps)
    # the simulator keeps async's pipeline as full as in a longer run (one batch past the end)
    sim = [e for e in run.decisions if not (e[0] == "dispatch" and e[1] >= steps)]
    inputs = [e for e in sim if e[0] in ("reward", "publish")]
    sim = [e for e in sim if not (e[0] == "received" and e[1] >= steps)]
    sim = [e for e in sim if not (e[0] == "reward" and e[1] >= sum(len(workload.batch(d).trajs) for d in range(steps)))]
    inputs = [e for e in inputs if e in sim]
    assert replay_batches(workload, schedule, steps, inputs) == sim
    if schedule != "async":
        assert all(s == 0 for rec in run.steps for s in rec.staleness)


@settings(max_examples=80, deadline=None)
@given(workload=workloads(), steps=st.integers(1, 6), max_staleness=st.integers(0, 3))
def test_fully_async_decides_alike_in_simulator_and_driver(workload, steps, max_staleness):
    P, G = workload.batch(0).n_groups, len(workload.batch(0).trajs) // workload.batch(0).n_groups
    # one group size and group count for every batch, as the driver has
    workload = Workload([BatchWork(b.trajs, b.group_close_s, b.optimizer_s, b.publish_s) for b in workload.batches
                         if b.n_groups == P and len(b.trajs) == P * G], workload.rollout_slots, workload.learner_ranks)
    run = run_schedule(workload, "fully-async", steps, max_staleness)
    inputs = [e for e in run.decisions if e[0] in ("reward", "publish")]
    assert replay_groups(workload, steps, max_staleness, inputs) == run.decisions
    assert all(0 <= s <= max_staleness for rec in run.steps for s in rec.staleness)
