"""The rollout engine as a shared server (``Workload.engine``): a trajectory's generate turns
share its engine's decode steps with every other row decoding at that moment.

Why: a rollout slot that holds a trajectory for its recorded duration (the simulator's default)
models latency, not throughput. A continuous-batching engine runs one decode step for all its
rows; on a compute-bound engine (every CPU, and a GPU at large batches) the step costs more the
more rows it carries, so a schedule that keeps more trajectories in flight (fully-async admits up
to ``max_staleness + 1`` batches' groups) makes each of them slower. With fixed durations that
schedule looks as fast as its fastest trajectories.

The model: engine w runs decode steps of ``a_s + n * (b_s + b_col_s * width)`` seconds with n rows
decoding in a batch ``width`` columns wide (a running call widens a column a step from its
prompts' width), and every row advances one token per step (processor sharing with a
load-dependent speed). A trajectory's
recorded rollout becomes phases: each ``rollout.generate`` turn is its token count on the engine,
everything else (tool time, the modelled tool latency, verification, the agent loop's own gaps
between spans) keeps its recorded duration. The costs are the engine's own, timed alone at several
row counts (``learner/bench/engine_cost.py``), and nothing is fitted to a schedule's run: a sync
recording cannot split a step's cost into fixed and per-row parts (its batches all carry about
the same rows), and that split is what a schedule with more rows in flight pays. The engine's
batching rules are the torch engine's: rows ready while a call runs join in batches
(``ADMIT_SHARE``, ``ADMIT_WAIT_STEPS``), each join and each retirement of ended rows copies the
batch's cache (``copy_s``), and ended rows ride as padding until they are a quarter of it.
"""

from __future__ import annotations

import heapq
import math
import statistics
from dataclasses import dataclass, replace
from typing import Hashable, Iterable

from learner.timeline import Kind

EPS = 1e-9  # seconds: events closer than this are simultaneous
# The schedules simulated on the engine model; the others replay the recorded durations, which
# is how their engine ran (one batch at a time, as the recorded run). fully-async carries several
# batches' rows at once and drains at every publish: its durations are not the recording's.
ENGINE_SCHEDULES = ("fully-async",)
# the torch engine's batching rule for rows that become ready while a call runs (the values of
# rollout/engine/continuous.py, which this module does not import: it would bring torch into the simulator)
ADMIT_WAIT_STEPS = 4  # they join at most this many decode steps after the last join
ADMIT_SHARE = 8  # ... or sooner, once they are 1/ADMIT_SHARE of the running batch


@dataclass(frozen=True)
class EngineCost:
    """One engine's decode step: ``a_s + n * (b_s + b_col_s * width)`` seconds with n rows in a batch
    ``width`` columns wide; ``join_s`` per row that joins the running batch and ``copy_s`` per row of
    the batch it joins (or from which ended rows are retired), during which no row decodes."""

    a_s: float
    b_s: float
    join_s: float = 0.0  # per row joining: its prefill
    copy_s: float = 0.0  # per row of the running batch, at each join and retirement: the cache copy
    b_col_s: float = 0.0  # per row and column of the batch: a decode step attends over every column
    prompt_width: float = 0.0  # the columns of a fresh call's batch; a running call widens a column a step
    workers: int = 1

    def step_s(self, rows: int, width: float | None = None) -> float:
        w = self.prompt_width if width is None else width
        return self.a_s + rows * max(self.b_s + self.b_col_s * w, 0.0)

    def scaled(self, slower: float) -> "EngineCost":
        return replace(self, a_s=self.a_s * slower, b_s=self.b_s * slower, join_s=self.join_s * slower,
                       copy_s=self.copy_s * slower, b_col_s=self.b_col_s * slower)


@dataclass(frozen=True)
class Phase:
    """Engine work (``tokens`` > 0) or a fixed wait of ``seconds``; ``kind``/``turn`` name the
    recorded span it stands for (None: a gap between spans, drawn as nothing)."""

    tokens: int
    seconds: float
    kind: str | None = None
    turn: int | None = None


def phases(work) -> tuple[Phase, ...]:
    """A ``TrajWork``'s rollout as phases (one fixed phase when it has no generate tokens)."""
    segments = sorted(work.segments, key=lambda s: (s.t0, s.t1))
    if not any(s.kind == Kind.GENERATE and s.tokens > 0 for s in segments):
        return (Phase(0, work.rollout_s, Kind.GENERATE if not segments else None),)
    out, cursor = [], 0.0
    for seg in segments:
        start = max(seg.t0, cursor)
        if start > cursor:
            out.append(Phase(0, start - cursor))
        if seg.kind == Kind.GENERATE and seg.tokens > 0:
            out.append(Phase(seg.tokens, 0.0, seg.kind, seg.turn))
        elif seg.t1 > start:
            out.append(Phase(0, seg.t1 - start, seg.kind, seg.turn))
        cursor = max(cursor, seg.t1)
    if work.rollout_s > cursor:
        out.append(Phase(0, work.rollout_s - cursor))
    return tuple(out)


class SharedEngine:
    """Processor sharing at a load-dependent speed: ``v`` counts the tokens a row present all along
    would have generated; a row joining at ``v`` with k tokens ends when ``v`` reaches ``v + k``.
    A join stalls every row for its prefill. ``draining`` (fully-async after a publish, as the
    worker lets its call drain so that the next turns start on the new weights): rows that reach
    the engine wait in ``pending`` until its last row ended, then all join at once."""

    def __init__(self, cost: EngineCost):
        self.cost, self.v, self.t, self.stall_until = cost, 0.0, 0.0, 0.0
        self.rows: list[tuple[float, int, Hashable]] = []
        self.seq = 0
        self.draining = False
        self.pending: list[tuple[Hashable, int]] = []
        # rows that ended but still ride in the batch as masked padding: the engine retires them
        # once they are a quarter of it, or when rows join (both copy the cache; rollout/engine/continuous.py)
        self.padding = 0
        self.waiting: list[tuple[Hashable, int]] = []  # ready, joining at the batching rule
        self.v_joined = 0.0  # ``v`` at the last join: ADMIT_WAIT_STEPS tokens later the waiting join
        self.v_call = 0.0  # ``v`` when the running call began: its batch has widened a column a token since
        self.joined_at: dict[Hashable, float] = {}  # a row's turn is drawn from its join, as recorded

    def step_s(self) -> float:
        """A decode step now: its rows (padding included) over the call's width, the prompt's plus a
        column for every step since the call began."""
        return self.cost.step_s(len(self.rows) + self.padding, self.cost.prompt_width + self.v - self.v_call)

    def _slope(self) -> float:
        """How much a decode step's cost grows per token decoded (the batch widens a column a step)."""
        return (len(self.rows) + self.padding) * self.cost.b_col_s

    def _seconds_for(self, tokens: float) -> float:
        """Seconds to decode ``tokens`` more from now, the step cost growing linearly meanwhile."""
        return self.step_s() * tokens + self._slope() * tokens * tokens / 2

    def _tokens_in(self, seconds: float) -> float:
        """Tokens decoded in ``seconds`` from now (the inverse of ``_seconds_for``)."""
        c, k = self.step_s(), self._slope()
        if k <= 0:
            return seconds / c
        return 2 * seconds / (c + math.sqrt(c * c + 2 * k * seconds))  # (a root of k x²/2 + c x = seconds, stable)

    def advance(self, now: float) -> None:
        start = max(self.t, self.stall_until)
        if self.rows and now > start:
            self.v += self._tokens_in(now - start)
        self.t = max(self.t, now)

    def join(self, now: float, key: Hashable, tokens: int) -> None:
        """``key`` is ready to decode ``tokens``; it joins at ``settle`` (so that rows ready at the
        same moment join together, as one prefill) or later by the batching rule."""
        self.advance(now)
        (self.pending if self.draining else self.waiting).append((key, tokens))

    def settle(self, now: float) -> None:
        """The waiting rows join now if the batching rule lets them: a new call takes them all, a
        running one once they are 1/ADMIT_SHARE of it (else ``next_done`` has their time)."""
        if self.waiting and not self.draining and len(self.waiting) >= max(1, len(self.rows) // ADMIT_SHARE):
            self._join(now, self._take_waiting())

    def _take_waiting(self) -> list[tuple[Hashable, int]]:
        rows, self.waiting = self.waiting, []
        return rows

    def _join(self, now: float, rows: list[tuple[Hashable, int]]) -> None:
        self.advance(now)
        copied = len(self.rows) + self.padding if self.rows else 0  # a first join copies nothing
        if not self.rows:  # a new call: as wide as its prompts
            self.v_call = self.v
        self.padding, self.v_joined = 0, self.v
        self.stall_until = max(self.stall_until, now) + self.cost.join_s * len(rows) + self.cost.copy_s * copied
        for key, tokens in rows:
            self.joined_at[key] = now
            heapq.heappush(self.rows, (self.v + tokens, self.seq, key))
            self.seq += 1

    def drain(self) -> None:
        self.draining = bool(self.rows)
        if self.draining:  # the rows not yet joined wait for the new weights too
            self.pending += self._take_waiting()

    def next_done(self) -> float:
        """When the next row ends or the waiting rows' time to join comes."""
        if not self.rows:
            return math.inf
        start = max(self.t, self.stall_until)
        first = self.rows[0][0]
        if self.waiting:
            first = min(first, self.v_joined + ADMIT_WAIT_STEPS)
        return start + self._seconds_for(max(first - self.v, 0.0))

    def pop_done(self, now: float) -> list[Hashable]:
        self.advance(now)
        out = []
        # due: less than EPS seconds of decoding left (a token count compared in time units, so
        # the rounding of a large ``v`` cannot leave a row a step shorter than the clock can tell)
        while self.rows and (self.rows[0][0] - self.v) * self.step_s() <= EPS:
            out.append(heapq.heappop(self.rows)[2])
        self.padding += len(out)
        if not self.rows:
            self.padding = 0
        elif self.padding * 4 >= len(self.rows) + self.padding:  # retired: the rest is copied
            self.padding = 0
            self.stall_until = max(self.stall_until, now) + self.cost.copy_s * len(self.rows)
        if not self.rows and self.draining:  # drained: the waiting rows start on the new weights
            self.draining = False
            waiting, self.pending = self.pending + self._take_waiting(), []
            if waiting:
                self._join(now, waiting)
        elif self.waiting and (not self.rows or (self.v_joined + ADMIT_WAIT_STEPS - self.v) * self.step_s() <= EPS):
            self._join(now, self._take_waiting())
        return out


class Fleet:
    """The rollout engines and every running trajectory's progress through its phases."""

    def __init__(self, cost: EngineCost):
        self.engines = [SharedEngine(cost) for _ in range(max(cost.workers, 1))]
        self.waits: list[tuple[float, int, Hashable]] = []  # fixed phases: (end, seq, key)
        self.seq = 0
        self.plan: dict[Hashable, tuple[tuple[Phase, ...], int]] = {}  # key -> (phases, its engine)
        self.at: dict[Hashable, int] = {}  # key -> index of its current phase
        self.began: dict[Hashable, float] = {}  # key -> when its current phase began
        self.drawn: dict[Hashable, list[tuple[str, float, float, int | None, int]]] = {}
        self.now = 0.0  # the last event's time

    def start(self, now: float, key: Hashable, plan: tuple[Phase, ...], engine: int = 0) -> None:
        self.now = now
        self.plan[key], self.at[key], self.drawn[key] = (plan, engine % len(self.engines)), 0, []
        self._enter(now, key)

    def _enter(self, now: float, key: Hashable) -> bool:
        """Begin ``key``'s current phase at ``now``; False when it has none left (its reward)."""
        plan, engine = self.plan[key]
        i = self.at[key]
        if i == len(plan):
            return False
        self.began[key] = now
        if plan[i].tokens > 0:
            self.engines[engine].join(now, key, plan[i].tokens)
        else:
            heapq.heappush(self.waits, (now + plan[i].seconds, self.seq, key))
            self.seq += 1
        return True

    def drain(self) -> None:
        """A new policy version: every engine lets its running rows finish before any joins."""
        for engine in self.engines:
            engine.drain()

    def next_time(self) -> float:
        for engine in self.engines:  # rows that became ready at the last event join first
            engine.settle(self.now)
        first_wait = self.waits[0][0] if self.waits else math.inf
        return min([first_wait] + [e.next_done() for e in self.engines])

    def advance(self, now: float) -> list[Hashable]:
        """Every phase ending at ``now`` (the time ``next_time`` gave) is over and its next begins;
        the trajectories with no phase left, in the order they finished."""
        self.now = now
        ended = []
        while self.waits and self.waits[0][0] <= now + EPS:
            ended.append(heapq.heappop(self.waits)[2])
        for engine in self.engines:
            if engine.next_done() <= now + EPS:
                ended += engine.pop_done(now)
        done = []
        for key in ended:
            plan, engine = self.plan[key]
            phase = plan[self.at[key]]
            began = self.engines[engine].joined_at.pop(key, self.began[key]) if phase.tokens else self.began[key]
            if phase.kind is not None:
                self.drawn[key].append((phase.kind, began, now, phase.turn, phase.tokens))
            self.at[key] += 1
            if not self._enter(now, key):
                done.append(key)
                del self.plan[key], self.at[key], self.began[key]
        return done


def replay_alone(plans: list[tuple[Phase, ...]], slots: int, cost: EngineCost) -> list[float]:
    """Each trajectory's end when the batch runs alone from time 0, FIFO onto ``slots`` slots
    (slot i on engine ``i % workers``, as the simulator dispatches)."""
    fleet, ends = Fleet(cost), [math.nan] * len(plans)
    free = list(range(max(min(slots, len(plans)), 1)))
    slot_of: dict[int, int] = {}
    nxt, now = 0, 0.0
    while True:
        while free and nxt < len(plans):
            slot_of[nxt] = heapq.heappop(free)
            fleet.start(now, nxt, plans[nxt], slot_of[nxt])
            nxt += 1
        now = fleet.next_time()
        if now == math.inf:
            return ends
        for key in fleet.advance(now):
            ends[key] = now
            heapq.heappush(free, slot_of.pop(key))


def replay_error(batches: Iterable, slots: int, cost: EngineCost, max_batches: int = 4) -> float | None:
    """How well the model replays a recording: the median |replayed - recorded| / recorded duration
    of each trajectory of up to ``max_batches`` recorded batches (``BatchWork``) run alone through
    it; None when no trajectory has generate tokens. A diagnostic only: the schedules that load the
    engine as the recording did replay its durations, not the model."""
    chosen = [b.trajs for b in batches][:max_batches]
    plans = [[phases(t) for t in b] for b in chosen]
    if not any(p.tokens for b in plans for plan in b for p in plan):
        return None
    rel = [abs(e - t.rollout_s) / t.rollout_s for plan, trajs in zip(plans, chosen)
           for e, t in zip(replay_alone(plan, slots, cost), trajs) if t.rollout_s > 0]
    return statistics.median(rel) if rel else None


NO_CAP = 1 << 30  # slots when nothing caps the rows in flight


def with_shared_engine(workload, measured: EngineCost, max_rows: int | None = None):
    """``workload`` with its engines modelled as shared servers at the ``measured`` costs (timed
    alone, ``learner/bench/engine_cost.py``: nothing is fitted to a schedule's run), and as many
    slots as the fleet lets run at once (``rollout.max_running_rows``; None: no cap, as the torch
    engine's worker admits every loop it is handed). Unchanged when its trajectories carry no
    generate tokens (drawn from distributions)."""
    workers = int(workload.inputs.get("rollout_workers") or 1)
    cost = replace(measured, workers=workers)
    error = replay_error(workload.batches, workload.rollout_slots, cost)
    if error is None:
        return workload
    return replace(workload, engine=cost, rollout_slots=max_rows or NO_CAP, inputs={**workload.inputs, "engine_model": {
        "decode_step_s": "a + rows * (b + b_col * width)", "a_s": cost.a_s, "b_s": cost.b_s,
        "b_col_s": cost.b_col_s, "prompt_width": cost.prompt_width, "join_s_per_row": cost.join_s,
        "copy_s_per_batch_row": cost.copy_s, "workers": cost.workers, "sync_replay_median_error": error,
        "schedules": list(ENGINE_SCHEDULES), "max_rows": max_rows}})
