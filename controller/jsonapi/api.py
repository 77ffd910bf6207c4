"""The JSON API (docs/controller-api.md, schema at /api/openapi.json). Session auth + CSRF.

A user reaches only their own experiments and runs (others' ids answer 404) and the
global schedule presets plus their own.
"""

from django.db import transaction
from django.db.models import Max
from django.http import JsonResponse
from django.shortcuts import get_object_or_404

from learner.config import ConfigError

from controller.comparisons.advisor import NoAdvice, advice
from controller.jsonapi.api_errors import ApiError, form_errors
from controller.comparisons.compare import CompareError, compare_summary, parse_reward_level, parse_run_ids, parse_smoothing, step_rows
from controller.comparisons.drain import drain_notes
from controller.jsonapi.decorators import api_view, int_param, read_json
from controller.exports import download, metrics_csv_chunks, trace_chunks
from controller.forms import ComparisonForm, ExperimentForm, RunCreateForm, ScheduleForm
from controller.launch_input import launch_error, sweep_of
from controller.supervision.launching import launch_comparison, launch_run, request_cancel
from controller.limits.limits import INT32_MAX
from controller.models import Comparison, Experiment, Run, Schedule, Span, StepMetric
from controller.supervision.resuming import ResumeRefused, request_resume
from controller.jsonapi.openapi import schema
from controller.jsonapi.pagination import DEFAULT_PAGE, MAX_METRICS_PAGE, paged
from controller.limits.quotas import QuotaExceeded, check_stored
from controller.jsonapi.serializers import comparison_json, experiment_json, run_json, runs_json, schedule_json, spans_json

MAX_SPANS_PAGE = 10_000
EXPERIMENT_FIELDS = {"name": (str,), "description": (str,), "config": (dict, str)}
SCHEDULE_FIELDS = {"name": (str,), "kind": (str,), "knobs": (dict,)}
RUN_FIELDS = {"experiment": (int,), "schedule": (int,), "steps": (int,), "name": (str,), "overrides": (dict, str)}
COMPARISON_FIELDS = {"experiment": (int,), "schedules": (list,), "steps": (int,), "name": (str,),
                     "overrides": (dict, str), "sweep": (dict,), "repeats": (int,)}
SWEEP_FIELDS = {"field": (str,), "values": (list, str)}


def owned_run(user, run_id: int) -> Run:
    return get_object_or_404(Run.objects.select_related("experiment", "schedule"), pk=run_id, experiment__owner=user)


def room_for(user, kind: str) -> None:
    """quotas.check_stored as the API's 409 naming the limit."""
    try:
        check_stored(user, kind)
    except QuotaExceeded as err:
        raise ApiError(err.status, {err.field: err.message}) from None


def validated(form):
    if not form.is_valid():
        raise ApiError(400, form_errors(form))
    return form


@api_view("GET", "POST")
def experiments(request):
    if request.method == "GET":
        owned = Experiment.objects.filter(owner=request.user)
        return JsonResponse(paged(request, owned, "experiments", lambda page: [experiment_json(e) for e in page]))
    body = read_json(request, EXPERIMENT_FIELDS)
    with transaction.atomic():  # the count and the insert under the user's row lock
        room_for(request.user, "experiments")
        form = ExperimentForm(body, instance=Experiment(owner=request.user))
        return JsonResponse(experiment_json(validated(form).save()), status=201)


@api_view("GET")
def experiment_detail(request, experiment_id: int):
    """The experiment with its newest DEFAULT_PAGE runs; ``runs_count`` counts them all and
    ``runs_url`` pages through them (/api/runs/?experiment=<id>)."""
    experiment = get_object_or_404(Experiment, pk=experiment_id, owner=request.user)
    owned = experiment.runs.select_related("experiment", "schedule")
    return JsonResponse({**experiment_json(experiment), "runs": runs_json(owned[:DEFAULT_PAGE]),
                         "runs_count": owned.count(), "runs_url": f"/api/runs/?experiment={experiment.pk}"})


@api_view("GET", "POST")
def schedules(request):
    if request.method == "GET":
        visible = Schedule.objects.visible_to(request.user)
        return JsonResponse(paged(request, visible, "schedules", lambda page: [schedule_json(s) for s in page]))
    form = ScheduleForm(read_json(request, SCHEDULE_FIELDS), user=request.user)
    return JsonResponse(schedule_json(validated(form).save()), status=201)


@api_view("GET", "POST")
def runs(request):
    if request.method == "GET":
        owned = Run.objects.filter(experiment__owner=request.user).select_related("experiment", "schedule")
        experiment_id = int_param(request, "experiment", None, 1, INT32_MAX)
        if experiment_id is not None:
            owned = owned.filter(experiment_id=experiment_id)
        return JsonResponse(paged(request, owned, "runs", runs_json))
    form = RunCreateForm(read_json(request, RUN_FIELDS), user=request.user)
    unknown = {f: f"no such {f}" for f in ("experiment", "schedule") if form.has_error(f, "invalid_choice")}
    if unknown:  # an id that is not yours is a missing object, as on every other path
        raise ApiError(404, unknown)
    validated(form)
    data = form.cleaned_data
    try:
        run = launch_run(data["experiment"], data["schedule"], data["steps"], data["name"], overrides=data["overrides"])
    except (ConfigError, QuotaExceeded) as err:
        field, status, reason = launch_error(err, "schedule", data)
        raise ApiError(status, {field: reason}) from None
    return JsonResponse(run_json(run), status=201)


def comparison_input(request) -> dict:
    """The body as ComparisonForm's fields: ``sweep`` {field, values} becomes sweep_field/values."""
    body = read_json(request, COMPARISON_FIELDS)
    sweep = body.pop("sweep", None)
    if sweep is not None:
        unknown = sorted(set(sweep) - set(SWEEP_FIELDS))
        if unknown:
            raise ApiError(400, {"sweep": f"unknown field {unknown[0]!r} (expected field, values)"})
        for key, types in SWEEP_FIELDS.items():
            if key not in sweep or not isinstance(sweep[key], types):
                raise ApiError(400, {"sweep": f"{key}: required, {' or '.join(t.__name__ for t in types)}"})
        body["sweep_field"], body["sweep_values"] = sweep["field"], sweep["values"]
    return body


@api_view("GET", "POST")
def comparisons(request):
    """GET: your comparisons, newest first (``?experiment=`` for one experiment's). POST: launch a
    comparison (the experiment under 2-4 schedules) or a small sweep (one field over 2-4 values x
    the schedules, 4 runs at most): all runs queued, or none."""
    if request.method == "GET":
        owned = Comparison.objects.filter(experiment__owner=request.user)
        experiment_id = int_param(request, "experiment", None, 1, INT32_MAX)
        if experiment_id is not None:
            owned = owned.filter(experiment_id=experiment_id)
        return JsonResponse(paged(request, owned, "comparisons", lambda page: [comparison_json(c) for c in page]))
    body = comparison_input(request)
    if "experiment" not in body:
        raise ApiError(400, {"experiment": "required: one of your experiments' ids"})
    if not isinstance(body.get("schedules"), list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in body["schedules"]):
        raise ApiError(400, {"schedules": "required: a list of integer schedule ids"})
    if not 1 <= body["experiment"] <= INT32_MAX or not all(1 <= i <= INT32_MAX for i in body["schedules"]):
        raise ApiError(404, {"experiment": "no such experiment or schedule"})
    experiment = get_object_or_404(Experiment, pk=body["experiment"], owner=request.user)
    form = ComparisonForm(body, user=request.user, experiment=experiment)
    if form.has_error("schedules", "invalid_choice"):
        raise ApiError(404, {"schedules": "no such schedule"})
    data = validated(form).cleaned_data
    try:
        comparison = launch_comparison(experiment, data["schedules"], data["steps"], data["name"], data["overrides"],
                                       sweep_of(data), data["repeats"])
    except (ConfigError, QuotaExceeded) as err:
        field, status, reason = launch_error(err, "schedules", data)
        raise ApiError(status, {field: reason}) from None
    return JsonResponse(comparison_json(comparison), status=201)


@api_view("GET")
def comparison_detail(request, comparison_id: int):
    """One comparison with its runs and the compare page's summary of them (``?reward=``,
    ``?smoothing=`` as for /api/compare/); ``summary`` is null once none of its runs is left."""
    found = get_object_or_404(Comparison, pk=comparison_id, experiment__owner=request.user)
    try:
        level = parse_reward_level(request.GET.get("reward", ""))
        weight = parse_smoothing(request.GET.get("smoothing", ""))
    except CompareError as err:
        raise ApiError(400, {err.field: str(err)}) from None
    runs = list(found.runs.select_related("experiment", "schedule").order_by("id"))
    return JsonResponse({**comparison_json(found), "summary": compare_summary(runs, level, weight) if runs else None})


@api_view("GET")
def run_detail(request, run_id: int):
    return JsonResponse(run_json(owned_run(request.user, run_id)))


@api_view("POST")
def run_cancel(request, run_id: int):
    run = owned_run(request.user, run_id)
    if not request_cancel(run):
        raise ApiError(409, {"status": f"the run has already {run.status}"})
    return JsonResponse(run_json(run), status=202)


@api_view("POST")
def run_resume(request, run_id: int):
    run = owned_run(request.user, run_id)
    try:
        request_resume(run)
    except ResumeRefused as err:
        raise ApiError(409, {"status": str(err)})
    except QuotaExceeded as err:  # the queued-runs quota (429), a node no worker serves (400, learner.nodes)
        raise ApiError(err.status, {err.field: err.message}) from None
    return JsonResponse(run_json(run), status=202)


@api_view("GET")
def run_metrics(request, run_id: int):
    """The run's per-step metrics in step order, a page at a time (``limit`` up to MAX_METRICS_PAGE)."""
    metrics = StepMetric.objects.filter(run=owned_run(request.user, run_id)).order_by("step").values("step", "values")
    return JsonResponse(paged(request, metrics, "metrics", list, MAX_METRICS_PAGE, MAX_METRICS_PAGE))


def step_range(request) -> dict:
    """``step_from``/``step_to`` (inclusive) as queryset filters."""
    lo = int_param(request, "step_from", None, -1, INT32_MAX)
    hi = int_param(request, "step_to", None, -1, INT32_MAX)
    if lo is not None and hi is not None and lo > hi:
        raise ApiError(400, {"step_to": "must be >= step_from"})
    filters = {}
    if lo is not None:
        filters["step__gte"] = lo
    if hi is not None:
        filters["step__lte"] = hi
    return filters


@api_view("GET")
def run_advice(request, run_id: int):
    """The run page's schedule advisor (controller/comparisons/advisor.py: the simulator on the run's own
    spans, a finished run's) and its drain's decisions (controller/comparisons/drain.py, streaming's)."""
    run = owned_run(request.user, run_id)
    try:
        found, note = advice(run), ""
    except NoAdvice as err:
        found, note = None, str(err)
    return JsonResponse({"advisor": found, "advisor_note": note, "drain": drain_notes(step_rows([run.pk])[run.pk])})


@api_view("GET")
def run_spans(request, run_id: int):
    """A page of spans in seq order; ``last_seq`` is the cursor for the next ``after``."""
    run = owned_run(request.user, run_id)
    after = int_param(request, "after", -1, -1, INT32_MAX)
    limit = int_param(request, "limit", 2000, 1, MAX_SPANS_PAGE)
    spans = spans_json(Span.objects.filter(run=run, seq__gt=after, **step_range(request)), limit)
    last = spans[-1]["seq"] if spans else after
    following = None
    if len(spans) == limit:  # a full page: there may be more (a page past the end is empty)
        params = request.GET.copy()
        params["after"] = str(last)
        following = f"{request.path}?{params.urlencode()}"
    return JsonResponse({"spans": spans, "last_seq": last, "next": following})


@api_view("GET")
def run_trace(request, run_id: int):
    run = owned_run(request.user, run_id)
    filters = step_range(request)
    last = Span.objects.filter(run=run).aggregate(last=Max("step"))["last"]
    if "step__gte" in filters and last is not None and filters["step__gte"] > last:
        raise ApiError(400, {"step_from": f"past the run's last step ({last})"})
    chunks = trace_chunks(run, filters)
    return download(request, chunks, "application/json", f"run-{run.pk}-trace.json")


@api_view("GET")
def run_metrics_csv(request, run_id: int):
    run = owned_run(request.user, run_id)
    return download(request, metrics_csv_chunks(run), "text/csv", f"run-{run.pk}-metrics.csv")


@api_view("GET")
def compare(request):
    """The compare page's summary table for ``?runs=1,2`` (2-4 of your runs), ``&reward=``."""
    try:
        ids = parse_run_ids(request.GET.get("runs", ""))
        level = parse_reward_level(request.GET.get("reward", ""))
        weight = parse_smoothing(request.GET.get("smoothing", ""))
    except CompareError as err:
        raise ApiError(400, {err.field: str(err)}) from None
    if not ids:
        raise ApiError(400, {"runs": "required: comma-separated run ids"})
    found = {r.pk: r for r in Run.objects.select_related("schedule").filter(pk__in=ids, experiment__owner=request.user)}
    if len(found) != len(ids):
        raise ApiError(404, {"runs": "no such run"})
    return JsonResponse(compare_summary([found[i] for i in ids], level, weight))


@api_view("GET")
def openapi(request):
    return JsonResponse(schema(request.user))
