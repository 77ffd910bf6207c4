"""Pages that change what is stored: edit, clone and delete an experiment; the schedule presets.

An edit changes what *new* runs get: a run keeps the full config it was launched with
(`Run.config`), so old runs are untouched.
"""

import shutil

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.db.models import Count
from django.shortcuts import get_object_or_404, redirect, render

from controller.forms import ExperimentForm, ScheduleForm
from controller.models import Experiment, Run, Schedule, Span
from controller.limits.quotas import QuotaExceeded, check_stored
from controller.supervision.runlog import run_dir
from controller.jsonapi.decorators import form_post


def owned_experiment(request, experiment_id: int) -> Experiment:
    return get_object_or_404(Experiment, pk=experiment_id, owner=request.user)


@login_required
def experiment_edit(request, experiment_id: int):
    found = owned_experiment(request, experiment_id)
    if request.method == "POST":
        form = ExperimentForm(request.POST, instance=found)
        if form.is_valid():
            form.save()
            messages.info(request, f"Saved {found}: new runs use this config; earlier runs keep theirs.")
            return redirect("experiment", found.pk)
    else:
        form = ExperimentForm(instance=found)
    context = {"experiment": found, "form": form}
    return render(request, "experiment_edit.html", context, status=400 if form.errors else 200)


@login_required
@form_post
def experiment_clone(request, experiment_id: int):
    found = owned_experiment(request, experiment_id)
    try:
        with transaction.atomic():
            check_stored(request.user, "experiments")
            copy = Experiment.objects.create(owner=request.user, name=f"{found.name} (copy)"[:200],
                                             description=found.description, config=found.config,
                                             config_text=found.config_text)
    except QuotaExceeded as err:
        messages.warning(request, f"{found} cannot be cloned: {err.message}")
        return redirect("experiment", found.pk)
    messages.info(request, f"Cloned {found} (no runs copied).")
    return redirect("experiment-edit", copy.pk)


@login_required
def experiment_delete(request, experiment_id: int):
    """GET: the confirmation page (how many runs, spans go with it); POST: delete them all,
    with each run's directory (as deleting one run does, controller/runs_views.py).
    An experiment with a run still in flight is kept: cancel the run first."""
    found = owned_experiment(request, experiment_id)
    in_flight = found.runs.exclude(status__in=Run.FINISHED).count()
    if request.method == "POST" and not in_flight:
        name, directories = found.name, [run_dir(pk) for pk in found.runs.values_list("pk", flat=True)]
        with transaction.atomic():
            found.delete()
        for directory in directories:  # config, log, checkpoints, policy: once the rows are gone
            shutil.rmtree(directory, ignore_errors=True)
        messages.info(request, f"Deleted {name}, its runs and their files.")
        return redirect("experiments")
    context = {"experiment": found, "runs": found.runs.count(), "in_flight": in_flight,
               "spans": Span.objects.filter(run__experiment=found).count()}
    return render(request, "experiment_delete.html", context, status=409 if in_flight and request.method == "POST" else 200)


def schedules_page(request, form: ScheduleForm, editing: Schedule | None = None):
    visible = Schedule.objects.visible_to(request.user).annotate(runs_count=Count("runs"))
    context = {"schedules": visible, "form": form, "editing": editing}
    return render(request, "schedules.html", context, status=400 if form.errors else 200)


@login_required
def schedules(request):
    if request.method == "POST":
        form = ScheduleForm(request.POST, user=request.user)
        if form.is_valid():
            messages.info(request, f"Created the schedule {form.save()}.")
            return redirect("schedules")
    else:
        form = ScheduleForm(user=request.user)
    return schedules_page(request, form)


@login_required
def schedule_edit(request, schedule_id: int):
    """Only your own presets change; the global ones are read-only here (the admin edits them)."""
    found = get_object_or_404(Schedule, pk=schedule_id, owner=request.user)
    if request.method == "POST":
        form = ScheduleForm(request.POST, user=request.user, instance=found)
        if form.is_valid():
            messages.info(request, f"Saved the schedule {form.save()}: new runs use it; earlier runs keep theirs.")
            return redirect("schedules")
    else:
        form = ScheduleForm(user=request.user, instance=found)
    return schedules_page(request, form, editing=found)


@login_required
@form_post
def schedule_delete(request, schedule_id: int):
    found = get_object_or_404(Schedule, pk=schedule_id, owner=request.user)
    used = found.runs.count()
    if used:
        messages.warning(request, f"{found} is kept: {used} run(s) were launched with it.")
    else:
        found.delete()
        messages.info(request, f"Deleted the schedule {found.name}.")
    return redirect("schedules")
