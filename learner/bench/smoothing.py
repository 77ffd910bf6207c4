"""The exponential moving average that the race and the compare page smooth rewards with."""

from __future__ import annotations


def smoothed(values: list[float], weight: float) -> list[float]:
    """Each value is weight x the previous average + (1 - weight) x it; the first is itself."""
    out, avg = [], None
    for v in values:
        avg = v if avg is None else weight * avg + (1 - weight) * v
        out.append(avg)
    return out
