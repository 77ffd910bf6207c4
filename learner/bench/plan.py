"""``--quick``'s time budget: how many steps per run fit in what is left of it.

The bench's wall time is mostly fixed per run (a fresh ``thundersync train`` process: ~7 s
of imports, model load, the warm-up step) plus steps whose length moves with the machine:
on this 2-vCPU VM one trajectory's backward took 8 ms in one hour and 13-16 ms in the next,
so a fixed step count finished ``--quick`` in 4.5 minutes or in 6. After the calibration
runs, which measure both costs on the machine as it is now, the bench picks the most steps
per run (at most ``QUICK_STEPS``, at least a warm-up and two measured ones) whose estimated
total fits the budget.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any
from learner.timeline import Metric
from learner.registries.schedules import BASELINE  # a row is named after its schedule (+ a variant)

# the acceptance is 5 minutes; the plan keeps a margin for the VM's drift during the runs
QUICK_BUDGET_S = 270.0
# the refining calibration run may take this share of the budget to run the main runs' length
QUICK_REFINE_SHARE = 0.15
# planning guess for a pipelined schedule's step: its bound over this efficiency (measured
# 0.90-0.98 for async and streaming near balance; fully-async runs faster)
PLAN_EFFICIENCY = 0.85


@dataclass
class RunCost:
    """What one calibration (sync) run cost: its process wall time and its steps."""

    wall_s: float
    step_s: list[float]  # timing_s/step of every step, warm-up first

    @property
    def steady_step_s(self) -> float:
        """Median step after the warm-up one."""
        return statistics.median(self.step_s[1:] or self.step_s)

    @property
    def fixed_s(self) -> float:
        """Start-up, teardown and the warm-up step's extra, over the steady steps."""
        return max(self.wall_s - self.steady_step_s * len(self.step_s), 0.0)


def run_cost(wall_s: float, events: list[dict[str, Any]]) -> RunCost:
    return RunCost(wall_s, [e["values"][Metric.STEP_S] for e in events if e.get("type") == "metrics"])


def plan_steps(left_s: float, fixed_s: float, step_s: dict[str, float], drains: dict[str, int], rounds: int,
               most: int, least: int) -> tuple[int, float]:
    """(steps per run, estimated seconds) for ``rounds`` runs of each schedule in ``step_s``
    (its estimated step time), each run ``steps + drains[schedule]`` steps: the most steps
    in ``least .. most`` whose estimate fits ``left_s``; ``least`` when none does."""
    def cost(n: int) -> float:
        return rounds * sum(fixed_s + (n + drains.get(name, 0)) * s for name, s in step_s.items())

    for n in range(most, least - 1, -1):
        if cost(n) <= left_s:
            return n, cost(n)
    return least, cost(least)


def refine_run_steps(short: int, full: int, fixed_s: float, sync_step_s: float) -> int:
    """Steps of the refining calibration run: the main runs' ``full`` length when that costs at
    most QUICK_REFINE_SHARE of the budget, else ``short``. A step's rollout makespan depends on
    its batch (the same seed gives the same batches in every run: one batch's R was 0.77 s and
    the next's 0.63 s, the same in two runs), so a calibration that measures batches 1-2 while
    the main runs measure 1-5 aims at another R (--quick landed at R/L 0.84 for a target of 1)."""
    return full if fixed_s + full * sync_step_s <= QUICK_REFINE_SHARE * QUICK_BUDGET_S else short


def step_estimates(schedules: list[str], sync_step_s: float, rollout_s: float, learner_s: float) -> dict[str, float]:
    """Planning estimates: sync as measured by the calibration run; the others at their bound
    max(R, L) over PLAN_EFFICIENCY."""
    overlapped = max(rollout_s, learner_s) / PLAN_EFFICIENCY
    return {name: sync_step_s if name == BASELINE else overlapped for name in schedules}
