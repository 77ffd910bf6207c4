"""JSON shapes shared by the API, the websocket and the exports (docs/web-contract.md)."""

from django.db.models import Max

from controller.models import Checkpoint, Comparison, Experiment, Run, Schedule, Span, StepMetric, SystemSample

# Same keys as the learner's JSONL span event, minus "type".
SPAN_FIELDS = ("seq", "step", "kind", "t0", "t1", "lane", "traj", "group", "turn", "policy_version", "tokens")


def iso(moment) -> str | None:
    return moment.isoformat() if moment else None


def experiment_json(experiment: Experiment) -> dict:
    return {
        "id": experiment.pk,
        "name": experiment.name,
        "description": experiment.description,
        "config": experiment.config,
        "created": iso(experiment.created),
    }


def schedule_json(schedule: Schedule) -> dict:
    return {
        "id": schedule.pk,
        "name": schedule.name,
        "kind": schedule.kind,
        "knobs": schedule.knobs,
        "global": schedule.owner_id is None,
    }


def last_seq(run_id: int) -> int:
    """Highest persisted span seq of the run; -1 before the first span."""
    found = Span.objects.filter(run_id=run_id).aggregate(m=Max("seq"))["m"]
    return -1 if found is None else found


def run_json(run: Run, seq: int | None = None, checkpoints: list[int] | None = None) -> dict:
    """One run; ``seq`` and ``checkpoints`` when already read for many runs (``runs_json``)."""
    return {
        "id": run.pk,
        "name": str(run),
        "status": run.status,
        "schedule": {"id": run.schedule_id, "name": run.schedule.name, "kind": run.schedule.kind},
        "experiment": {"id": run.experiment_id, "name": run.experiment.name},
        "steps": run.steps,
        "created": iso(run.created),
        "started": iso(run.started),
        "finished": iso(run.finished),
        "error": run.error,
        "summary": run.summary,
        "cancel_requested": run.cancel_requested,
        "last_seq": last_seq(run.pk) if seq is None else seq,
        "attempt": run.attempt,
        "checkpoints": list(run.checkpoints.values_list("step", flat=True)) if checkpoints is None else checkpoints,
        "overrides": run.overrides,
        "comparison": run.comparison_id,
    }


def runs_json(runs) -> list[dict]:
    """``run_json`` of each run, their last seqs and checkpoints read in two queries (not two a run)."""
    runs = list(runs)
    ids = [r.pk for r in runs]
    seqs = dict(Span.objects.filter(run_id__in=ids).order_by().values("run_id").annotate(m=Max("seq")).values_list("run_id", "m"))
    steps: dict[int, list[int]] = {}
    for run_id, step in Checkpoint.objects.filter(run_id__in=ids).order_by("run_id", "step").values_list("run_id", "step"):
        steps.setdefault(run_id, []).append(step)
    return [run_json(r, seqs.get(r.pk, -1), steps.get(r.pk, [])) for r in runs]


def comparison_json(comparison: Comparison) -> dict:
    runs = comparison.runs.select_related("experiment", "schedule").order_by("id")
    sweep = {"field": comparison.sweep_field, "values": comparison.sweep_values} if comparison.sweep_field else None
    return {"id": comparison.pk, "name": str(comparison), "experiment": comparison.experiment_id,
            "steps": comparison.steps, "repeats": comparison.repeats, "sweep": sweep,
            "url": f"/comparisons/{comparison.pk}/",
            "note": comparison.note, "tags": comparison.tag_list(), "created": iso(comparison.created),
            "runs": runs_json(runs)}


def spans_json(queryset, limit: int | None = None) -> list[dict]:
    rows = queryset.order_by("seq").values(*SPAN_FIELDS)
    return list(rows[:limit] if limit is not None else rows)


def metrics_json(run_id: int) -> list[dict]:
    return list(StepMetric.objects.filter(run_id=run_id).order_by("step").values("step", "values"))


def system_json(run_id: int) -> list[dict]:
    return list(SystemSample.objects.filter(run_id=run_id).order_by("t").values("t", "node", "values"))
