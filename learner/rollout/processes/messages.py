"""What the driver and the rollout workers send each other through their queues
(docs/processes.md). Small NamedTuples: a pipe message pickles as its class and a tuple,
and the learner's core unpickles every one. Standard library only (the boot sends ``Stop``
before torch is imported)."""

from __future__ import annotations

from typing import Any, NamedTuple

# -- driver -> worker --------------------------------------------------------------


class Init(NamedTuple):
    """Everything a booted worker waits for: the run config, model directories, the weight
    store's tensors (shared memory) and the run clock's origin."""

    cfg_json: str
    policy_dir: str
    teacher_dir: str | None
    tensors: dict[str, Any]
    origin: float


class WorkItem(NamedTuple):
    traj: int
    group: int
    task: Any  # rollout.env.Task
    seed: int


class Work(NamedTuple):
    step: int  # dispatch batch (-1: fully-async, assigned when a step takes the group)
    items: list[WorkItem]


class Draft(NamedTuple):
    """Items of a later dispatch batch (the same ids and seeds it will have), to draft under the
    weights the worker has until that batch's ``Work`` arrives (docs/speculation.md)."""

    step: int
    items: list[WorkItem]


class Load(NamedTuple):
    version: int  # load this weight version now and acknowledge it


class Stop(NamedTuple):
    pass


class Wake(NamedTuple):
    """Inside a worker: a tool call returned (``rollout/processes/tool_calls.py``), step the loops."""


# -- worker -> driver --------------------------------------------------------------


class Ready(NamedTuple):
    worker: int


class Failed(NamedTuple):
    worker: int
    error: str  # one line, then a short traceback


class Spans(NamedTuple):
    spans: list[Any]  # timeline.Span


class Finished(NamedTuple):
    """A finished trajectory or an OPD scored turn, with the spans recorded since the last
    message (one pipe message instead of two)."""

    item: Any  # trajectory.Trajectory | trajectory.ScoredTurn
    spans: list[Any]  # timeline.Span


class Ack(NamedTuple):
    worker: int
    version: int
    t0: float
    t1: float
