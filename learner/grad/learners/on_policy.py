"""The on-policy learner (schedules ``sync`` and ``streaming``).

StreamingLearner (schedules ``sync`` and ``streaming``; the same class, so both give the same
update up to summation order), per batch:

    learner.begin_batch({group_id: group_size, ...})
    learner.learn(items)                # everything waiting (trajectories; OPD: scored turns and
                                        # ended trajectories), any order, any number of calls
    learner.idle_work()                 # optional, when nothing waits: True if it learnt something
    stats = learner.finish_batch()      # barrier: batch normaliser, result in p.grad
    norm = learner.step()               # clip, optimizer step, zero_grad (its ``OptimizerStep``)

The learner decides how to batch what it is handed (docs/learner.md): ``LearnerOptions.path``
``per-trajectory`` (one forward+backward per trajectory, the earlier learner), ``micro-batched``
(padded micro-batches, advantages known: a sync batch) or ``adaptive`` (streaming: per
trajectory when one is waiting, micro-batched drains when several are, by the policy of
``learner.grad.batching.drain``). ``on_trajectory(traj)`` / ``on_turn(turn)`` are ``learn([item])``.

``StreamingLearner`` keeps the batch's life (begin, learn, idle work, barrier) and ``_Batch`` what
the batch has seen; ``OnPolicyBackward`` runs its forwards and backwards into the running sums.

Conventions are in ``learner.grad.objectives``; the accumulators in ``learner.grad.accumulator``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from learner.config import AlgorithmConfig
from learner.grad.accumulator import OpenGroupError
from learner.grad.batching.cost_model import DEFER_REASONS, DrainPolicy, EarlyWorkBudget
from learner.grad.batching.drain import Bucket, Close, DrainPlanner, Known
from learner.grad.batching.grouped_drain import GroupedPool
from learner.grad.loss_tally import LossTally
from learner.grad.learners.common import (
    LearnerOptions,
    InProcessLearner,
    LogprobLedger,
    OptimizerStep,
    PhaseCallback,
    check_ref,
    memory_stats,
    padding_stats,
    report_micro_batch,
    trainable,
)
from learner.grad.batching.microbatch import (
    MicroBatchRows,
    Row,
    check_trajectory,
    check_turn,
    forward,
    grads_of,
    grpo_row,
    on_policy_pg_loss,
    opd_row,
    plan_micro_batches,
    split_grads,
)
from learner.grad.objectives import batch_normaliser
from learner.grad.batching.shared_prompt import SharedPrompts
from learner.grad.batching.packing import layout
from learner.timeline import Kind
from learner.trajectory import ScoredTurn, Trajectory
from learner.registries.objectives import objective as objective_of


@dataclass
class _Batch:
    """What one on-policy batch has seen so far and its counters; checks every item handed in."""

    group_sizes: dict[int, int]
    planner: DrainPlanner
    budget: EarlyWorkBudget | None = None  # adaptive: the cost-aware policy's allowance of early work
    turns: set[tuple[int, int]] = field(default_factory=set)  # OPD (traj, turn) seen
    scored_by_traj: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # OPD
    ended: set[int] = field(default_factory=set)  # OPD trajectories that ended
    opened: set[int] = field(default_factory=set)  # groups holding running sums now
    ready: list[Row] = field(default_factory=list)  # adaptive: known-advantage rows not learnt yet
    n_tokens: int = 0
    peak_buffers: int = 1
    skipped: int = 0  # trajectories with A = 0 exactly and no KL/entropy term: no backward at all
    speculative: int = 0  # zero-variance candidates learnt in idle time (docs/learner-drain.md)
    micro_batches: int = 0
    rows: int = 0
    token_slots: int = 0  # rows × longest row, summed over micro-batches
    padded_slots: int = 0
    closes: int = 0
    backward_s: float = 0.0
    # rows and seconds of micro-batches into running sums (open groups) vs straight into G: their
    # per-row ratio is what an open row costs here (docs/learner-drain.md; the bench's ceiling uses it)
    open_rows: int = 0
    open_s: float = 0.0
    known_rows: int = 0
    known_s: float = 0.0
    # load-independent measures of the work done, to tell work from contention: this thread's CPU
    # seconds in forwards and backwards (one torch thread: the learner's own compute, whatever else
    # runs on the machine), and the known micro-batches run before the batch's last arrival
    cpu_s: float = 0.0
    open_micro_batches: int = 0
    grouped_micro_batches: int = 0  # of those, grouped backwards mixing buckets (learner/grad/batching/grouped.py)
    early_micro_batches: int = 0
    early_rows: int = 0
    tally: LossTally = field(default_factory=LossTally)  # the step's policy loss, entropy, KL

    def open_row_cost(self) -> float | None:
        """Seconds per open-group row over seconds per known row; None unless both ran."""
        if not (self.open_rows and self.known_rows and self.open_s > 0 and self.known_s > 0):
            return None
        return (self.open_s / self.open_rows) / (self.known_s / self.known_rows)

    def counters(self) -> tuple:
        return self.rows, self.micro_batches, self.backward_s, self.n_tokens, self.closes

    def counted_since(self, before: tuple) -> dict:
        now = self.counters()
        names = ("rows", "micro_batches", "backward_s", "n_tokens", "groups_closed")
        return {name: b - a for name, a, b in zip(names, before, now)}

    def missing_groups(self) -> dict[int, int]:
        """GRPO: groups not complete yet, with how many of their members arrived."""
        return {g: len(grp.arrived) for g, grp in self.planner.groups.items() if len(grp.arrived) < grp.size}

    def admit_turns(self, turns: list[ScoredTurn], one_row_per_turn: bool) -> list[Row]:
        """OPD: check and count scored turns; the rows to learn (the turns of one trajectory in one
        row, or each turn its own)."""
        by_traj: dict[int, list[ScoredTurn]] = defaultdict(list)
        for turn in turns:
            owner = f"turn {turn.turn} of trajectory {turn.traj}"
            if turn.group not in self.group_sizes:
                raise ValueError(f"{owner}: group {turn.group} is not in this batch's group_sizes")
            if (turn.traj, turn.turn) in self.turns or turn.traj in self.ended:
                raise ValueError(f"{owner}: already fed in this batch")
            check_turn(turn)
            self.turns.add((turn.traj, turn.turn))
            by_traj[turn.traj].append(turn)
        rows = [opd_row([turn]) for turn in turns] if one_row_per_turn else [opd_row(ts) for ts in by_traj.values()]
        for turn in turns:
            n = turn.turn_span[1] - turn.turn_span[0]
            self.n_tokens += n
            self.scored_by_traj[turn.traj] += n
        return rows

    def end_opd_trajectory(self, traj: Trajectory) -> None:
        owner = f"trajectory {traj.id}"
        if traj.group not in self.group_sizes:
            raise ValueError(f"{owner}: group {traj.group} is not in this batch's group_sizes")
        if traj.id in self.ended:
            raise ValueError(f"{owner}: already fed in this batch")
        got = self.scored_by_traj.get(traj.id, 0)
        if got != traj.n_scored:
            raise ValueError(f"{owner}: {got} of its {traj.n_scored} scored tokens arrived as turns before it ended")
        self.ended.add(traj.id)


class StreamingLearner(InProcessLearner):
    """Exact on-policy GRPO / OPD (sync and streaming): one optimizer step per batch, zero staleness.

    The batch's life (begin, learn, idle work, barrier) is here; the forwards and backwards
    into the running sums are ``OnPolicyBackward``'s."""

    def __init__(self, model: torch.nn.Module, algo: AlgorithmConfig, ref_model: torch.nn.Module | None = None,
                 options: LearnerOptions | None = None, optimizer: OptimizerStep | None = None):
        check_ref(algo, ref_model)
        self.model, self.algo, self.ref_model, self.optimizer = model, algo, ref_model, optimizer
        self.options = options or LearnerOptions()
        self.acc = self.options.accumulator(trainable(model))
        self._batch: _Batch | None = None
        self.logprobs = LogprobLedger()
        self.policy = DrainPolicy(self.options.drain_policy, self.options.early_work_share,
                                  self.options.micro_batch_tokens)
        self.backward = OnPolicyBackward(self)

    @property
    def path(self) -> str:
        return self.options.path

    def begin_batch(self, group_sizes: Mapping[int, int]) -> None:
        """Start a batch of the given groups; discards any gradient left in p.grad."""
        if self._batch is not None:  # its partial sums would leak into this batch's gradient
            raise RuntimeError("begin_batch: the previous batch was not finished (call finish_batch first)")
        if not group_sizes:
            raise ValueError("group_sizes: a batch needs at least one group")
        for g, size in group_sizes.items():
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"group_sizes[{g}]: a group size must be an integer >= 1, got {size!r}")
        for p in self.acc.params:
            p.grad = None
        opts = self.options
        cap = 0 if opts.path == "micro-batched" else opts.max_open_groups
        planner = DrainPlanner(group_sizes, self.algo.advantage, cap, lazy=opts.path != "per-trajectory",
                               speculate=opts.speculate_zero_variance)
        self._batch = _Batch(group_sizes=dict(group_sizes), planner=planner,
                             budget=self.policy.begin(sum(group_sizes.values())))
        if self.backward.prompts is not None:
            self.backward.prompts.begin(dict(group_sizes))
        if self.acc.params[0].device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.acc.params[0].device)

    def _state(self, call: str) -> _Batch:
        if self._batch is None:
            raise RuntimeError(f"{call}: call begin_batch first")
        return self._batch

    # -- what the driver calls ---------------------------------------------------------------
    def learn(self, items: Sequence[Trajectory | ScoredTurn], on_phase: PhaseCallback | None = None) -> dict:
        """Learn everything handed over (all that is waiting); returns this call's counts."""
        state = self._state("learn")
        before = state.counters()
        turns = [x for x in items if isinstance(x, ScoredTurn)]
        trajs = [x for x in items if not isinstance(x, ScoredTurn)]
        if objective_of(self.algo.objective).teacher_scored:
            rows = state.admit_turns(turns, one_row_per_turn=self.path == "per-trajectory")
            self.backward.rows(state, rows, on_phase)
            for traj in trajs:
                state.end_opd_trajectory(traj)
        else:
            if turns:
                raise ValueError(f"turn {turns[0].turn} of trajectory {turns[0].traj}: scored turns are for "
                                 "objective opd; GRPO learns per trajectory")
            for traj in trajs:
                check_trajectory(traj)
            tasks = state.planner.drain(trajs)  # validates membership before any work
            state.budget.arrivals(len(trajs), sum(len(t.input_ids) for t in trajs))
            state.n_tokens += sum(t.n_scored for t in trajs)
            self.backward.tasks(state, tasks, on_phase)
        return state.counted_since(before)

    def idle_work(self, on_phase: PhaseCallback | None = None) -> bool:
        """Nothing waits: learn deferred work where the drain policy says it pays (docs/learner-drain.md):
        known rows not yet a full micro-batch, else an open group's bucket."""
        state = self._state("idle_work")
        learnt = self._idle_work(state, on_phase)
        state.budget.idle_ended(learnt)  # learner/deferred_<reason>: why an idle moment learnt nothing
        return learnt

    def _idle_work(self, state: _Batch, on_phase: PhaseCallback | None) -> bool:
        if self.backward.pool.enabled and self.backward.pool.idle(state, on_phase):
            return True  # known and open rows in grouped micro-batches (learner/grad/batching/grouped_drain.py)
        if state.ready and self.backward.early_known_pays(state):
            self.backward.ready(state, on_phase, flush=True)
            return True
        grpo = objective_of(self.algo.objective).group_advantage and not self.backward.pool.enabled
        tasks = state.planner.idle(open_bucket_judge(self.policy, state)) if grpo else []
        self.backward.tasks(state, tasks, on_phase)
        return bool(tasks)

    def on_trajectory(self, traj: Trajectory, on_phase: PhaseCallback | None = None) -> dict:
        return self.learn([traj], on_phase)

    def on_turn(self, turn: ScoredTurn, on_phase: PhaseCallback | None = None) -> dict:
        return self.learn([turn], on_phase)

    def check_complete(self) -> None:
        """The barrier's own check: every group of the batch complete; raises ``OpenGroupError``."""
        state = self._state("check_complete")
        if objective_of(self.algo.objective).group_advantage:
            missing = state.missing_groups()
            if missing:
                detail = ", ".join(f"{g} ({n}/{state.group_sizes[g]})" for g, n in missing.items())
                raise OpenGroupError(f"finish_batch: groups not complete: {detail}")

    def batch_counts(self) -> tuple[int, int]:
        """(scored tokens, trajectories) of this learner's batch: its terms of the batch normaliser."""
        state = self._state("batch_counts")
        return state.n_tokens, sum(state.group_sizes.values())

    def abandon_batch(self) -> None:
        """Drop the batch in progress (sums, counts) without a step: its barrier failed."""
        self._batch = None
        self.acc.reset()
        if self.backward.prompts is not None:
            self.backward.prompts.begin({})

    def finish_batch(self, on_phase: PhaseCallback | None = None, totals: tuple[int, int] | None = None) -> dict:
        """Barrier: p.grad = normaliser · G (1/N_tokens, 1/B or 1/C); raises if a group is incomplete.

        ``totals``: (scored tokens, trajectories) of the whole batch when this learner holds one
        data-parallel rank's share of it (``learner.distributed``); default its own counts."""
        state = self._state("finish_batch")
        self.check_complete()
        self.backward.ready(state, on_phase, flush=True)
        self.backward.release_prompts(state, on_phase, at_barrier=True)
        n_tokens, n_traj = totals if totals is not None else self.batch_counts()
        normaliser = batch_normaliser(self.algo.loss_agg_mode, n_tokens, n_traj, self.algo.loss_scale_constant)
        self.acc.finalize(normaliser)
        self._batch = None
        return {"n_tokens": n_tokens, "n_traj": n_traj, "normaliser": normaliser, "learner": self.path,
                **memory_stats(self.acc, state.peak_buffers), **batch_stats(state, normaliser),
                **(self.backward.prompts.stats() if self.backward.prompts is not None else {}),
                **deferral_stats(self, state)}


def batch_stats(state: _Batch, normaliser: float) -> dict:
    """What a finished batch did: rows, micro-batches (open, early, grouped), skipped and
    speculative trajectories, padding, seconds, the open rows' measured cost."""
    open_cost = state.open_row_cost()
    return {"skipped_trajectories": state.skipped, "speculative_trajectories": state.speculative,
            "micro_batches": state.micro_batches, "rows": state.rows, "backward_s": state.backward_s,
            **padding_stats(state), **state.tally.stats(normaliser),
            "token_slots": state.token_slots, "cpu_s": state.cpu_s, "open_rows": state.open_rows,
            "open_micro_batches": state.open_micro_batches, "early_micro_batches": state.early_micro_batches,
            "early_rows": state.early_rows, "grouped_micro_batches": state.grouped_micro_batches,
            **({} if open_cost is None else {"open_row_cost": open_cost})}


def deferral_stats(learner: StreamingLearner, state: _Batch) -> dict:
    """Why the streaming learner learnt early or not (adaptive GRPO): the share of its rows learnt
    before the batch's last arrival, the cost model's early/known row ratio, and the idle moments
    that learnt nothing by reason (docs/learner-drain.md, "When early work pays")."""
    if learner.path != "adaptive" or not objective_of(learner.algo.objective).group_advantage:
        return {}
    early = state.early_rows + state.open_rows
    return {"early_row_share": early / state.rows if state.rows else 0.0,
            "early_cost_ratio": learner.policy.early_cost_ratio(learner.backward.pool.enabled),
            **{f"deferred_{r}": float(state.budget.deferred.get(r, 0)) for r in DEFER_REASONS}}


class OnPolicyBackward:
    """The on-policy learner's work through the model: the drain's tasks (group closes,
    known-advantage rows, open-group buckets) and OPD rows, in micro-batches under the token
    budget, into the accumulator's running sums (docs/learner.md)."""

    def __init__(self, learner: StreamingLearner):
        self.model, self.ref_model, self.algo = learner.model, learner.ref_model, learner.algo
        self.options, self.acc, self.logprobs = learner.options, learner.acc, learner.logprobs
        self.policy = learner.policy
        self.one_pass = learner.path != "per-trajectory"
        if self.options.shared_prompt_backward and (not objective_of(self.algo.objective).group_advantage or self.options.deterministic):
            raise ValueError("learner.shared_prompt_backward: supported for GRPO on the streaming (not "
                             "deterministic) and sync learners")
        self.prompts = (SharedPrompts(self.model, self.ref_model if self.algo.kl_coef > 0 else None,
                                      self.options.shared_prompt_max_tokens)
                        if self.options.shared_prompt_backward else None)
        self.pool = GroupedPool(self)

    def _cut(self, row: Row) -> Row:
        return row if self.prompts is None else self.prompts.cut(row)

    def _plans(self, rows: list[Row]) -> tuple[list[MicroBatchRows], list[MicroBatchRows]]:
        """Micro-batches of the ordinary rows, and apart from them of the rows cut after a shared
        prompt (right-padded: they attend to the prompts' keys/values)."""
        plain = plan_micro_batches([r for r in rows if not r.prompt], self.options.budget, self.options.pack_rows)
        return plain, plan_micro_batches([r for r in rows if r.prompt], self.options.budget)

    def _plan(self, rows: list[Row]) -> list[MicroBatchRows]:
        return [part for parts in self._plans(rows) for part in parts]

    def release_prompts(self, state: _Batch, on_phase: PhaseCallback | None, at_barrier: bool = False) -> None:
        """Back-propagate the finished groups' prompts into G (a ``learner.group_close`` phase each)."""
        if self.prompts is None:
            return
        report = None if on_phase is None else (lambda t0, t1, g: on_phase(Kind.GROUP_CLOSE, t0, t1, None, g))
        state.backward_s += self.prompts.release(self.acc, self.acc.params, report)
        if at_barrier and self.prompts.pending():
            raise OpenGroupError(f"finish_batch: shared prompts of groups {self.prompts.pending()} were not "
                                 "back-propagated (a member was never learnt)")

    def tasks(self, state: _Batch, tasks: list, on_phase: PhaseCallback | None) -> None:
        """GRPO: closes and known-advantage rows first (finished groups first), then the open buckets."""
        known: list[Row] = []
        for task in tasks:
            if isinstance(task, Close):
                t0 = time.monotonic()
                self.acc.close_group(task.group, task.mu, task.denom)
                state.tally.close(task.group, task.mu, task.denom)
                if self.prompts is not None:
                    self.prompts.closed(task.group, task.mu, task.denom)
                state.opened.discard(task.group)
                state.closes += 1
                if on_phase:
                    on_phase(Kind.GROUP_CLOSE, t0, time.monotonic(), None, task.group)
            elif isinstance(task, Known):
                learnt = 0
                for traj, adv in zip(task.trajs, task.advantages):
                    if adv == 0.0 and self.algo.kl_coef == 0 and self.algo.entropy_coef == 0:
                        state.skipped += 1  # exactly zero gradient: nothing to back-propagate
                        self.logprobs.skip(traj.id)
                        if self.prompts is not None:
                            self.prompts.learnt(traj.group)
                    else:
                        known.append(self._cut(grpo_row(traj, adv)))
                        learnt += len(known[-1].ids)
                state.budget.closed(sum(len(t.input_ids) for t in task.trajs), learnt)
        state.ready += known
        self.ready(state, on_phase, flush=state.planner.all_arrived())
        for task in tasks:
            if isinstance(task, Bucket):
                if task.group not in state.opened:
                    self.acc.open_group(task.group)
                    state.opened.add(task.group)
                    state.peak_buffers = max(state.peak_buffers, self.acc.buffer_count())
                state.speculative += len(task.trajs) if task.speculative else 0
                rows = [self._cut(grpo_row(t, 1.0)) for t in task.trajs]
                seconds = sum(self._micro_batch(state, part, task, on_phase) for part in self._plan(rows))
                self.policy.charge_open(state.budget, len(rows), seconds)
        self.release_prompts(state, on_phase)

    def ready(self, state: _Batch, on_phase: PhaseCallback | None, flush: bool) -> None:
        """Known-advantage rows, in micro-batches: at once, or (adaptive, before the whole batch has
        arrived) ``finished-groups-first``: once they add up to ``min_stream_tokens``; otherwise the
        full micro-batches only, the last one waiting for rows of later closes to fill it."""
        if not state.ready:
            return
        if flush or self.options.path != "adaptive":
            rows, state.ready = state.ready, []
        elif self.policy.eager:
            if sum(len(r.ids) for r in state.ready) < self.options.min_stream_tokens:
                return
            rows, state.ready = state.ready, []
        else:
            plans = self._plans(state.ready)  # the last micro-batch of each waits to be filled
            state.ready = [row for parts in plans if parts for row in parts[-1]]
            rows = [row for parts in plans for part in parts[:-1] for row in part]
        if rows:
            self.rows(state, rows, on_phase)

    def early_known_pays(self, state: _Batch) -> bool:
        """Idle, known rows waiting that do not fill a micro-batch: learn them now?"""
        if self.options.path != "adaptive" or self.policy.eager:
            return True
        parts = self._plan(state.ready)
        slots = sum(layout([len(r.ids) for r in part], part.line_width).slots for part in parts)
        return self.policy.partial_pays(state.budget, slots, len(parts))

    def rows(self, state: _Batch, rows: list[Row], on_phase: PhaseCallback | None) -> None:
        """Rows whose weights are known (GRPO known advantages, OPD turns): straight into G."""
        for part in self._plan(rows):
            self._micro_batch(state, part, None, on_phase)
        self.release_prompts(state, on_phase)

    def _micro_batch(self, state: _Batch, rows: MicroBatchRows, bucket: Bucket | None,
                     on_phase: PhaseCallback | None, keys: list | None = None) -> float:
        """One forward + backward: known rows straight into G, a bucket's rows into its group's sums,
        or (``keys``: each row's (group, reward), None for known) the grouped backward of a mix;
        returns its seconds (without a shared prompt's forward, as the drain policy weighs them)."""
        t_start, cpu0 = time.monotonic(), time.thread_time()
        past, groups = (None, []) if not rows[0].prompt else self.prompts.past(rows, self.algo.kl_coef > 0)
        # a group's prompt forward (once per group, at its first micro-batch: work the sync does as
        # well) is in the span, not in this micro-batch's per-row cost that the drain policy weighs
        t0 = time.monotonic()
        if keys is not None:
            fwd, pg, aux = *self.pool.forward_backward(rows, keys, state.tally), None
        else:
            fwd = forward(self.model, self.ref_model, self.algo, rows, rows.line_width, stats=True, past=past)
            for b, row in enumerate(fwd.rows):
                self.logprobs.keep(row.traj, fwd.row_logp(b))
            pg = on_policy_pg_loss(fwd, self.algo.objective)
            state.tally.add(fwd, pg, *((bucket.group, bucket.reward) if bucket is not None else ()))
            aux = None if fwd.aux is None else (fwd.w * fwd.aux).sum()
            gradients_into(self.acc, self.prompts, pg, aux, bucket, groups, self.one_pass)
        if self.prompts is not None:
            for row in rows:
                self.prompts.learnt(row.group)
        grid = fwd.layout
        del fwd, pg, aux, past
        t1 = time.monotonic()
        state.cpu_s += time.thread_time() - cpu0
        grouped = bucket is not None or keys is not None
        self.policy.observe(grid.slots, len(rows), t1 - t0, open_group=grouped, tokens=sum(grid.lengths))
        state.budget.ran(grid.slots)
        count_micro_batch(state, len(rows), grouped, t1 - t0, early=objective_of(self.algo.objective).group_advantage)
        report_micro_batch(state, rows, grid, t_start, t1, on_phase)
        return t1 - t0


def open_bucket_judge(policy: DrainPolicy, state: _Batch):
    """The planner's ``accept`` for the largest open bucket (None: always, the eager policy)."""
    if policy.eager:
        return None

    def accept(bucket: Bucket) -> bool:
        waiting = sum(len(r.ids) for r in state.ready) + state.planner.waiting_tokens()
        return policy.open_pays(state.budget, len(bucket.trajs), waiting)
    return accept


def count_micro_batch(state: _Batch, rows: int, open_group: bool, seconds: float, early: bool) -> None:
    """The step's tallies of known-row and open-group micro-batches (the learner/* metrics);
    ``early``: a known micro-batch before the whole batch arrived counts as early (GRPO)."""
    if open_group:
        state.open_rows, state.open_s = state.open_rows + rows, state.open_s + seconds
        state.open_micro_batches += 1
        return
    state.known_rows, state.known_s = state.known_rows + rows, state.known_s + seconds
    if early and not state.planner.all_arrived():
        state.early_micro_batches, state.early_rows = state.early_micro_batches + 1, state.early_rows + rows


def gradients_into(acc, prompts: SharedPrompts | None, pg: torch.Tensor, aux: torch.Tensor | None,
                   bucket: Bucket | None, groups: list[int], one_pass: bool) -> None:
    """Known rows: ∇(pg + aux) into G; a bucket: ∇pg into its group's sums, ∇aux into G. With
    shared prompts (``groups``) the cotangents of their keys/values go to the prompts' sums."""
    inputs = acc.params + (prompts.leaves(groups) if groups else [])
    n = len(acc.params)
    if bucket is None:
        grads = grads_of(pg if aux is None else pg + aux, inputs)
        acc.add_direct(grads[:n])
        if groups:
            prompts.add(groups, grads[n:])
        return
    pg_grads, aux_grads = split_grads(pg, aux, inputs, one_pass=one_pass)
    acc.add_to_group(bucket.group, bucket.reward, pg_grads[:n])
    if groups:
        prompts.add(groups, pg_grads[n:], bucket.reward)
    if aux_grads is not None:
        acc.add_direct(aux_grads[:n])
        if groups:
            prompts.add(groups, aux_grads[n:])
