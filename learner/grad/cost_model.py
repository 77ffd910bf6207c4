"""What the adaptive learner measures to decide whether early work pays: the ``cost-aware`` drain
policy (docs/learner.md).

Early work is anything the micro-batched sync would not do: a backward of an open group's bucket
(into its running sums; it costs ``open_ratio`` times a known row: a group's own micro-batch, and
with a KL/entropy term two cotangents) or a known-advantage micro-batch run before it is full (one
more backward's fixed cost). What it buys is a shorter tail: work that would otherwise wait for a
group that closes at the end of the rollout. ``BackwardCosts`` fits, online and across batches, the
seconds of a known micro-batch as a + b·(padded token slots) and the open/known ratio;
``EarlyWorkBudget`` (one batch) lets early work run only when

  1. its premium (the seconds it costs beyond the same rows learnt in full known micro-batches)
     fits in what is left of ``share`` × the batch's estimated micro-batched work, and
  2. the rollout is near its end: the remaining arrivals, at the rate measured in this batch, are
     predicted to take no longer than learning the rows that wait now, i.e. those rows would
     otherwise spill into the tail.

So a streaming step never does more than (1 + share) times the micro-batched sync's learner work
(up to the estimate), and spends that margin only where it can shorten the tail.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

# Before any open bucket ran: an open row at twice a known one (measured 2.1–2.6 on the bench
# workload, docs/learner.md), so the first open bucket is taken only where it clearly pays.
PRIOR_OPEN_RATIO = 2.0
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

    @property
    def known_row_s(self) -> float:
        return self.known_rows_s / self.known_rows if self.known_rows else 0.0

    @property
    def open_ratio(self) -> float:
        """Seconds per open row over seconds per known row (``PRIOR_OPEN_RATIO`` until both ran)."""
        if not (self.open_rows and self.known_rows_s > 0):
            return PRIOR_OPEN_RATIO
        return (self.open_rows_s / self.open_rows) / self.known_row_s

    def observe(self, slots: int, rows: int, seconds: float, open_group: bool) -> None:
        if open_group:
            self.open_rows, self.open_rows_s = DECAY * self.open_rows + rows, DECAY * self.open_rows_s + seconds
            return
        self.known_rows, self.known_rows_s = DECAY * self.known_rows + rows, DECAY * self.known_rows_s + seconds
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
    """One batch's allowance of early work and the arrival rate it reads the rollout's progress from."""

    def __init__(self, costs: BackwardCosts, expected_rows: int, share: float):
        self.costs, self.expected_rows, self.share = costs, expected_rows, share
        self.arrived = 0
        self.row_slots = 0  # token slots of the arrived rows (a row's length: what it adds to a full micro-batch)
        self.first_arrival: float | None = None
        self.spent_s = 0.0

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

    def pays(self, premium_s: float, waiting_s: float, now: float | None = None) -> bool:
        """Early work costing ``premium_s`` beyond sync's, while ``waiting_s`` of known-row work waits."""
        if not self.within(premium_s):
            return False
        return self.remaining_rollout_s(now) <= waiting_s

    def within(self, premium_s: float) -> bool:
        """Something measured, and ``premium_s`` more stays within the batch's allowance."""
        if not self.costs.known:
            return False  # nothing measured yet: the micro-batched way, which is never worse than sync
        return self.spent_s + premium_s <= self.allowance_s()

    def spend(self, premium_s: float) -> None:
        self.spent_s += premium_s


DRAIN_POLICIES = ("cost-aware", "finished-groups-first", "closed-groups")


class DrainPolicy:
    """When the adaptive learner does early work (``learner.drain_policy``): ``cost-aware`` (the
    default: when ``EarlyWorkBudget.pays``), ``finished-groups-first`` (always, the earlier policy:
    open buckets whenever it would idle, known rows once they add up to a quarter micro-batch) or
    ``closed-groups`` (never: only full known micro-batches until the last arrival, as
    ``max_open_groups: 0``). Every choice is exact; only the learner's work and its timing differ."""

    def __init__(self, name: str, share: float, micro_batch_tokens: int = 4096):
        if name not in DRAIN_POLICIES:
            raise ValueError(f"learner.drain_policy: {name!r} is not one of {', '.join(DRAIN_POLICIES)}")
        self.name, self.share = name, share
        self.min_partial_slots = micro_batch_tokens // 2
        self.costs = BackwardCosts()  # kept across batches: the model and the machine stay the same

    @property
    def eager(self) -> bool:
        return self.name == "finished-groups-first"

    def begin(self, expected_rows: int) -> EarlyWorkBudget:
        return EarlyWorkBudget(self.costs, expected_rows, self.share)

    def observe(self, slots: int, rows: int, seconds: float, open_group: bool) -> None:
        self.costs.observe(slots, rows, seconds, open_group)

    def _decide(self, budget: EarlyWorkBudget, premium_s: float, waiting_slots: int) -> bool:
        if self.name != "cost-aware":
            return self.eager
        if not budget.pays(premium_s, self.costs.known_s(waiting_slots)):
            return False
        budget.spend(premium_s)
        return True

    def partial_pays(self, budget: EarlyWorkBudget, slots: int) -> bool:
        """Known rows of ``slots`` token slots that do not fill a micro-batch: learnt now, they cost
        one more backward's fixed cost than in a full one, and nothing else (their rows would take
        the same per-slot work later). That pays where it is at most ``share`` of their own work and
        fits in the batch's allowance: groups close in waves, so rows left for a full micro-batch
        would otherwise wait for the end of the rollout. And at least ``min_partial_slots`` (half a
        micro-batch): on a loaded machine the fit's fixed cost is hard to tell from noise, and that
        bounds the extra backwards to one per half micro-batch whatever it says."""
        if self.name != "cost-aware":
            return self.eager
        premium = self.costs.fixed_s
        if slots < self.min_partial_slots or not budget.within(premium) or premium > self.share * self.costs.known_s(slots):
            return False
        budget.spend(premium)
        return True

    def open_pays(self, budget: EarlyWorkBudget, rows: int, waiting_slots: int) -> bool:
        """An open group's bucket of ``rows`` rows: (``open_ratio`` − 1) known rows' seconds each, beyond
        the same rows in known micro-batches."""
        premium = max(self.costs.open_ratio - 1.0, 0.0) * self.costs.known_row_s * rows
        return self._decide(budget, premium, waiting_slots)
