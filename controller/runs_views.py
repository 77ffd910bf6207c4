"""Runs you can organise: one list of every run across your experiments (search, filters, sort,
pages), tags and a note per run and per comparison, and deleting a run with its files."""

import shutil

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Q
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from learner.config import SCHEDULES

from .forms import NoteForm
from .models import Comparison, Run, join_tags
from .runlog import run_dir
from .views import owned_runs, with_figures

RUNS_PER_PAGE = 25
# ?sort= values: the column and its direction (a leading "-": newest / most first)
SORTS = {"-created": "newest", "created": "oldest", "name": "name", "-steps": "most steps", "status": "status",
         "experiment": "experiment"}
SORT_FIELDS = {"experiment": "experiment__name", "-experiment": "-experiment__name"}


def filtered_runs(user, params) -> tuple:
    """(runs queryset, the filters as the form shows them) for the list's query parameters."""
    runs = owned_runs(user)
    chosen = {key: params.get(key, "").strip() for key in ("q", "schedule", "status", "tag", "experiment")}
    if chosen["q"]:
        q = chosen["q"]
        runs = runs.filter(Q(name__icontains=q) | Q(experiment__name__icontains=q) | Q(schedule__name__icontains=q)
                           | Q(note__icontains=q) | Q(tags__icontains=q))
    if chosen["schedule"] in SCHEDULES:
        runs = runs.filter(schedule__kind=chosen["schedule"])
    if chosen["status"] in Run.Status.values:
        runs = runs.filter(status=chosen["status"])
    if chosen["tag"]:
        runs = runs.filter(tags__icontains=f",{chosen['tag'].lower()},")
    if chosen["experiment"].isdigit():
        runs = runs.filter(experiment_id=int(chosen["experiment"]))
    sort = params.get("sort", "-created")
    sort = sort if sort in SORTS else "-created"
    return runs.order_by(SORT_FIELDS.get(sort, sort), "-id"), {**chosen, "sort": sort}


@login_required
def runs_list(request):
    runs, chosen = filtered_runs(request.user, request.GET)
    page = Paginator(runs, RUNS_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "page": page, "runs": with_figures(list(page.object_list)), "chosen": chosen, "query": query.urlencode(),
        "schedules": SCHEDULES, "statuses": Run.Status.values, "sorts": SORTS,
        "experiments": request.user.experiments.order_by("name"),
        "tags": sorted({t for tags in owned_runs(request.user).values_list("tags", flat=True) for t in tags.split(",") if t}),
    }
    return render(request, "runs.html", context)


def annotate(request, target, back: str):
    form = NoteForm(request.POST)
    if form.is_valid():
        target.tags, target.note = join_tags(form.cleaned_data["tags"]), form.cleaned_data["note"]
        target.save(update_fields=["tags", "note"])
        messages.info(request, f"Saved the tags and note of {target}.")
    else:
        messages.warning(request, "; ".join(f"{field}: {' '.join(errs)}" for field, errs in form.errors.items()))
    return redirect(back)


@login_required
@require_POST
def run_annotate(request, run_id: int):
    found = get_object_or_404(owned_runs(request.user), pk=run_id)
    return annotate(request, found, f"/runs/{found.pk}/")


@login_required
@require_POST
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
