"""The runs list as an analysis table: per run, figures from its stored step metrics (median step,
final and smoothed reward, learner idle, staleness, and the speedup over its comparison's sync
run), a sort on any column, and the list's query parameters checked (a bad one is an error with
the field's name, never silently ignored)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from learner.config import SCHEDULES
from learner.timeline import Metric

from .compare import DEFAULT_SMOOTHING, median_of, present, smoothed_rewards, step_rows
from .models import Run

# ?sort=<key> (ascending) or -<key>: key -> (header, the database field; None: computed from the
# step metrics, sorted in Python over every run the filters keep)
COLUMNS = {
    "name": ("Run", "name"),
    "experiment": ("Experiment", "experiment__name"),
    "schedule": ("Schedule", "schedule__name"),
    "status": ("Status", "status"),
    "steps": ("Steps", None),
    "step_s": ("Median step", None),
    "final_reward": ("Final reward", None),
    "reward_ema": (f"Reward EMA {DEFAULT_SMOOTHING}", None),
    "speedup": ("Speedup vs sync", None),
    "learner_idle": ("Learner idle", None),
    "staleness": ("Staleness", None),
    "tags": ("Tags", "tags"),
    "note": ("Note", "note"),
    "created": ("Created", "created"),
}
DEFAULT_SORT = "-created"
FILTERS = ("q", "schedule", "status", "tag", "experiment")
# ?group=: rows of one experiment, schedule preset or tag together (a run under its first tag),
# in the sort's order inside each group
GROUPS = {"experiment": lambda r: r.experiment.name, "schedule": lambda r: str(r.schedule),
          "tag": lambda r: (r.tag_list() or ["(no tag)"])[0]}


class ListError(ValueError):
    """A query parameter the list cannot honour: ``field`` names it."""

    def __init__(self, field_name: str, reason: str):
        super().__init__(reason)
        self.field = field_name


@dataclass
class ListQuery:
    """The runs list's parameters once checked: the filters as the form shows them, the sort, and
    the errors of those that were refused (each dropped, the rest still applied)."""

    chosen: dict = field(default_factory=dict)
    sort: str = DEFAULT_SORT
    group: str = ""
    errors: list[str] = field(default_factory=list)


def check_filter(name: str, value: str, experiment_ids: set[int]) -> None:
    if name == "schedule" and value not in SCHEDULES:
        raise ListError(name, f"no schedule “{value}” (one of {', '.join(SCHEDULES)})")
    if name == "status" and value not in Run.Status.values:
        raise ListError(name, f"no status “{value}” (one of {', '.join(Run.Status.values)})")
    if name == "experiment" and (not value.isdigit() or int(value) not in experiment_ids):
        raise ListError(name, f"no experiment #{value} among yours")


def read_query(params, experiment_ids: set[int]) -> ListQuery:
    query = ListQuery()
    for name in FILTERS:
        value = params.get(name, "").strip()
        try:
            if value and name not in ("q", "tag"):
                check_filter(name, value, experiment_ids)
            query.chosen[name] = value
        except ListError as err:
            query.chosen[name] = ""
            query.errors.append(f"{err.field}: {err}")
    group = params.get("group", "").strip()
    if group in GROUPS or not group:
        query.group = group
    else:
        query.errors.append(f"group: no grouping “{group[:40]}” (one of {', '.join(GROUPS)})")
    sort = params.get("sort", DEFAULT_SORT).strip() or DEFAULT_SORT
    if sort.lstrip("-") in COLUMNS:
        query.sort = sort
    else:
        query.errors.append(f"sort: no column “{sort[:40]}” (one of {', '.join(COLUMNS)}, '-' first for descending)")
    return query


def mean_of(rows: list[dict], key: str) -> float | None:
    found = present(rows, key)
    return statistics.fmean(found) if found else None


def step_figures(rows: list[dict]) -> dict:
    """A run's figures from its step metrics (``rows``, in step order)."""
    rewards = present(rows, Metric.REWARD_MEAN)
    ema = smoothed_rewards(rows, DEFAULT_SMOOTHING)
    return {"steps_done": len(rows), "step_s": median_of(rows, Metric.STEP_S),
            "final_reward": rewards[-1] if rewards else None, "reward_ema": ema[-1][1] if ema else None,
            "learner_idle": mean_of(rows, Metric.TRAINER_IDLE), "staleness": mean_of(rows, Metric.STALENESS_MEAN)}


def sync_references(run: Run, syncs: list[Run]) -> list[Run]:
    """The sync runs of ``run``'s comparison it is measured against: in a sweep, those launched
    with the same swept value (several with repeats)."""
    sweep = run.comparison.sweep_field if run.comparison_id else ""
    return [s for s in syncs if s.comparison_id == run.comparison_id
            and (not sweep or s.overrides.get(sweep) == run.overrides.get(sweep))]


def with_table_figures(runs: list[Run]) -> list[Run]:
    """Each run with ``figures`` (step_figures, and ``speedup``: its comparison's sync run's median
    step over its own, the median of the sync runs' with repeats; None outside a comparison with a
    sync run)."""
    comparisons = {r.comparison_id for r in runs if r.comparison_id}
    syncs = list(Run.objects.filter(comparison_id__in=comparisons, schedule__kind="sync").order_by("id"))
    rows = step_rows(sorted({r.pk for r in runs} | {s.pk for s in syncs}))
    sync_step = {s.pk: median_of(rows[s.pk], Metric.STEP_S) for s in syncs}
    for r in runs:
        r.figures = step_figures(rows[r.pk])
        steps = [sync_step[s.pk] for s in sync_references(r, syncs)] if r.comparison_id else []
        ref_s = statistics.median([v for v in steps if v is not None] or [0.0])
        r.figures["speedup"] = ref_s / r.figures["step_s"] if ref_s and r.figures["step_s"] else None
    return runs


def sorted_runs(runs, sort: str):
    """The runs in ``sort``'s order (newest first among equals): a queryset for a database column
    (only the shown page gets its figures), else a list of every run with its figures, a run
    without the figure last whichever the direction."""
    key, descending = sort.lstrip("-"), sort.startswith("-")
    db_field = COLUMNS[key][1]
    if db_field is not None:
        return runs.order_by(f"-{db_field}" if descending else db_field, "-id")
    listed = with_table_figures(list(runs.order_by("-created", "-id")))
    figure = "steps_done" if key == "steps" else key
    known = [r for r in listed if r.figures[figure] is not None]
    known.sort(key=lambda r: r.figures[figure], reverse=descending)  # stable: newest first among equals
    return known + [r for r in listed if r.figures[figure] is None]


def grouped(runs, query: ListQuery):
    """The sorted runs with each one's ``group`` label, a group's runs together (groups by name,
    the sort kept inside each); unchanged without a grouping."""
    if not query.group:
        return runs
    listed = list(runs) if isinstance(runs, list) else with_table_figures(list(runs))
    label = GROUPS[query.group]
    for r in listed:
        r.group = label(r)
    return sorted(listed, key=lambda r: r.group.lower())  # stable: the sort's order inside a group
