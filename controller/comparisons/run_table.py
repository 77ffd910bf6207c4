"""The runs list as an analysis table: per run, figures from its stored step metrics (median step,
final and smoothed reward, learner idle, staleness, and the speedup over its comparison's sync
run), any config field or the launch overrides as extra columns, a sort on any column (names in
natural order), rows grouped by any column with each group's median step and mean final reward
and their 90% intervals, and the list's query parameters checked (a bad one is an error with the
field's name, never silently ignored)."""

from __future__ import annotations

import random
import re
import statistics
from dataclasses import dataclass, field

from learner.bench.intervals import median_interval
from learner.config import SCHEDULES
from learner.timeline import Metric

from controller.config_merge import config_has_field
from controller.comparisons.compare import DEFAULT_SMOOTHING, median_of, step_figures, step_rows
from controller.models import Run
from learner.registries.schedules import BASELINE, schedule_kind

# ?sort=<key> (ascending) or -<key>: key -> (header, the database field; None: computed from the
# step metrics, sorted in Python over every run the filters keep)
COLUMNS = {
    "name": ("Run", None),  # natural order of the shown name ("run 2" before "run 10"), in Python
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
# ?col= (repeatable): a dotted config field (``train.schedule``, ``seed``) or ``overrides``, shown as
# a column; each also sorts (?sort=col:train.lr) and groups (?group=col:train.lr)
MAX_EXTRA_COLUMNS = 4
OVERRIDES_COLUMN = "overrides"
MISSING = "—"


def config_value(run: Run, path: str):
    """The run's value of a dotted config field (its merged config: every default filled in),
    or its launch overrides as ``field=value`` text; None when it has none."""
    if path == OVERRIDES_COLUMN:
        return ", ".join(f"{k}={v}" for k, v in sorted((run.overrides or {}).items())) or None
    return config_path(run.config, path)


def config_path(config: dict, path: str):
    """The value at a dotted path of a stored config, or None."""
    value = config
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def shown(value) -> str:
    return MISSING if value is None else value if isinstance(value, str) else repr(value) if isinstance(value, float) \
        else str(value)


def natural_key(text: str) -> tuple:
    """"run 2" before "run 10", case ignored: digits compare as numbers."""
    return tuple((0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text.lower()))


def value_key(value) -> tuple:
    """A sort key over a column's mixed values: numbers by value, the rest by natural text."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return (1, 0.0, natural_key(shown(value)))
    return (0, float(value), ())


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
    columns: list[str] = field(default_factory=list)  # extra columns: config fields or "overrides"
    errors: list[str] = field(default_factory=list)


def config_column(name: str) -> bool:
    return name == OVERRIDES_COLUMN or config_has_field(name)


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
    asked = [c for raw in params.getlist("col") for c in re.split(r"[\s,]+", raw) if c]  # "train.lr seed" or repeated
    for name in dict.fromkeys(asked):
        if len(query.columns) >= MAX_EXTRA_COLUMNS:
            query.errors.append(f"col: at most {MAX_EXTRA_COLUMNS} config columns")
            break
        if config_column(name):
            query.columns.append(name)
        else:
            query.errors.append(f"col: “{name[:60]}” is not a config field (e.g. train.lr, seed) nor "
                                f"{OVERRIDES_COLUMN}")
    group = params.get("group", "").strip()
    if group in GROUPS or not group or (group.startswith("col:") and config_column(group[4:])):
        query.group = group
    else:
        query.errors.append(f"group: no grouping “{group[:40]}” (one of {', '.join(GROUPS)}, or col:<config "
                            f"field> such as col:train.schedule)")
    sort = params.get("sort", DEFAULT_SORT).strip() or DEFAULT_SORT
    key = sort.lstrip("-")
    if key in COLUMNS or (key.startswith("col:") and config_column(key[4:])):
        query.sort = sort
    else:
        query.errors.append(f"sort: no column “{sort[:40]}” (one of {', '.join(COLUMNS)}, or col:<config field>; "
                            "'-' first for descending)")
    return query


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
    syncs = list(Run.objects.filter(comparison_id__in=comparisons, schedule__kind=BASELINE).order_by("id"))
    rows = step_rows(sorted({r.pk for r in runs} | {s.pk for s in syncs}))
    sync_step = {s.pk: median_of(rows[s.pk], Metric.STEP_S) for s in syncs}
    for r in runs:
        r.figures = step_figures(rows[r.pk])
        refs = sync_references(r, syncs) if r.comparison_id else []
        # a sync run is the reference of its comparison, not a ratio against its own repeats
        r.figures["reference"] = schedule_kind(r.schedule.kind).baseline and bool(refs)
        steps = [sync_step[s.pk] for s in refs] if not r.figures["reference"] else []
        ref_s = statistics.median([v for v in steps if v is not None] or [0.0])
        r.figures["speedup"] = ref_s / r.figures["step_s"] if ref_s and r.figures["step_s"] else None
    return runs


def sorted_runs(runs, sort: str):
    """The runs in ``sort``'s order (newest first among equals): a queryset for a database column
    (only the shown page gets its figures), else a list of every run with its figures, a run
    without the figure last whichever the direction."""
    key, descending = sort.lstrip("-"), sort.startswith("-")
    if key == "name" or key.startswith("col:"):
        listed = with_table_figures(list(runs.order_by("-created", "-id")))
        value = (lambda r: natural_key(str(r))) if key == "name" else (lambda r: value_key(config_value(r, key[4:])))
        listed.sort(key=value, reverse=descending)  # stable: newest first among equals
        return listed
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
    if query.group.startswith("col:"):
        path = query.group[4:]
        for r in listed:
            r.group = shown(config_value(r, path))
    else:
        label = GROUPS[query.group]
        for r in listed:
            r.group = label(r)
    listed.sort(key=lambda r: natural_key(r.group))  # stable: the sort's order inside a group
    stats = {name: group_stats([r for r in listed if r.group == name]) for name in {r.group for r in listed}}
    for r in listed:
        r.group_stats = stats[r.group]
    return listed


def group_stats(runs: list[Run]) -> dict:
    """A group's runs summed up: their count, the median of their median steps and the mean of
    their final rewards, each with its 90% bootstrap interval over the runs (None below 2 runs
    with the figure), as W&B's grouped rows are read."""
    steps = [r.figures["step_s"] for r in runs if r.figures["step_s"] is not None]
    rewards = [r.figures["final_reward"] for r in runs if r.figures["final_reward"] is not None]
    return {"runs": len(runs),
            "step_s": statistics.median(steps) if steps else None, "step_ci": median_interval(steps),
            "reward": statistics.fmean(rewards) if rewards else None, "reward_ci": mean_interval(rewards)}


def mean_interval(values: list[float], resamples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """The bootstrap 90% interval of the mean of ``values``; None for fewer than 2."""
    if len(values) < 2:
        return None
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(resamples))
    return means[int(0.05 * (resamples - 1))], means[int(round(0.95 * (resamples - 1)))]


def with_columns(runs, columns: list[str]):
    """Each run with ``extra``: its shown value of every extra column, in order."""
    for r in runs:
        r.extra = [shown(config_value(r, c)) for c in columns]
    return runs
