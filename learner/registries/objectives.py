"""Training objectives (docs/math.md): what signal each learns from and how it may stream.

The streaming contract: a streamed backward runs before the batch is complete, so the part of
the loss not yet known must enter the gradient linearly. GRPO's advantage A = (r − μ)/σ is
known only when the trajectory's group closes, and its token gradient is A · ∇log π_θ (linear in
A), so the learner keeps two running sums per group, S = Σ g_i and T = Σ r_i g_i, and applies
μ and σ at group close: (T − μS)/σ. OPD's signal (the teacher's per-token log-probs) is known
as soon as the teacher scored a turn, so each turn's backward runs then, with nothing deferred.
``tests/learner/test_registries.py`` checks both properties on every registered objective.
"""

from __future__ import annotations

from dataclasses import dataclass

# Every loss aggregation mode; an objective names the ones it can train exactly.
ALL_LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class Objective:
    name: str
    summary: str
    # "reward": one scalar per trajectory, normalised per group (needs a verifier, no teacher);
    # "teacher": per-token teacher log-probs per scored turn (needs a teacher model)
    signal: str
    loss_agg_modes: tuple[str, ...] = ALL_LOSS_AGG_MODES

    @property
    def group_advantage(self) -> bool:
        """Advantages from the group's rewards (μ and σ applied at group close)."""
        return self.signal == "reward"

    @property
    def teacher_scored(self) -> bool:
        """Learns from a teacher's per-token scores, turn by turn (the streaming unit is a turn)."""
        return self.signal == "teacher"


OBJECTIVES: dict[str, Objective] = {}


def register(objective: Objective) -> Objective:
    if objective.signal not in ("reward", "teacher"):
        raise ValueError(f"objective {objective.name}: signal must be reward or teacher, not {objective.signal}")
    OBJECTIVES[objective.name] = objective
    return objective


def objective(name: str) -> Objective:
    """The registered objective called ``name`` (KeyError naming the known ones otherwise)."""
    try:
        return OBJECTIVES[name]
    except KeyError:
        raise KeyError(f"algorithm.objective: {name!r} is not one of {', '.join(OBJECTIVES)}") from None


GRPO = register(Objective("grpo", "GRPO: group-normalised advantages from verifiable rewards", "reward"))
# Per-turn OPD streaming knows a turn's tokens but not |o_i| (the trajectory's total scored
# tokens) until its last turn, so the seq-mean-token-mean weight 1/|o_i| cannot be applied
# inside a turn's backward; the other modes' per-token weights are all 1.
OPD = register(Objective("opd", "on-policy distillation: reverse KL to a teacher, scored per turn", "teacher",
                         ("token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")))
NAMES: tuple[str, ...] = tuple(OBJECTIVES)
