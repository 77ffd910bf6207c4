"""Bootstrap intervals for the bench's medians and speedups (docs/bench.md, "Intervals").

A row's steps are resampled with replacement (a fixed seed: the same JSON gives the same
interval), the median taken each time, and the 5th and 95th percentiles of those medians are the
90% interval. A speedup, sync's median step over a row's, resamples the two rows independently.
Steps of one row come from alternating rounds in fresh processes; they are treated as exchangeable,
so an interval says how far the median moves with the steps drawn, not how far a different machine
would move it.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence

RESAMPLES = 2000
LEVEL = 0.90


def _percentiles(draws: list[float]) -> tuple[float, float]:
    draws = sorted(draws)
    tail = (1.0 - LEVEL) / 2
    lo = draws[int(tail * (len(draws) - 1))]
    hi = draws[int(round((1.0 - tail) * (len(draws) - 1)))]
    return lo, hi


def _medians(values: Sequence[float], rng: random.Random) -> list[float]:
    n = len(values)
    return [statistics.median(rng.choices(values, k=n)) for _ in range(RESAMPLES)]


def median_interval(values: Sequence[float], seed: int = 0) -> tuple[float, float] | None:
    """The bootstrap 90% interval of the median of ``values``; None for fewer than 2 values."""
    if len(values) < 2:
        return None
    return _percentiles(_medians(list(values), random.Random(seed)))


def ratio_interval(reference: Sequence[float], values: Sequence[float], seed: int = 0) -> tuple[float, float] | None:
    """The bootstrap 90% interval of median(reference) / median(values) (a speedup over the
    reference); None unless both have 2 values or more."""
    if len(reference) < 2 or len(values) < 2:
        return None
    rng = random.Random(seed)
    ref, row = _medians(list(reference), rng), _medians(list(values), rng)
    return _percentiles([a / b for a, b in zip(ref, row)])


def spans_one(interval: tuple[float, float] | None) -> bool:
    """Whether a speedup's interval admits 1 (no difference): such a ratio is not a result."""
    return interval is not None and interval[0] <= 1.0 <= interval[1]
