"""What one engine forward costs, learned online from the engine's own forwards (docs/speculation.md,
"Priority"): seconds ~ a + b * size, fitted by least squares with exponential forgetting, one
line for decode steps (size: rows in the batch) and one for prefills (size: rows x padded
columns forwarded). On a CPU a decode step's cost grows about linearly with its rows (compute
bound), so a draft row is not free: drafts are started only where their forward ends before the
next current row is due (``rollout/speculation/drafts.py``)."""

from __future__ import annotations

FORGET = 0.98  # weight of a sample after the next one: ~50 forwards of memory, so the fit follows the load
MIN_SAMPLES = 3  # no prediction from fewer forwards


class CostLine:
    """Exponentially weighted least-squares line through (size, seconds)."""

    def __init__(self):
        self.n = 0
        self.w = self.sx = self.sy = self.sxx = self.sxy = 0.0

    def add(self, size: float, seconds: float) -> None:
        f = FORGET
        self.n += 1
        self.w, self.sx, self.sy = f * self.w + 1.0, f * self.sx + size, f * self.sy + seconds
        self.sxx, self.sxy = f * self.sxx + size * size, f * self.sxy + size * seconds

    def predict(self, size: float) -> float | None:
        """Seconds for a forward of ``size``, or None before ``MIN_SAMPLES`` forwards."""
        if self.n < MIN_SAMPLES:
            return None
        mx, my = self.sx / self.w, self.sy / self.w
        var = self.sxx / self.w - mx * mx
        slope = max(0.0, (self.sxy / self.w - mx * my) / var) if var > 1e-12 else 0.0
        if var <= 1e-12:  # one size seen: proportional through the origin (over-estimates smaller ones, never larger)
            return my * size / mx if mx > 0 else my
        return max(my + slope * (size - mx), 0.0)


class StepCost:
    """The engine's forward costs: ``decode`` by batch rows, ``prefill`` by rows x columns."""

    def __init__(self):
        self.decode, self.prefill = CostLine(), CostLine()

    def call(self, rows: int, prefill_rows: int, prefill_cols: int) -> float | None:
        """Predicted seconds of a draft call's first forward pair: prefill its rows, then one decode
        step of the batch they make (``rows``), or None while either line has too few samples."""
        p, d = self.prefill.predict(prefill_rows * prefill_cols), self.decode.predict(rows)
        return None if p is None or d is None else p + d
