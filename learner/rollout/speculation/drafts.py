"""Drafts in a rollout worker (docs/speculation.md): agent loops of a later dispatch batch, run
under the weights the worker has, on engine time the current step leaves free, and verified
(``rollout/speculation/token_verify.py``) when that batch's ``Work`` arrives, after its weights were loaded.

Priority: drafts run only in the engine's idle time. A draft starts a generate call only when
no current loop is ready, joins a running call only when that call holds drafts alone, and only
as many rows as the engine's measured cost model (``rollout/engine/step_cost.py``) says end their next
forward before the next current loop is due (its modelled tool latency ends), or within
``IDLE_STEP_S`` when no current loop is in flight; a running draft call is cut between two
decode steps (its partial turn kept, continued later from its stream position) as soon as its
next step would not end in time, a current row joins or a driver command waits. Memory: the
contexts of the drafts that started hold at most ``rollout.speculation.draft_token_budget``
tokens (plus the turn each running draft is sampling).
"""

from __future__ import annotations

import math
from typing import Callable

from learner.rollout.speculation import turns
from learner.rollout.engine.kv_keep import KeepKV
from learner.rollout.speculation.turns import LoopHost, LoopState
from learner.rollout.engine.sampling import Completion, Stream
from learner.rollout.speculation.token_verify import Sampled, Verdict, verify
from learner.timeline import Kind

VERIFY_CHUNK = 32  # drafts per verification forward (whole GRPO groups: at least one)
# A draft forward must end this long before the next current loop is due: predicted seconds x
# SAFETY + SLACK_S (the prediction is a mean; a forward on a shared core runs longer now and then).
SAFETY, SLACK_S = 1.5, 0.001
# With no current loop in flight (the learner's phase) a draft forward takes at most this long (one
# row always may), so a publish's Load waits at most about that. Measured on the built-in policy
# (one core): a decode step 1.3 ms + 0.02 ms per row, a prefill ~1.5 ms + ~5 us per token.
IDLE_STEP_S = 0.015


def _room(worker: LoopHost, besides: set[int] = frozenset()) -> int:
    """Tokens the draft budget leaves: less the started drafts' contexts (but those in ``besides``)
    and the keys/values verification kept for remainders (``kv_keep.py``: columns x rows)."""
    store = getattr(worker.engine, "prefixes", None)
    held = store.held_tokens() if store is not None else 0
    return (worker.cfg.rollout.speculation.draft_token_budget - held
            - sum(len(lp.ids) for lp in worker.loops.values() if lp.draft and lp.begun and lp.traj not in besides))


def _eligible(worker: LoopHost, running: set[int], now: float) -> list[LoopState]:
    """Drafts that may generate at ``now``: ready, not parked, those that started first, within the budget."""
    room, out = _room(worker), []
    waiting = [lp for lp in worker.loops.values() if lp.draft and lp.parked is None and lp.ready_at <= now
               and lp.traj not in running and lp.traj not in worker.verifying]
    for lp in sorted(waiting, key=lambda lp: (not lp.begun, lp.step, lp.traj)):
        if lp.begun:
            if room >= 0:
                out.append(lp)
        elif len(lp.ids) <= room:
            room -= len(lp.ids)
            out.append(lp)
    return out


def time_left(worker: LoopHost, now: float) -> float:
    """Seconds a draft forward may take from ``now``: until the next current loop is due (0 when
    one is ready or its tool is running: its answer could come any moment), ``IDLE_STEP_S`` when
    no current loop is in flight."""
    due = [lp.ready_at for lp in worker.loops.values() if not lp.draft]
    return IDLE_STEP_S if not due else max(0.0, min(due) - now)


def _fits(seconds: float | None, left: float, rows: int) -> bool:
    """A draft forward predicted to take ``seconds`` ends within ``left``. With no current loop in
    flight one row always may (nothing waits on the engine but a driver command, which cuts it);
    a cold cost model predicts nothing: drafts run only then."""
    idle = left == IDLE_STEP_S
    if seconds is None or (idle and rows <= 1):
        return idle
    return seconds * SAFETY + SLACK_S <= left


def step_fits(worker: LoopHost, rows: int) -> bool:
    """The running draft call's next decode step (``rows`` rows) ends before a current loop is due."""
    return _fits(worker.engine.step_cost.decode.predict(rows), time_left(worker, worker.now()), rows)


def pick(worker: LoopHost, first: Callable[[list], list], running: set[int] | frozenset = frozenset()) -> list:
    """The drafts to (join a) call: ``first`` applies the engine call's row cap, then as many as
    whose prefill and the batch's next decode step end in time (``time_left``); none while a
    driver command waits, adopted drafts wait for verification or drafts are held
    (``LoopHost.drafts_held``: a publish's Work is next)."""
    if worker.drafts_held or worker.unverified or worker.commands_waiting():
        return []
    now = worker.now()
    rows = first(_eligible(worker, set(running), now))
    if not rows:  # (also every run without speculation, whose engine may have no cost model)
        return []
    left, cost = time_left(worker, now), worker.engine.step_cost
    n = len(rows)
    while n and not _fits(cost.call(len(running) + n, n, max(len(lp.ids) for lp in rows[:n])), left,
                          len(running) + n):
        n //= 2
    return rows[:n]


def runnable_due(worker: LoopHost) -> list[float]:
    """When the drafts the budget lets run become ready; none while drafts are held or even one
    draft row's forward would not end before the next current loop is due (the worker waits for
    that loop instead)."""
    if worker.drafts_held or worker.unverified:
        return []
    now = worker.now()
    waiting = _eligible(worker, set(), math.inf)
    if not waiting:  # (also every run without speculation, whose engine may have no cost model)
        return []
    cost = worker.engine.step_cost
    due = [lp.ready_at for lp in waiting]
    # (the longest context: whichever draft the call takes first, one row of it then fits too)
    if due and not _fits(cost.call(1, 1, max(len(lp.ids) for lp in waiting)),
                         time_left(worker, max(now, min(due))), 1):
        return []
    return due


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
    """``Work`` for batch ``step`` arrived, after its weights were loaded: its drafts become that
    batch's loops, queued for verification (``verify_chunks``). ``verify_next`` runs one chunk
    when no current loop is ready, and one between every two decode steps of a running call: the
    loops sampled directly (never drafted) do not wait for the whole verification before their
    first token (they wait one chunk per decode step), and the remainders of the first chunks
    sample, and wait on their tools, while later chunks are verified. Measured against verifying
    every chunk at once on Work (docs/speculation.md). Returns the trajectories adopted; the others start
    afresh (a draft of another step, or weights other than ``step``'s, is dropped)."""
    mine = [worker.loops[t] for t in trajs if t in worker.loops and worker.loops[t].draft]
    for lp in [lp for lp in mine if lp.step != step or worker.engine.version != step]:
        worker.tools.forget(lp.traj)
        worker.release(lp)
        mine.remove(lp)
    for lp in mine:  # never sampled a token: nothing to verify, a loop of the batch as it is
        if not sampled(lp).positions:
            lp.draft = False
    for chunk in verify_chunks([lp for lp in mine if lp.draft]):
        worker.unverified.append((step, chunk))
        worker.verifying.update(lp.traj for lp in chunk)
    return {lp.traj for lp in mine}


def verify_next(worker: LoopHost) -> bool:
    """Verify the next queued chunk of drafts against the weights loaded now (False: none queued).
    Under sync and streaming no later weights are loaded before every trajectory of the step is
    back, so they are that step's."""
    if not worker.unverified:
        return False
    step, chunk = worker.unverified.popleft()
    if worker.engine.version != step:
        raise RuntimeError(f"drafts of step {step} queued for verification, but weights {worker.engine.version} loaded")
    ro, views = worker.cfg.rollout, [sampled(lp) for lp in chunk]
    store, trajs = getattr(worker.engine, "prefixes", None), [lp.traj for lp in chunk]
    # what the chunk keeps takes the place of its drafts' contexts in the budget (the store's verified
    # blocks together within what the other drafts leave: KeepKV.max_tokens counts what they hold)
    keep = None
    if store is not None and ro.speculation.reuse_verified_kv:  # (rollout/engine/kv_keep.py)
        keep = KeepKV(store, trajs, _room(worker, set(trajs)) + store.held_tokens(),
                      [lp.parked is None for lp in chunk])  # (a parked draft has finished)
    t0 = worker.now()
    own = getattr(worker.engine, "verify_drafts", None)  # an engine with its own forward (vLLM: vllm_verify.py)
    verdicts = (own(views, ro.temperature, ro.top_p, keep=keep) if own is not None else
                verify(worker.engine.model, views, ro.temperature, ro.top_p, worker.engine.pad_id, keep=keep))
    t1 = worker.now()
    for lp, view, verdict in zip(chunk, views, verdicts):
        worker.verifying.discard(lp.traj)
        worker.span(Kind.DRAFT_VERIFY, t0, t1, lp, tokens=len(view.positions))
        _continue(worker, lp, view, verdict)
    return True


def verify_chunks(drafts: list[LoopState]) -> list[list[LoopState]]:
    """The drafts in verification forwards of about ``VERIFY_CHUNK``, a GRPO group's drafts always
    in the same one (so a group whose drafts are kept whole closes right after that forward:
    under streaming its backward starts then). The groups with the fewest finished drafts go
    first: their remainders (the rejected and the unfinished drafts) set the step's makespan, and
    they sample and wait on their tools while the later chunks are verified."""
    groups: dict[int, list[LoopState]] = {}
    for lp in drafts:
        groups.setdefault(lp.group, []).append(lp)
    order = sorted(groups.values(), key=lambda g: (sum(lp.parked is not None for lp in g) / len(g), g[0].group))
    chunks: list[list[LoopState]] = [[]]
    for g in order:
        if chunks[-1] and len(chunks[-1]) + len(g) > VERIFY_CHUNK:
            chunks.append([])
        chunks[-1] += g
    return [c for c in chunks if c]


def _continue(worker: LoopHost, lp: LoopState, view: Sampled, verdict: Verdict) -> None:
    """The kept prefix stays (with the new weights' log-probs and version); from the first
    differing position on, the loop goes on under the new weights with the same streams."""
    version = worker.engine.version
    lp.draft, lp.drafted_tokens, lp.kept_tokens = False, len(view.positions), verdict.kept
    lp.verified_kv_tokens = verdict.kv_tokens
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

