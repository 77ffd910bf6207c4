"""Pages (templates and their context are fixed by docs/web-contract.md)."""

import json

import yaml

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db import transaction
from django.db.models import Count
from django.http import FileResponse, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone

from learner.config import ConfigError

from controller.config_merge import flatten
from controller.comparisons.compare import CompareError, parse_run_ids, step_figures, step_rows
from controller.comparisons.fairness import comparable_latest, config_diff
from controller.forms import ComparisonForm, ExperimentForm, LaunchForm
from controller.launch_input import launch_error, sweep_of
from controller.supervision.launching import launch_comparison, launch_run, request_cancel
from controller.supervision.resuming import ResumeRefused, request_resume
from controller.models import Comparison, Experiment, Run, Schedule
from controller.limits.quotas import QuotaExceeded, check_stored
from controller.supervision.runlog import log_path, readable_log
from controller.jsonapi.decorators import form_post


def owned_runs(user):
    return Run.objects.filter(experiment__owner=user).select_related("experiment", "schedule")


def starter_config() -> str:
    """The new-experiment form starts from configs/quickstart.yaml (a tiny, quick run)."""
    path = settings.BASE_DIR / "configs" / "quickstart.yaml"
    return path.read_text() if path.exists() else ""


EXPERIMENTS_PER_PAGE = 50
EXPERIMENT_RUNS_SHOWN = 50
PICKER_RUNS = 200  # the compare page's picker: the newest runs (and the compared ones)  # the experiment page's newest runs; the runs list pages through all


@login_required
def experiments(request):
    status = 200
    if request.method == "POST":
        form = ExperimentForm(request.POST, instance=Experiment(owner=request.user))
        status = 400
        with transaction.atomic():  # the count and the insert under the user's row lock
            if form.is_valid():
                try:
                    check_stored(request.user, "experiments")
                    return redirect("experiment", form.save().pk)
                except QuotaExceeded as err:
                    form.add_error(None, err.message)
                    status = err.status
    else:
        form = ExperimentForm(initial={"config": starter_config()})
    owned = Experiment.objects.filter(owner=request.user).annotate(run_count=Count("runs")).order_by("-created", "-id")
    page = Paginator(owned, EXPERIMENTS_PER_PAGE).get_page(request.GET.get("page"))
    context = {"experiments": list(page.object_list), "page": page, "form": form}
    return render(request, "experiments.html", context, status=status)


def with_figures(runs: list[Run]) -> list[Run]:
    """Each run with ``figures`` (steps done, final reward, median step time, from its stored
    metrics) and ``duration_s`` (start to finish, or to now while it runs)."""
    rows = step_rows([r.pk for r in runs])
    now = timezone.now()
    for r in runs:
        r.figures = step_figures(rows[r.pk])
        r.duration_s = ((r.finished or now) - r.started).total_seconds() if r.started else None
    return runs


def experiment_page(request, experiment: Experiment, launch_form: LaunchForm, comparison_form: ComparisonForm | None = None):
    runs = with_figures(list(experiment.runs.select_related("schedule")[:EXPERIMENT_RUNS_SHOWN]))
    latest, why_not = comparable_latest(runs, {r.pk: r.figures["steps_done"] for r in runs})
    context = {
        "experiment": experiment,
        "runs": runs,
        "runs_count": experiment.runs.count(),
        "compare_latest": ",".join(str(r.pk) for r in latest),
        "compare_latest_why_not": why_not,
        "schedules": Schedule.objects.visible_to(request.user),
        "launch_form": launch_form,
        "comparison_form": comparison_form or ComparisonForm(user=request.user, experiment=experiment),
        "comparisons": experiment.comparisons.all()[:10],
    }
    invalid = launch_form.errors or (comparison_form is not None and comparison_form.errors)
    return render(request, "experiment.html", context, status=400 if invalid else 200)


@login_required
def experiment(request, experiment_id: int):
    found = get_object_or_404(Experiment, pk=experiment_id, owner=request.user)
    return experiment_page(request, found, LaunchForm(user=request.user))


def try_launch(form, schedule_field: str, start):
    """``start(cleaned_data)`` for a valid form, else None; a config or quota refusal becomes the
    form's error (on the field it names)."""
    if not form.is_valid():
        return None
    try:
        return start(form.cleaned_data)
    except (ConfigError, QuotaExceeded) as err:
        field, _, reason = launch_error(err, schedule_field, form.cleaned_data)
        form.add_error(field if field in form.fields else None, reason)
    return None


@login_required
@form_post
def launch(request, experiment_id: int):
    found = get_object_or_404(Experiment, pk=experiment_id, owner=request.user)
    form = LaunchForm(request.POST, user=request.user)
    run = try_launch(form, "schedule", lambda data: launch_run(
        found, data["schedule"], data["steps"], data["name"], overrides=data["overrides"]))
    return redirect("run", run.pk) if run else experiment_page(request, found, form)


@login_required
@form_post
def compare_schedules(request, experiment_id: int):
    """One action: the experiment under each chosen schedule, same steps and seed, as one
    comparison; then its compare page, live while the runs train."""
    found = get_object_or_404(Experiment, pk=experiment_id, owner=request.user)
    form = ComparisonForm(request.POST, user=request.user, experiment=found)
    comparison = try_launch(form, "schedules", lambda data: launch_comparison(
        found, data["schedules"], data["steps"], data["name"], data["overrides"], sweep_of(data), data["repeats"]))
    if comparison:
        return redirect("comparison", comparison.pk)
    return experiment_page(request, found, LaunchForm(user=request.user), form)


@login_required
def comparison(request, comparison_id: int):
    found = get_object_or_404(Comparison, pk=comparison_id, experiment__owner=request.user)
    chosen = list(owned_runs(request.user).filter(comparison=found).order_by("id"))
    return render_compare(request, chosen, {r.pk for r in chosen}, "", 200, found)


def launch_diff(run: Run) -> list[dict]:
    """What the run's config sets beyond its experiment's: the schedule preset's fields and the
    launch's own overrides (a sweep's value among them), each with where it came from."""
    flat = flatten(run.config)
    rows = [{"path": p, "value": flat.get(p, v), "source": f"schedule {run.schedule.name}"}
            for p, v in run.schedule.overrides().items() if p not in run.overrides]
    rows += [{"path": p, "value": flat.get(p, v), "source": "launch override"} for p, v in run.overrides.items()]
    return rows


@login_required
def run(request, run_id: int):
    found = get_object_or_404(owned_runs(request.user), pk=run_id)
    context = {
        "run": found,
        "ws_path": f"/ws/runs/{found.pk}/",
        "api_base": f"/api/runs/{found.pk}/",
        # YAML, as the experiment page shows its config: the full merged config, every default filled in
        "config_yaml": yaml.safe_dump(found.config, sort_keys=False),
        "launch_diff": launch_diff(found),
        "checkpoints": list(found.checkpoints.values_list("step", flat=True)),
        # the progress line's count until the websocket's replay has brought the metrics
        "steps_done": found.metrics.count(),
    }
    return render(request, "run.html", context)


@login_required
def run_log(request, run_id: int):
    """The learner's whole log as a download (empty before the learner wrote anything)."""
    found = get_object_or_404(owned_runs(request.user), pk=run_id)
    name, path = f"run-{found.pk}-learner.log", log_path(found.pk)
    try:
        if readable_log(path):
            return FileResponse(open(path, "rb"), as_attachment=True, filename=name,
                                content_type="text/plain; charset=utf-8")
    except OSError:
        pass
    response = HttpResponse(b"", content_type="text/plain; charset=utf-8")  # nothing written yet
    response["Content-Disposition"] = f'attachment; filename="{name}"'
    return response


@login_required
@form_post
def resume(request, run_id: int):
    found = get_object_or_404(owned_runs(request.user), pk=run_id)
    try:
        request_resume(found)
        messages.info(request, f"Resuming {found} from its checkpoint after step {found.checkpoints.last().step}.")
    except (ResumeRefused, QuotaExceeded) as err:
        messages.warning(request, f"{found} cannot be resumed: {err}")
    return redirect("run", found.pk)


@login_required
@form_post
def cancel(request, run_id: int):
    found = get_object_or_404(owned_runs(request.user), pk=run_id)
    if not request_cancel(found):
        messages.warning(request, f"{found} has already {found.status}.")
    elif found.status == Run.Status.CANCELLED:  # it was still queued
        messages.info(request, f"Cancelled {found}.")
    else:  # the run page drops this message once the run has ended (static/js/live.js)
        messages.info(request, f"Cancelling {found}.", extra_tags="until-finished")
    return redirect("run", found.pk)


@login_required
def compare(request):
    """``?runs=1,2,3``: 2-4 of the user's runs side by side (no parameter: just the picker)."""
    mine = owned_runs(request.user)
    error, status, chosen = "", 200, []
    raw = request.GET.get("runs", "")
    asked = {int(p) for p in raw.split(",") if p.strip().isdigit()}  # stay ticked in the picker
    try:
        ids = parse_run_ids(raw)
    except CompareError as err:
        ids, error, status = [], f"{err.field}: {err}", 400
    if ids:
        found = {r.pk: r for r in mine.filter(pk__in=ids)}
        missing = [i for i in ids if i not in found]
        if missing:
            error, status = f"runs: no run {', '.join(f'#{i}' for i in missing)} among yours", 404
        else:
            chosen = [found[i] for i in ids]
    return render_compare(request, chosen, asked, error, status)


def render_compare(request, chosen: list[Run], asked: set[int], error: str, status: int,
                   comparison: Comparison | None = None):
    for r in chosen:  # a sweep's runs: the value each was launched with (its plot's x)
        swept = comparison.sweep_field if comparison else ""
        r.sweep_value_json = json.dumps(r.overrides.get(swept)) if swept else ""
    mine = owned_runs(request.user)
    picker = list(mine[:PICKER_RUNS])  # the newest; the runs list (paged) ticks any others to compare
    shown = {r.pk for r in picker}
    picker += [r for r in chosen if r.pk not in shown]
    context = {"runs": chosen, "all_runs": picker, "all_runs_count": mine.count(), "asked": asked,
               "comparison": comparison,
               "config_diff": config_diff(chosen) if chosen else [], "error": error}
    return render(request, "compare.html", context, status=status)
