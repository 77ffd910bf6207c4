"""Drafts in a rollout worker (docs/speculation.md): agent loops of a later dispatch batch, run
under the weights the worker has, on engine time the current step leaves free, and verified
(``rollout/speculation.py``) when that batch's ``Work`` arrives, after its weights were loaded.

Priority: a draft starts a generate call only when no current loop is ready, joins a running
call only when that call holds drafts alone, and is cut between two decode steps (its partial
turn kept, continued later from its stream position) as soon as a current row joins or a
driver command waits, so a current row waits for a draft at most one decode step. Memory: the
contexts of the drafts that started hold at most ``rollout.speculation.draft_token_budget``
tokens (plus the turn each running draft is sampling).
"""

from __future__ import annotations

import math
from typing import Callable

from learner.rollout import turns
from learner.rollout.turns import LoopHost, LoopState
from learner.rollout.sampling import Completion, Stream
from learner.rollout.speculation import Sampled, Verdict, verify
from learner.timeline import Kind

VERIFY_CHUNK = 32  # drafts per verification forward (a GRPO group or a few)


def _room(worker: LoopHost) -> int:
    budget = worker.cfg.rollout.speculation.draft_token_budget
    return budget - sum(len(lp.ids) for lp in worker.loops.values() if lp.draft and lp.begun)


def _eligible(worker: LoopHost, running: set[int], now: float) -> list[LoopState]:
    """Drafts that may generate at ``now``: ready, not parked, those that started first, within the budget."""
    room, out = _room(worker), []
    waiting = [lp for lp in worker.loops.values()
               if lp.draft and lp.parked is None and lp.ready_at <= now and lp.traj not in running]
    for lp in sorted(waiting, key=lambda lp: (not lp.begun, lp.step, lp.traj)):
        if lp.begun:
            if room >= 0:
                out.append(lp)
        elif len(lp.ids) <= room:
            room -= len(lp.ids)
            out.append(lp)
    return out


def pick(worker: LoopHost, first: Callable[[list], list], running: set[int] | frozenset = frozenset()) -> list:
    """The drafts to (join a) call, ``first`` applying the engine call's row cap; none while a
    driver command waits."""
    if worker.commands_waiting():
        return []
    return first(_eligible(worker, set(running), worker.now()))


def runnable_due(worker: LoopHost) -> list[float]:
    """When the drafts the budget lets run become ready."""
    return [lp.ready_at for lp in _eligible(worker, set(), math.inf)]


def sampled(lp: LoopState) -> Sampled:
    """The draft's sampled positions, each with its stream (turn seed, index in the turn)."""
    positions, streams = [], []
    turns = list(lp.turn_spans) + ([(len(lp.ids) - lp.open_turn, len(lp.ids))] if lp.open_turn else [])
    for t, (start, end) in enumerate(turns):
        for j in range(start, end):
            positions.append(j)
            streams.append(Stream(lp.seed * 1000 + t, j - start))
    return Sampled(lp.ids, positions, streams)


def adopt(worker: LoopHost, step: int, trajs: list[int]) -> set[int]:
    """``Work`` for batch ``step`` arrived: verify its drafts against the weights loaded now and
    turn them into that batch's loops, in batched forwards of ``VERIFY_CHUNK`` drafts, finished
    drafts first: a chunk's fully kept trajectories go to the learner before the next chunk is
    verified (streaming starts learning meanwhile). Returns the trajectories adopted; the others
    start afresh (a draft of another step, or weights other than ``step``'s, is dropped)."""
    mine = [worker.loops[t] for t in trajs if t in worker.loops and worker.loops[t].draft]
    for lp in [lp for lp in mine if lp.step != step or worker.engine.version != step]:
        worker.tools.forget(lp.traj)
        worker.release(lp)
        mine.remove(lp)
    mine.sort(key=lambda lp: lp.parked is None)
    ro = worker.cfg.rollout
    for first in range(0, len(mine), VERIFY_CHUNK):
        chunk = mine[first:first + VERIFY_CHUNK]
        views = [sampled(lp) for lp in chunk]
        t0 = worker.now()
        verdicts = verify(worker.engine.model, views, ro.temperature, ro.top_p, worker.engine.pad_id)
        t1 = worker.now()
        for lp, view, verdict in zip(chunk, views, verdicts):
            worker.span(Kind.DRAFT_VERIFY, t0, t1, lp, tokens=len(view.positions))
            _continue(worker, lp, view, verdict)
    return {lp.traj for lp in mine}


def _continue(worker: LoopHost, lp: LoopState, view: Sampled, verdict: Verdict) -> None:
    """The kept prefix stays (with the new weights' log-probs and version); from the first
    differing position on, the loop goes on under the new weights with the same streams."""
    version = worker.engine.version
    lp.draft, lp.drafted_tokens, lp.kept_tokens = False, len(view.positions), verdict.kept
    for j, logp in zip(view.positions, verdict.logprobs):
        lp.blogp[j] = logp
    if verdict.token is None:  # kept whole
        lp.turn_versions = [version] * len(lp.turn_spans)
        _send_scored(worker, lp, len(lp.turn_spans))
        if lp.parked is not None:  # a finished draft: a finished trajectory now
            stopped, lp.parked = lp.parked, None
            worker.advance(lp, Completion([], [], stopped))
        return
    j = view.positions[verdict.kept]
    t = sum(1 for _, end in lp.turn_spans if end <= j)  # the turn that position is in
    start = lp.turn_spans[t][0] if t < len(lp.turn_spans) else len(lp.ids) - lp.open_turn
    lp.open_drafted = lp.drafted_versions[t] if t < len(lp.drafted_versions) else lp.open_drafted
    worker.tools.forget(lp.traj)  # a tool call after j was never made
    del lp.ids[j:], lp.mask[j:], lp.blogp[j:]
    if lp.teacher is not None:
        del lp.teacher[start:]
    lp.turn_spans, lp.turn_versions = lp.turn_spans[:t], [version] * t
    lp.drafted_versions = lp.drafted_versions[:t]
    lp.ids.append(verdict.token)
    lp.mask.append(1)
    lp.blogp.append(verdict.logprobs[-1])
    lp.open_turn, lp.parked, lp.ready_at = len(lp.ids) - start, None, worker.now()
    _send_scored(worker, lp, t)
    if verdict.token in worker.stop_ids or lp.open_turn >= worker.cfg.rollout.max_new_tokens:
        turns.close_turn(worker, lp, verdict.token in worker.stop_ids)


def _send_scored(worker: LoopHost, lp: LoopState, n: int) -> None:
    """OPD: the kept turns' teacher scores (the teacher is fixed) go to the learner now."""
    if worker.teacher is not None:
        for turn in range(n):
            turns.send_scored(worker, lp, turn)


def speculation_refused(env) -> str | None:
    """Why ``env`` cannot be drafted ahead, or None: a draft's tool results are kept only where the
    environment is a pure function of the history (``Environment.pure_history``)."""
    if getattr(env, "pure_history", False):
        return None
    return (f"rollout.speculation: task {env.name} is not a pure function of its history (its tools keep state "
            "or cost real resources), so a draft's tool results cannot be kept; turn speculation off")

