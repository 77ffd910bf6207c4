"""What the adaptive learner measures to decide whether early work pays: the ``cost-aware`` drain
policy (docs/learner-drain.md).

Early work is anything the micro-batched sync would not do: a backward of an open group's bucket
(into its running sums; it costs ``open_ratio`` times a known row: a group's own micro-batch, and
with a KL/entropy term two cotangents) or a known-advantage micro-batch run before it is full (one
more backward's fixed cost, unless sync's plan has an unfilled one too). What it buys is a shorter
tail: work that would otherwise wait for a group that closes at the end of the rollout.
``BackwardCosts`` fits, online and across batches, the seconds of a known micro-batch as
a + b·(padded token slots), the open/known ratio per row and the known micro-batches' padding;
``EarlyWorkBudget`` (one batch) counts what ran against sync's plan of the whole batch. Early work
runs only when

  1. an unfilled known micro-batch: it adds no micro-batch to the count sync's plan would run
     (it stands in for sync's own unfilled one), so it costs no fixed cost sync does not pay;
  2. an open bucket: its premium (the seconds it costs beyond the same rows in known
     micro-batches) is no more than the tail seconds it saves, fits in what is left of
     ``share`` × the batch's estimated micro-batched work, the rollout is near its end (the
     remaining arrivals, at the rate measured in this batch, take no longer than learning the rows
     that wait now) and the bucket ends before the predicted last arrival (no open bucket runs
     late, into the tail).

So a streaming step's learner does no more backwards than the micro-batched sync's and at most
``share`` more seconds (up to the estimates), and spends that margin only where it shortens the
tail by at least as much.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass

from learner import config

# Why an idle moment's early work was deferred (``learner/deferred_<reason>``, docs/spans.md):
DEFER_REASONS = (
    "unmeasured",    # no micro-batch measured yet (a run's first backward): the micro-batched way
    "cost",          # an early row costs more than twice a known one: its premium exceeds the tail it saves
    "allowance",     # its premium does not fit what is left of early_work_share
    "count",         # an unfilled known micro-batch would add a backward to sync's count (or is under half one)
    "not_near_end",  # the remaining arrivals take longer than learning what waits: those groups close first
    "overrun",       # the work would run past the predicted last arrival, into the tail
    "policy",        # learner.drain_policy closed-groups: never before the groups close
)

# Before any open bucket ran: an open row at twice a known one (measured 2.1–2.6 on the bench
# workload, docs/learner-drain.md), so the first open bucket is taken only where it clearly pays.
PRIOR_OPEN_RATIO = 2.0
# Before a grouped micro-batch ran (learner/grad/batching/grouped.py): its seconds over a known micro-batch's
# of the same token slots, as measured on the bench's policy (docs/learner-drain.md, "The grouped backward").
GROUPED_PRIOR_RATIO = 1.3
CHUNKS = 4  # cost-aware: known rows run early once they are a CHUNKS-th of the batch (``chunk_slots``)
DECAY = 0.9  # weight of the older observations at each new one (the machine's speed drifts)


@dataclass
class BackwardCosts:
    """Decayed least squares of seconds ≈ a + b·slots over known micro-batches, and decayed
    seconds per row of known and of open micro-batches (their ratio is ``learner/open_row_cost``:
    per row, because an open bucket's small micro-batch pays its fixed cost over few rows)."""

    n: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0
    known_rows: float = 0.0
    known_rows_s: float = 0.0
    open_rows: float = 0.0
    open_rows_s: float = 0.0
    known_slots: float = 0.0  # decayed token slots and real tokens of known micro-batches: their padding
    known_tokens: float = 0.0
    grouped_s: float = 0.0  # decayed seconds of grouped micro-batches, and the fit's known seconds for their slots
    grouped_known_s: float = 0.0

    @property
    def grouped_ratio(self) -> float:
        """A grouped micro-batch's seconds over a known one's of the same slots (``GROUPED_PRIOR_RATIO``
        until one ran with a fit to compare against)."""
        return self.grouped_s / self.grouped_known_s if self.grouped_known_s > 0 else GROUPED_PRIOR_RATIO

    def observe_grouped(self, slots: int, seconds: float) -> None:
        if self.known:
            self.grouped_s = DECAY * self.grouped_s + seconds
            self.grouped_known_s = DECAY * self.grouped_known_s + self.known_s(slots)

    @property
    def slots_per_token(self) -> float:
        """Token slots a known micro-batch spends per real token (1 + its padding), 1 until one ran."""
        return max(self.known_slots / self.known_tokens, 1.0) if self.known_tokens else 1.0

    @property
    def known_row_s(self) -> float:
        return self.known_rows_s / self.known_rows if self.known_rows else 0.0

    @property
    def open_ratio(self) -> float:
        """Seconds per open row over seconds per known row (``PRIOR_OPEN_RATIO`` until both ran)."""
        if not (self.open_rows and self.known_rows_s > 0):
            return PRIOR_OPEN_RATIO
        return (self.open_rows_s / self.open_rows) / self.known_row_s

    def observe(self, slots: int, rows: int, seconds: float, open_group: bool, tokens: int | None = None) -> None:
        """One micro-batch: ``slots`` token slots (lines × width) holding ``tokens`` real tokens."""
        if open_group:
            self.open_rows, self.open_rows_s = DECAY * self.open_rows + rows, DECAY * self.open_rows_s + seconds
            return
        self.known_rows, self.known_rows_s = DECAY * self.known_rows + rows, DECAY * self.known_rows_s + seconds
        self.known_slots = DECAY * self.known_slots + slots
        self.known_tokens = DECAY * self.known_tokens + (slots if tokens is None else tokens)
        self.n, self.sx, self.sy = DECAY * self.n + 1, DECAY * self.sx + slots, DECAY * self.sy + seconds
        self.sxx, self.sxy = DECAY * self.sxx + slots * slots, DECAY * self.sxy + slots * seconds

    def _fit(self) -> tuple[float, float]:
        """(a, b); with one size seen so far, a is taken as 0 (every second per slot)."""
        if self.n == 0 or self.sx == 0:
            return 0.0, 0.0
        var = self.n * self.sxx - self.sx * self.sx
        if var <= 1e-9 * self.sxx * self.n:
            return 0.0, self.sy / self.sx
        b = max((self.n * self.sxy - self.sx * self.sy) / var, 0.0)
        a = max((self.sy - b * self.sx) / self.n, 0.0)
        return a, b

    @property
    def known(self) -> bool:
        return self.n > 0

    @property
    def fixed_s(self) -> float:
        return self._fit()[0]

    def known_s(self, slots: int) -> float:
        a, b = self._fit()
        return a + b * slots


class EarlyWorkBudget:
    """One batch's allowance of early work, the arrival rate it reads the rollout's progress from,
    and the micro-batches run so far against those sync's plan of the whole batch would need."""

    def __init__(self, costs: BackwardCosts, expected_rows: int, share: float, micro_batch_tokens: int = 4096):
        self.costs, self.expected_rows, self.share = costs, expected_rows, share
        self.micro_batch_tokens = micro_batch_tokens
        self.arrived = 0
        self.row_slots = 0  # token slots of the arrived rows (a row's length: what it adds to a full micro-batch)
        self.first_arrival: float | None = None
        self.spent_s = 0.0
        self.micro_batches = 0  # run in this batch, known and open
        self.learnt_slots = 0  # their token slots
        self.closed_tokens = 0  # tokens of closed groups' members handed to the known path
        self.learnt_tokens = 0  # of those, what takes a backward (A = 0 without KL/entropy: none; a cut shared prompt: less)
        self.deferred: Counter[str] = Counter()  # idle moments that learnt nothing, by the refusal's reason
        self.reason: str | None = None  # the last refusal of the idle moment in progress

    def refuse(self, reason: str) -> bool:
        """Record why early work was refused now (one of ``DEFER_REASONS``); returns False."""
        self.reason = reason
        return False

    def idle_ended(self, learnt: bool) -> None:
        """An idle moment is over: if it learnt nothing, count the reason of its last refusal."""
        if not learnt and self.reason is not None:
            self.deferred[self.reason] += 1
        self.reason = None

    def arrivals(self, n: int, slots: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if n and self.first_arrival is None:
            self.first_arrival = now
        self.arrived += n
        self.row_slots += slots

    def remaining_rollout_s(self, now: float | None = None) -> float:
        """Time to the last arrival at the rate measured since the first one (inf before two)."""
        now = time.monotonic() if now is None else now
        missing = self.expected_rows - self.arrived
        if missing <= 0:
            return 0.0
        if self.first_arrival is None or self.arrived < 2 or now <= self.first_arrival:
            return float("inf")
        return missing * (now - self.first_arrival) / self.arrived

    def allowance_s(self) -> float:
        """``share`` × the batch's micro-batched work: every expected row at the mean length so far."""
        if not self.arrived:
            return 0.0
        mean_slots = self.row_slots / self.arrived
        return self.share * self.costs.known_s(int(self.expected_rows * mean_slots))

    def ran(self, slots: int) -> None:
        """A micro-batch of ``slots`` token slots ran."""
        self.micro_batches += 1
        self.learnt_slots += slots

    def closed(self, tokens: int, learnt_tokens: int) -> None:
        """Members of closed groups of ``tokens`` tokens went to the known path, ``learnt_tokens`` of
        them into rows (the rest skipped: A = 0 and nothing else to learn, or a shared prompt cut off)."""
        self.closed_tokens += tokens
        self.learnt_tokens += learnt_tokens

    def expected_slots(self) -> float:
        """Token slots of the whole batch in sync's plan: every expected row at the mean length so far,
        less the share the closed groups so far did not learn, at the known micro-batches' padding."""
        if not self.arrived:
            return 0.0
        learnt = self.learnt_tokens / self.closed_tokens if self.closed_tokens else 1.0
        return self.expected_rows * (self.row_slots / self.arrived) * learnt * self.costs.slots_per_token

    def sync_micro_batches(self) -> int:
        """How many micro-batches sync's plan of the whole batch would run (at least one)."""
        return max(1, math.ceil(self.expected_slots() / self.micro_batch_tokens))

    def keeps_count(self, slots: int, parts: int = 1) -> bool:
        """``parts`` micro-batches of ``slots`` token slots in all now, and the rest of the batch in full
        ones after them, make no more micro-batches than sync's plan: only sync's own unfilled
        micro-batch may run unfilled."""
        rest = max(self.expected_slots() - self.learnt_slots - slots, 0.0)
        return self.micro_batches + parts + math.ceil(rest / self.micro_batch_tokens) <= self.sync_micro_batches()

    def pays(self, premium_s: float, waiting_s: float, now: float | None = None) -> bool:
        """Early work costing ``premium_s`` beyond sync's, while ``waiting_s`` of known-row work waits."""
        if not self.within(premium_s):
            return False
        return self.remaining_rollout_s(now) <= waiting_s or self.refuse("not_near_end")

    def within(self, premium_s: float) -> bool:
        """Something measured, and ``premium_s`` more stays within the batch's allowance."""
        if not self.costs.known:
            return self.refuse("unmeasured")  # nothing measured yet: the micro-batched way, never worse than sync
        return self.spent_s + premium_s <= self.allowance_s() or self.refuse("allowance")

    def spend(self, premium_s: float) -> None:
        self.spent_s += premium_s


DRAIN_POLICIES = config.DRAIN_POLICIES  # the one list: the config's choices


class DrainPolicy:
    """When the adaptive learner does early work (``learner.drain_policy``): ``cost-aware`` (the
    default: an unfilled known micro-batch where sync's plan has one too, ``partial_pays``; an open
    bucket where ``open_pays``), ``finished-groups-first`` (always, the earlier policy: open buckets
    whenever it would idle, known rows once they add up to a quarter micro-batch) or
    ``closed-groups`` (never: only full known micro-batches until the last arrival, as
    ``max_open_groups: 0``). Every choice is exact; only the learner's work and its timing differ."""

    def __init__(self, name: str, share: float, micro_batch_tokens: int = 4096):
        if name not in DRAIN_POLICIES:
            raise ValueError(f"learner.drain_policy: {name!r} is not one of {', '.join(DRAIN_POLICIES)}")
        self.name, self.share = name, share
        self.micro_batch_tokens = micro_batch_tokens
        self.min_partial_slots = micro_batch_tokens // 2
        self.costs = BackwardCosts()  # kept across batches: the model and the machine stay the same

    @property
    def eager(self) -> bool:
        return self.name == "finished-groups-first"

    def begin(self, expected_rows: int) -> EarlyWorkBudget:
        return EarlyWorkBudget(self.costs, expected_rows, self.share, self.micro_batch_tokens)

    def observe(self, slots: int, rows: int, seconds: float, open_group: bool, tokens: int | None = None) -> None:
        self.costs.observe(slots, rows, seconds, open_group, tokens)

    def partial_pays(self, budget: EarlyWorkBudget, slots: int, parts: int = 1) -> bool:
        """Known rows of ``slots`` token slots that do not fill a micro-batch (``parts``: the plan's
        micro-batches, one unless rows cut after a shared prompt go apart), learnt now rather than
        held for rows of later closes: only where that adds no micro-batch to sync's count
        (``EarlyWorkBudget.keeps_count``: sync's plan of the whole batch has one unfilled micro-batch
        too, and this one takes its place), so the learner runs no more backwards than sync's and
        pays no fixed cost sync does not. And at least ``min_partial_slots`` (half a micro-batch):
        the count is a prediction from the rows so far, and few large micro-batches are what sync
        runs. Groups close in waves, so without this the rows of a whole wave would wait for the
        end of the rollout when a full micro-batch forms only there."""
        if self.name != "cost-aware":
            return self.eager or budget.refuse("policy")
        if slots >= self.min_partial_slots and budget.keeps_count(slots, parts):
            return True
        if slots >= self.chunk_slots(budget) and budget.within(parts * self.costs.fixed_s):
            budget.spend(parts * self.costs.fixed_s)  # one more backward's fixed cost than sync's plan
            return True
        return budget.refuse("count")

    def chunk_slots(self, budget: EarlyWorkBudget) -> float:
        """The least known rows (token slots) worth a micro-batch of their own before the last arrival:
        a ``CHUNKS``-th of the batch's predicted slots (at most a full micro-batch), so that a batch's
        closed groups are learnt in a few fuller micro-batches as they close rather than all after the
        last arrival (groups close in waves), at one backward's fixed cost each."""
        expected = budget.expected_slots()
        if expected <= 0:
            return float(self.micro_batch_tokens)
        return min(float(self.micro_batch_tokens), max(expected / CHUNKS, float(self.micro_batch_tokens) / 16))

    def open_pays(self, budget: EarlyWorkBudget, rows: int, waiting_slots: int, now: float | None = None) -> bool:
        """An open group's bucket of ``rows`` rows, at ``open_ratio`` known rows' seconds each. Only if

        1. its premium ((``open_ratio`` − 1) known rows' seconds per row, beyond the same rows in a
           known micro-batch) is at most what it takes off the tail (the known rows' seconds those
           rows would take after the last arrival): no learner second spent for less than a second
           of step (an open row at more than twice a known one: never, as with a KL term's second
           cotangent on small buckets);
        2. the premium fits in what is left of the batch's allowance (``share``);
        3. the rollout is near its end (the remaining arrivals take no longer than learning what
           waits now: earlier, these rows' groups close while it runs and join known micro-batches);
        4. and the bucket ends before the predicted last arrival: one that runs late delays the
           final drain by what is left of it, in the tail, where waiting costs nothing."""
        if self.name != "cost-aware":
            return self.eager or budget.refuse("policy")
        row_s, ratio = self.costs.known_row_s, self.costs.open_ratio
        premium = max(ratio - 1.0, 0.0) * row_s * rows
        if ratio > 2.0:
            return budget.refuse("cost" if self.costs.known else "unmeasured")
        if not budget.pays(premium, self.costs.known_s(waiting_slots), now):
            return False
        return ratio * row_s * rows <= budget.remaining_rollout_s(now) or budget.refuse("overrun")

    def grouped_pays(self, budget: EarlyWorkBudget, slots: int, rows: int, open_rows: int, full: bool,
                     waiting_slots: int, now: float | None = None) -> bool:
        """A micro-batch of the grouped pool (``rows`` known rows and open groups' members in one
        backward, ``open_rows`` of them open, ``slots`` token slots), while the learner would idle: run it now?
        ``finished-groups-first``: always; ``closed-groups``: never; ``cost-aware``: its premium
        ((``grouped_ratio`` − 1) × a known micro-batch's seconds for its slots, the cost beyond sync's)
        must be no more than the tail it saves (its known seconds: a grouped backward at more than
        twice a known one never runs) and fit what is left of the batch's allowance (``share``); a
        ``full`` one then runs (sync runs full micro-batches too, and these rows' groups close in the
        wave at the rollout's end); an unfilled one only in place of sync's own unfilled one
        (``partial_pays``), or, near the rollout's end, as ``open_pays`` judges a bucket: the premium
        plus the fixed cost of one more backward within the allowance and no more than the tail it
        saves, and it ends before the predicted last arrival."""
        if self.name != "cost-aware":
            return self.eager or budget.refuse("policy")
        if not self.costs.known:
            return budget.refuse("unmeasured")
        if not open_rows:  # known rows only: a full micro-batch, or an unfilled one as ``partial_pays`` judges
            return full or self.partial_pays(budget, slots)
        ratio = self.costs.grouped_ratio
        if ratio > 2.0:
            return budget.refuse("cost")
        waiting_s = ratio * self.costs.known_s(waiting_slots)
        return budget.remaining_rollout_s(now) <= waiting_s or budget.refuse("not_near_end")

    def early_cost_ratio(self, grouped: bool) -> float:
        """What the model holds now for an early row's seconds over a known row's: the grouped
        micro-batch's ratio where the grouped backward is on, else an open bucket's per row."""
        return self.costs.grouped_ratio if grouped else self.costs.open_ratio

    def charge_grouped(self, budget: EarlyWorkBudget, slots: int, seconds: float) -> None:
        """A grouped micro-batch ran: its ratio is observed, its measured premium comes off the allowance."""
        premium = max(seconds - self.costs.known_s(slots), 0.0) if self.costs.known else 0.0
        self.costs.observe_grouped(slots, seconds)
        budget.spend(premium)

    def charge_open(self, budget: EarlyWorkBudget, rows: int, seconds: float) -> None:
        """An open bucket ran in ``seconds``: its measured premium (beyond its rows' known seconds)
        comes off the allowance, so a bucket that cost more than predicted leaves less for the next."""
        budget.spend(max(seconds - self.costs.known_row_s * rows, 0.0))
