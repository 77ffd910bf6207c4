"""What the four schedules decide, as pure functions over plain numbers (docs/schedules.md).

The driver (``driver/loop.py`` through ``driver/pipeline.py``) and the simulator
(``sim/engine.py``) both call these, so "the simulator follows the driver's rules" is held
by code, and ``tests/learner/test_rules_agreement.py`` checks it event by event.

Versions: version v is the policy after v optimizer steps (v = number of publishes so far);
step j trains at version j.
"""

from __future__ import annotations

from typing import Callable

from learner.registries.objectives import objective as objective_of
from learner.registries.schedules import ON_POLICY, schedule_kind  # noqa: F401  (ON_POLICY re-exported)


def lead(schedule: str, max_staleness: int) -> int:
    """How many versions the rollout may run ahead of the learner (k): 0 on-policy, 1 async,
    ``max_staleness`` fully-async."""
    lead = schedule_kind(schedule).lead
    return max_staleness if lead is None else lead


def staleness(trained_version: int, sampled_version: int) -> int:
    """The one definition: version trained on minus version that sampled the turn."""
    return trained_version - sampled_version


def within_staleness(version: int, sampled_version: int, max_staleness: int) -> bool:
    """fully-async freshness: a group whose oldest turn was sampled at ``sampled_version`` may
    still be trained at ``version``."""
    return staleness(version, sampled_version) <= max_staleness


def may_admit_group(live_groups: int, version: int, k: int, steps: int,
                    groups_through: Callable[[int], int]) -> bool:
    """fully-async: may one more group start now? A group started now is trained at a version
    >= its rank among the groups not dropped (``live_groups``) over the groups per step;
    start it only if that is within ``k`` versions of ``version`` and the run still needs it.
    ``groups_through(j)``: groups in the batches of steps 0..j. A dropped group frees its
    place: counting it would shrink the pipeline for good and, past k batches of drops,
    stall it."""
    return live_groups < min(groups_through(version + k), groups_through(steps - 1))


def batch_may_start(batch: int, published: int, k: int, previous_batch_received: bool) -> bool:
    """sync, streaming, async: may dispatch batch ``batch`` start now? Once version
    ``batch - k`` is published and every trajectory of the batch before it came back (async:
    one generate round per batch, overlapping the training of the previous one)."""
    return published >= batch - k and (batch == 0 or previous_batch_received)


def learns_on_arrival(schedule: str, objective: str, is_turn: bool) -> bool:
    """Is this item's backward run the moment it arrives? Streaming only: each trajectory
    (GRPO) or each scored turn (OPD; its trajectory closes the turn accounting at the
    barrier). sync holds everything until the batch's last reward; the off-policy schedules
    train whole batches."""
    return schedule_kind(schedule).learns_on_arrival and is_turn == objective_of(objective).teacher_scored


def off_policy(schedule: str) -> bool:
    """async and fully-async train with importance ratios against behaviour log-probs, and
    their publishes do not wait for the replicas (sync and streaming: ratio 1, and every
    replica loads the new weights inside the publish)."""
    return not schedule_kind(schedule).on_policy
