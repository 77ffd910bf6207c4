"""What a run's stored spans say about the work its window produced and the trajectories it
trained, by the bench's own definitions (docs/bench-report.md, "Equal-work windows" and "Throughput and
what was trained"), for the compare page's pooled rows (controller/comparisons/pooled.py).

- ``window_counts``: over the run's timed steps, the window's seconds, the trajectories trained
  (steps x batch), and those produced for training (rewards inside the window, one
  ``rollout.verify`` span each, less the members of groups dropped as too stale): the parts of
  the equal-work step (``learner.bench.window.charged_step``), summed over a group's runs.
- ``trained_tokens``: every trained trajectory's generated tokens (its generate and draft spans;
  fully-async's rollout spans carry their trained step once the controller applied the
  ``assignment`` event), for ``learner.bench.trained.decile_share`` against sync's.
"""

from __future__ import annotations

from django.db.models import Sum

from learner.timeline import Kind, Metric

from controller.models import Run, Span


def _number(row: dict, key: str) -> float | None:
    value = row.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def window_counts(run: Run, rows: list[dict]) -> tuple[float, int, int, int] | None:
    """(window seconds, steps, trajectories trained, produced) over the run's timed steps; None
    without a timed step."""
    timed = [r for r in rows if _number(r, Metric.T_START) is not None and _number(r, Metric.T_END) is not None]
    if not timed:
        return None
    train = (run.config or {}).get("train", {})
    group = int(train.get("group_size") or 1)
    batch = int(train.get("prompts_per_step") or 0) * group
    t0, t1 = _number(timed[0], Metric.T_START), _number(timed[-1], Metric.T_END)
    finished = Span.objects.filter(run=run, kind=Kind.VERIFY, lane__startswith="rollout/", t1__gt=t0, t1__lte=t1).count()
    dropped = sum(_number(r, Metric.DROPPED_GROUPS) or 0.0 for r in timed) * group
    return t1 - t0, len(timed), batch * len(timed), max(int(finished - dropped), 0)


def trained_tokens(run: Run) -> list[int]:
    """Generated tokens of each trajectory the run trained (its rollout spans with a step)."""
    per_traj = (Span.objects.filter(run=run, kind__in=(Kind.GENERATE, Kind.DRAFT), traj__isnull=False, step__gte=0)
                .values("traj").annotate(tokens=Sum("tokens")))
    return [int(r["tokens"] or 0) for r in per_traj]
