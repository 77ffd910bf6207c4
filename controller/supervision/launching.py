"""Create and launch runs, and cancel them: the one path used by pages and API alike."""

import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.db import transaction
from django.utils import timezone

from controller.live import broadcast as live
from controller.supervision import ownership
from controller.config_merge import run_config
from controller.broker import enqueue, enqueue_or_withdraw
from controller.models import Comparison, Experiment, Run, Schedule
from controller.limits.outages import OUTAGE_ERRORS
from controller.overrides import format_override
from controller.limits.disk_quota import check_disk
from controller.supervision.nodes import check_nodes, placement
from controller.sandbox_hosts import launch_refusal
from controller.limits.quotas import QuotaExceeded, check_config, check_queue, check_stored, quota_for
from controller.live.frames import status_frame


def launch_run(experiment: Experiment, schedule: Schedule, steps: int | None = None, name: str = "",
               comparison: Comparison | None = None, overrides: dict[str, Any] | None = None,
               enqueue_on_commit: bool = True) -> Run:
    """Store a queued run with its merged config and enqueue its task once the row commits.

    ``steps`` defaults to the experiment's train.steps; ``overrides`` are dotted config fields
    set for this launch (controller/overrides.py). Raises learner.config.ConfigError when the
    schedule's values do not fit the experiment's config (config_merge.LaunchOverrideError when
    the overrides do not; sandbox_hosts.SandboxRefused when its task calls the python-sandbox tool
    and no worker can confine it), and quotas.QuotaExceeded when the run is over the owner's quota (or
    nodes.UnknownNode when its learner.nodes names a node no worker serves).
    """
    if steps is None:
        steps = experiment.run_config().train.steps
    overrides = overrides or {}
    config = run_config(experiment.config, schedule.overrides(), steps, name, overrides)
    if refused := launch_refusal(config, placement(config)[0]):  # no worker can run its tool confined
        raise refused
    check_config(experiment.owner, config)
    check_nodes(config)  # a node no worker serves: refused before any queue is created
    check_disk(experiment.owner, config)
    task_id = str(uuid.uuid4())
    with transaction.atomic():
        check_queue(experiment.owner)
        check_stored(experiment.owner, "runs")
        run = Run.objects.create(
            experiment=experiment, schedule=schedule, name=name, steps=steps, config=config, celery_task_id=task_id,
            comparison=comparison, overrides=overrides,
        )
        if enqueue_on_commit:  # else the caller sends it (a comparison sends all its runs' at once)
            transaction.on_commit(partial(enqueue_or_withdraw, run.pk, task_id))
    return run


@dataclass(frozen=True)
class Sweep:
    """One config field over a few values (controller/overrides.py checks both)."""

    field: str
    values: list[Any]


def rounds(cells: list, repeats: int) -> list[tuple[int, Any]]:
    """(round, cell) in launch order: every cell once per round, odd rounds in reverse (A B, B A,
    A B, ...), so a drift of the machine's speed over the comparison lands on every schedule
    alike instead of on whichever runs last; dispatch starts them in this order, one at a time."""
    return [(k, cell) for k in range(repeats) for cell in (cells if k % 2 == 0 else cells[::-1])]


def round_seeds(experiment: Experiment, overrides: dict[str, Any], sweep: Sweep | None,
                repeats: int) -> list[dict[str, Any]]:
    """The seed override of each round: round k trains seed s0 + k, where s0 is the launch's
    seed (its override, else the experiment's), so repeats are draws of the result across seeds
    while the runs of one round (one per schedule and sweep value) share theirs and stay paired.
    One round, or a sweep of the seed itself, sets nothing."""
    if repeats <= 1 or (sweep is not None and sweep.field == "seed"):
        return [{}] * max(repeats, 1)
    base = int(overrides.get("seed", experiment.config.get("seed", 0)) or 0)
    return [{"seed": (base + k) % 2**31} for k in range(repeats)]


def launch_comparison(experiment: Experiment, schedules: list[Schedule], steps: int, name: str = "",
                      overrides: dict[str, Any] | None = None, sweep: Sweep | None = None,
                      repeats: int = 1) -> Comparison:
    """``repeats`` runs per schedule of the experiment's config (per sweep value and schedule with
    a ``sweep``) in alternating rounds (``rounds``), all with ``steps`` and ``overrides``, round k
    with seed s0 + k (``round_seeds``), as one comparison. All or none are queued: a ConfigError or QuotaExceeded (as
    launch_run) of any run rolls every row back, and the owner's row lock (quotas.check_queue) is
    held until the last one is counted."""
    values = [(None, {})] if sweep is None else [(v, {sweep.field: v}) for v in sweep.values]
    cells = [(value, swept, schedule) for value, swept in values for schedule in schedules]
    seeds = round_seeds(experiment, overrides or {}, sweep, repeats)
    runs = []
    with transaction.atomic():
        comparison = Comparison.objects.create(experiment=experiment, name=name, steps=steps, repeats=repeats,
                                               sweep_field=sweep.field if sweep else "",
                                               sweep_values=sweep.values if sweep else [])
        label = name or f"{'sweep' if sweep else 'comparison'} {comparison.pk}"
        try:
            for k, (value, swept, schedule) in rounds(cells, repeats):
                run_name = (f"{label} · {schedule.name}" + (f" · {format_override(sweep.field, value)}" if sweep else "")
                            + (f" · round {k + 1}" if repeats > 1 else ""))
                runs.append(launch_run(experiment, schedule, steps, run_name[:200], comparison=comparison,
                                       overrides={**(overrides or {}), **seeds[k], **swept}, enqueue_on_commit=False))
        except QuotaExceeded as err:
            if err.status != 429:
                raise
            raise queue_full(experiment, comparison, len(cells) * repeats) from None
        transaction.on_commit(partial(enqueue_all_or_withdraw, comparison.pk, [(r.pk, r.celery_task_id) for r in runs]))
    return comparison


def queue_full(experiment: Experiment, comparison: Comparison, size: int) -> QuotaExceeded:
    """The 429 of a comparison that does not fit the queue, counting what was queued before it
    (its own runs counted so far are rolled back with it)."""
    before = Run.objects.filter(experiment__owner=experiment.owner, status=Run.Status.QUEUED).exclude(
        comparison=comparison).count()
    limit = quota_for(experiment.owner).queued_runs
    return QuotaExceeded("quota", (
        f"you already have {before} queued runs and this launch adds {size}, your quota is {limit}: "
        "wait for some to start, cancel some, or launch fewer"), status=429)


def enqueue_all_or_withdraw(comparison_id: int, runs: list[tuple[int, str]]) -> None:
    """A comparison's messages once its rows commit. If the broker is down, every one of its runs
    still queued and the comparison itself are deleted and the error raised (the request answers
    503): no comparison is left half launched. A message already sent for a withdrawn run is a
    slot that finds no run of it to start (controller/supervision/dispatch.py)."""
    try:
        for run_id, task_id in runs:
            enqueue(run_id, task_id)
    except OUTAGE_ERRORS:
        Run.objects.filter(pk__in=[run_id for run_id, _ in runs], status=Run.Status.QUEUED).delete()
        Comparison.objects.filter(pk=comparison_id, runs__isnull=True).delete()
        raise


def request_cancel(run: Run) -> bool:
    """Ask a run to stop; False if it had already finished.

    A queued run is cancelled right here (its task will find it not queued and do nothing);
    a starting or running one gets the flag, and its supervisor signals the learner; one
    whose supervisor is gone (docs/controller.md "No run without an owner") ends here too.
    """
    now = timezone.now()
    if Run.objects.filter(pk=run.pk, status=Run.Status.QUEUED).update(
        status=Run.Status.CANCELLED, cancel_requested=True, finished=now
    ):
        run.refresh_from_db()
        live.publish(run.pk, status_frame(run))
        return True
    flagged = Run.objects.filter(pk=run.pk, status__in=Run.ACTIVE).update(cancel_requested=True)
    run.refresh_from_db()
    if flagged and run.status in Run.ACTIVE:
        reason = ownership.owner_dead(run.supervisor, run.pk)
        if reason is None and ownership.heartbeat_stale(run, timezone.now()):
            reason = "its supervisor stopped reporting"
        if reason is not None and ownership.abandon(run, reason):
            run.refresh_from_db()
    return bool(flagged)
