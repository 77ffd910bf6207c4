"""Runs you can organise: one list of every run across your experiments (search, filters, sort,
pages), tags and a note per run and per comparison, and deleting a run with its files."""

import shutil

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Q, TextField
from django.db.models.functions import Cast
from django.shortcuts import get_object_or_404, redirect, render

from learner.config import SCHEDULES

from controller.forms import NoteForm
from controller.models import Comparison, Run, join_tags
from controller.comparisons.run_table import (COLUMNS, GROUPS, OVERRIDES_COLUMN, ListQuery, config_column, config_path, grouped, read_query,
                        shown, sorted_runs, with_columns, with_table_figures)
from controller.supervision.runlog import run_dir
from controller.views import owned_runs
from controller.jsonapi.decorators import form_post
from controller.templatetags.notes import SESSION_KEY as NOTES_DRAFT

RUNS_PER_PAGE = 25
# the sort menu's choices (every column header sorts too, either way: controller/comparisons/run_table.py)
SORT_CHOICES = {"-created": "newest", "created": "oldest", "name": "name", "-steps": "most steps", "status": "status",
                "experiment": "experiment", "step_s": "fastest median step", "-final_reward": "highest final reward",
                "-speedup": "highest speedup vs sync"}


def filtered_runs(user, query: ListQuery):
    """The user's runs that ``query``'s (checked) filters keep."""
    runs, chosen = owned_runs(user), query.chosen
    if chosen["q"] and (match := field_match(chosen["q"])):
        # "rollout.speculation.enabled=true": the runs whose merged config holds that value
        path, wanted = match
        kept = [pk for pk, config in runs.values_list("pk", "config")
                if shown(config_path(config, path)).lower() == wanted]
        runs = runs.filter(pk__in=kept)
    elif chosen["q"]:
        q = chosen["q"]
        # what a user wrote too: the launch overrides, the experiment's config as written, the
        # preset's knobs ("speculation" finds the runs launched with it)
        runs = runs.annotate(overrides_text=Cast("overrides", TextField()), knobs_text=Cast("schedule__knobs", TextField()))
        runs = runs.filter(Q(name__icontains=q) | Q(experiment__name__icontains=q) | Q(schedule__name__icontains=q)
                           | Q(note__icontains=q) | Q(tags__icontains=q) | Q(overrides_text__icontains=q)
                           | Q(experiment__config_text__icontains=q) | Q(knobs_text__icontains=q))
    if chosen["schedule"]:
        runs = runs.filter(schedule__kind=chosen["schedule"])
    if chosen["status"]:
        runs = runs.filter(status=chosen["status"])
    if chosen["tag"]:
        runs = runs.filter(tags__icontains=f",{chosen['tag'].lower()},")
    if chosen["experiment"]:
        runs = runs.filter(experiment_id=int(chosen["experiment"]))
    return runs.select_related("comparison")


def field_match(q: str) -> tuple[str, str] | None:
    """``train.lr=3e-4`` in the search box: (config field, the value as text, lower case), when
    the left side names a config field."""
    path, sep, value = q.partition("=")
    path = path.strip()
    if not sep or not config_column(path) or path == OVERRIDES_COLUMN:
        return None
    return path, value.strip().lower()


def header_links(params, sort: str, columns: list[str] = ()) -> list[dict]:
    """Each column's header: its link sorts by it (ascending first, reversed when already so);
    the extra config columns (``col:<field>``) after the schedule."""
    base = params.copy()
    for name in ("sort", "page"):
        base.pop(name, None)
    headers = []
    listed = list(COLUMNS.items())
    at = [k for k, _ in listed].index("schedule") + 1
    listed[at:at] = [(f"col:{c}", (c, None)) for c in columns]
    for key, (text, _) in listed:
        base["sort"] = f"-{key}" if sort == key else key
        state = "ascending" if sort == key else "descending" if sort == f"-{key}" else "none"
        headers.append({"key": key, "text": text, "href": f"?{base.urlencode()}", "sort": state,
                        "config": key.startswith("col:")})
    return headers


def sort_label(sort: str) -> str:
    """The sort menu's text for a header's sort (``-step_s``: "median step, highest first")."""
    key = sort.lstrip("-")
    text = key[4:] if key.startswith("col:") else COLUMNS[key][0].lower()
    return f"{text}, {'highest' if sort.startswith('-') else 'lowest'} first"


@login_required
def runs_list(request):
    experiments = request.user.experiments.order_by("name")
    query = read_query(request.GET, set(experiments.values_list("id", flat=True)))
    runs = grouped(sorted_runs(filtered_runs(request.user, query), query.sort), query)
    page = Paginator(runs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    shown = list(page.object_list)
    if shown and not hasattr(shown[0], "figures"):  # sorted by a database column: this page's figures only
        with_table_figures(shown)
    with_columns(shown, query.columns)
    params = request.GET.copy()
    params.pop("page", None)
    context = {
        "page": page, "runs": shown, "chosen": {**query.chosen, "sort": query.sort, "group": query.group},
        "query": params.urlencode(), "groups": GROUPS,
        "errors": query.errors, "headers": header_links(request.GET, query.sort, query.columns),
        "columns": query.columns, "group_choices": [*GROUPS, *(f"col:{c}" for c in query.columns)],
        "schedules": SCHEDULES, "statuses": Run.Status.values, "experiments": experiments,
        "sorts": {**SORT_CHOICES, **({} if query.sort in SORT_CHOICES else {query.sort: sort_label(query.sort)})},
        "tags": sorted({t for tags in owned_runs(request.user).values_list("tags", flat=True) for t in tags.split(",") if t}),
    }
    return render(request, "runs.html", context, status=400 if query.errors else 200)


def annotate(request, target, back: str):
    form = NoteForm(request.POST)
    if form.is_valid():
        target.tags, target.note = join_tags(form.cleaned_data["tags"]), form.cleaned_data["note"]
        target.save(update_fields=["tags", "note"])
        messages.info(request, f"Saved the tags and note of {target}.")
    else:
        said = "; ".join(f"{field}: {' '.join(errs)}" for field, errs in form.errors.items())
        messages.warning(request, said)
        # the form shows what was typed and why it was refused (controller/templatetags/notes.py)
        request.session[NOTES_DRAFT] = {"action": request.path, "tags": request.POST.get("tags", "")[:500],
                                        "note": request.POST.get("note", "")[:10_000], "error": said}
    return redirect(back)


@login_required
@form_post
def run_annotate(request, run_id: int):
    found = get_object_or_404(owned_runs(request.user), pk=run_id)
    return annotate(request, found, f"/runs/{found.pk}/")


@login_required
@form_post
def comparison_annotate(request, comparison_id: int):
    found = get_object_or_404(Comparison, pk=comparison_id, experiment__owner=request.user)
    return annotate(request, found, f"/comparisons/{found.pk}/")


@login_required
def run_delete(request, run_id: int):
    """GET: what goes with the run; POST: delete it, its spans, metrics and its directory (config,
    log, checkpoints, policy). Refused while it is queued or running: cancel it first."""
    found = get_object_or_404(owned_runs(request.user), pk=run_id)
    in_flight = found.status not in Run.FINISHED
    if request.method == "POST" and not in_flight:
        name, experiment = str(found), found.experiment_id
        directory = run_dir(found.pk)
        found.delete()
        shutil.rmtree(directory, ignore_errors=True)
        messages.info(request, f"Deleted {name} and its files.")
        return redirect("experiment", experiment)
    context = {"run": found, "in_flight": in_flight, "spans": found.spans.count(), "files": run_dir(found.pk).exists()}
    return render(request, "run_delete.html", context, status=409 if in_flight and request.method == "POST" else 200)


@login_required
@form_post
def comparison_delete(request, comparison_id: int):
    """Delete a comparison (its name, tags, note, sweep); its runs are kept, each on its own."""
    found = get_object_or_404(Comparison, pk=comparison_id, experiment__owner=request.user)
    name, experiment, kept = str(found), found.experiment_id, found.runs.count()
    found.delete()  # Run.comparison is SET_NULL
    messages.info(request, f"Deleted the comparison {name}; its {kept} run{'s' if kept != 1 else ''} kept.")
    return redirect("experiment", experiment)
