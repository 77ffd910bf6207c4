"""An agent loop's state and how a turn of it ends (``rollout/processes/agent_worker.py`` runs the loops,
``rollout/speculation/drafts.py`` verifies drafted ones): shared by both, so neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from learner.tasks.env import Task
from learner.rollout.engine.sampling import Completion, Stream
from learner.timeline import Kind
from learner.trajectory import ScoredTurn


class LoopHost(Protocol):
    """What a turn's end and a draft's verification need from the worker running the loop."""

    cfg: Any  # RunConfig
    engine: Any  # the worker's Engine
    teacher: Any  # OPD's teacher model, or None
    tools: Any  # ToolCalls
    loops: dict[int, "LoopState"]
    stop_ids: list[int]
    commands_waiting: Callable[[], bool]
    unverified: Any  # deque of (step, drafts): chunks of adopted drafts not verified yet (rollout/speculation/drafts.py)
    verifying: set[int]  # their trajectories
    drafts_held: bool  # a Load came and its step's Work is next: drafts wait for it (rollout/speculation/drafts.py)

    def now(self) -> float: ...

    def span(self, kind: str, t0: float, t1: float, loop: "LoopState | None", turn=None, tokens=0, lane=None): ...

    def send(self, item: Any) -> None: ...

    def advance(self, lp: "LoopState", out: Completion) -> None: ...

    def release(self, lp: "LoopState") -> None: ...


@dataclass
class LoopState:
    """One agent loop in flight."""

    traj: int
    group: int
    step: int
    task: Task
    seed: int
    slot: int
    ids: list[int]
    mask: list[int]
    blogp: list[float]
    turn_versions: list[int] = field(default_factory=list)
    turn_spans: list[tuple[int, int]] = field(default_factory=list)
    teacher: list[float | None] | None = None
    ready_at: float = 0.0  # run clock; the modelled tool latency ends here (inf: a tool call is running)
    # speculation (rollout/speculation/drafts.py): drafted ahead under older weights, verified when its
    # step's Work arrives; a finished draft is parked (its last turn's stop flag) until then
    draft: bool = False
    begun: bool = False  # a draft that joined an engine call: its context counts against the draft budget
    parked: bool | None = None
    open_turn: int = 0  # tokens of the turn in progress already at the end of ids (a turn continued)
    open_drafted: int = -1  # the version that drafted them (-1: none)
    drafted_versions: list[int] = field(default_factory=list)  # per turn (-1: sampled directly)
    drafted_tokens: int = 0
    kept_tokens: int = 0
    verified_kv_tokens: int = 0  # context tokens whose keys/values its going on took from verification (kv_keep.py)

    def stream(self) -> int | Stream:
        """The random stream of the turn in progress: its seed, or (a turn continued after a
        draft's kept prefix or cut) a ``Stream`` at its next position (torch engine only)."""
        seed = self.seed * 1000 + len(self.turn_spans)
        return Stream(seed, self.open_turn) if self.open_turn else seed


def close_turn(w: LoopHost, lp: LoopState, stopped: bool) -> None:
    """The turn in progress ends (stop token or max_new_tokens): it becomes a turn of the
    trajectory, the teacher scores it (OPD) and the loop advances (tool, or reward)."""
    turn = len(lp.turn_spans)
    lp.turn_spans.append((len(lp.ids) - lp.open_turn, len(lp.ids)))
    lp.turn_versions.append(w.engine.version)
    lp.drafted_versions.append(lp.open_drafted)
    lp.open_turn, lp.open_drafted = 0, -1
    if w.teacher is not None:
        score_turn(w, lp, turn)
    w.advance(lp, Completion([], [], stopped))


def score_turn(worker: LoopHost, lp: LoopState, turn: int) -> None:
    """OPD: the teacher scores the turn now; the learner can run its backward while the
    turn's tool call is still running."""
    start, end = lp.turn_spans[turn]
    t0 = worker.now()
    with torch.no_grad():
        ids = torch.tensor([lp.ids[:end]], device=next(worker.teacher.parameters()).device)
        logits = worker.teacher(input_ids=ids).logits[0, start - 1:end - 1].float()  # (n, V)
        tlp = torch.log_softmax(logits, -1).gather(-1, ids[0, start:end, None]).squeeze(-1).tolist()
    lp.teacher[start:end] = tlp
    worker.span(Kind.TEACHER, t0, worker.now(), lp, turn=turn, tokens=end - start)
    if not lp.draft:  # a draft's scores go to the learner once verification kept its turn
        send_scored(worker, lp, turn)


def send_scored(worker: LoopHost, lp: LoopState, turn: int) -> None:
    start, end = lp.turn_spans[turn]
    worker.send(ScoredTurn(
        traj=lp.traj, group=lp.group, step=lp.step, turn=turn, input_ids=lp.ids[:end],
        turn_span=(start, end), teacher_logprobs=lp.teacher[start:end], behavior_logprobs=lp.blogp[start:end],
        policy_version=worker.engine.version, t_scored=worker.now(),
    ))
