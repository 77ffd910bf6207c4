"""fully-async's rollout spans, re-tagged with the step that trained them (docs/spans.md, "Assignment").

fully-async rolls a group out before any step takes it, so the learner stamps its rollout spans
with step -1; when a step takes a batch of groups the learner emits
``{"type": "assignment", "step": s, "trajs": [...]}`` after those spans and before the step's
learner spans. The ingestor applies it at its next flush: to the spans still buffered, and to the
stored ones (one UPDATE per step, through the (run, step) index), in the flush's transaction, so a
page never sees a trained trajectory's rollout outside its step. ``policy_version`` keeps the
version that sampled each span; a group dropped as too stale keeps step -1 (no step trained it).
"""

from __future__ import annotations

from controller.limits.limits import INT32_MAX
from controller.models import Span

UNASSIGNED = -1  # the step of a rollout span no step has taken yet
MAX_TRAJS = 1_000_000  # one step's batch: far above any quota's trajectories per step


def assignment_from_event(event: dict) -> tuple[int, list[int]]:
    """(step, trajectory ids) of an assignment event; ValueError naming the bad field."""
    step, trajs = event.get("step"), event.get("trajs")
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= INT32_MAX:
        raise ValueError("assignment.step: expected a step number (a non-negative 32-bit integer)")
    if (not isinstance(trajs, list) or len(trajs) > MAX_TRAJS
            or not all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT32_MAX for t in trajs)):
        raise ValueError("assignment.trajs: expected a list of trajectory ids (non-negative 32-bit integers)")
    return step, trajs


class Assignments:
    """The assignments read since the ingestor's last flush."""

    def __init__(self) -> None:
        self.pending: list[tuple[int, list[int]]] = []

    def take(self, event: dict) -> None:
        self.pending.append(assignment_from_event(event))

    def apply(self, run_id: int, buffered: list[dict]) -> None:
        """Re-tag ``buffered`` span rows (before they are written) and the run's stored spans,
        inside the flush's transaction; the assignments stay pending until ``committed`` (a failed
        flush applies them again: re-tagging is idempotent)."""
        if not self.pending:
            return
        step_of = {t: step for step, trajs in self.pending for t in trajs}
        for row in buffered:
            if row["step"] == UNASSIGNED and row.get("traj") in step_of:
                row["step"] = step_of[row["traj"]]
        for step, trajs in self.pending:
            Span.objects.filter(run_id=run_id, step=UNASSIGNED, traj__in=trajs).update(step=step)

    def committed(self) -> list[tuple[int, list[int]]]:
        """The flush committed: what it applied (for the pages' frames), no longer pending."""
        applied, self.pending = self.pending, []
        return applied
