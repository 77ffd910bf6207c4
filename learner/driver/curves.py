"""The curves of an RL run that are functions of the step's trajectories and the learner's
statistics: reward spread, response-length distribution, policy loss, entropy, KL, learning rate
(names as verl's where one exists; docs/spans.md)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from learner.timeline import Metric
from learner.trajectory import Trajectory

def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation between closest ranks (numpy's default)."""
    pos = q * (len(sorted_values) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def trajectory_curves(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Reward std (population) / min / max and generated tokens per trajectory (mean, p50, p90,
    min, max) over the step's trajectories."""
    rewards = [t.reward for t in trajs]
    mean = sum(rewards) / len(rewards)
    lengths = sorted(float(t.n_scored) for t in trajs)
    prefix = Metric.RESPONSE_LENGTH
    return {
        Metric.REWARD_STD: math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)),
        Metric.REWARD_MIN: min(rewards), Metric.REWARD_MAX: max(rewards),
        f"{prefix}mean": sum(lengths) / len(lengths), f"{prefix}p50": percentile(lengths, 0.5),
        f"{prefix}p90": percentile(lengths, 0.9), f"{prefix}min": lengths[0], f"{prefix}max": lengths[-1],
    }


def learner_curves(per_rank: Sequence[dict], lr: float | None) -> dict[str, float]:
    """Policy loss, entropy and KL to the reference as the learner tallied them
    (``learner.grad.loss_tally``; absent when it did not), and the step's learning rate.

    ``per_rank``: the learner's stats, one per data-parallel rank (one for a single learner).
    Each rank normalised its share by the whole batch's normaliser, so the loss is their sum;
    the entropy and KL are means over each rank's tokens, combined by those counts."""
    values = {}
    losses = [s["pg_loss"] for s in per_rank if "pg_loss" in s]
    if losses:
        values[Metric.PG_LOSS] = float(sum(losses))
    for stat, count, name in (("entropy", "entropy_tokens", Metric.ENTROPY), ("kl_ref", "kl_tokens", Metric.KL_REF)):
        weighted = [(s[stat], s.get(count, 1.0)) for s in per_rank if stat in s]
        total = sum(n for _, n in weighted)
        if weighted and total > 0:
            values[name] = sum(v * n for v, n in weighted) / total
    if lr is not None:
        values[Metric.LR] = float(lr)
    return values
