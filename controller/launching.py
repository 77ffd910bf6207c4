"""Create and launch runs, and cancel them: the one path used by pages and API alike."""

import uuid
from functools import partial

from django.db import transaction
from django.utils import timezone

from . import live, ownership
from .config_merge import run_config
from .broker import enqueue_or_withdraw
from .models import Comparison, Experiment, Run, Schedule
from .quotas import check_config, check_queue
from .frames import status_frame


def launch_run(experiment: Experiment, schedule: Schedule, steps: int | None = None, name: str = "",
               comparison: Comparison | None = None) -> Run:
    """Store a queued run with its merged config and enqueue its task once the row commits.

    ``steps`` defaults to the experiment's train.steps. Raises learner.config.ConfigError
    when the schedule's values do not fit the experiment's config, and
    quotas.QuotaExceeded when the run is over the owner's quota.
    """
    if steps is None:
        steps = experiment.run_config().train.steps
    config = run_config(experiment.config, schedule.overrides(), steps, name)
    check_config(experiment.owner, config)
    task_id = str(uuid.uuid4())
    with transaction.atomic():
        check_queue(experiment.owner)
        run = Run.objects.create(
            experiment=experiment, schedule=schedule, name=name, steps=steps, config=config, celery_task_id=task_id,
            comparison=comparison,
        )
        transaction.on_commit(partial(enqueue_or_withdraw, run.pk, task_id))
    return run


def launch_comparison(experiment: Experiment, schedules: list[Schedule], steps: int, name: str = "") -> Comparison:
    """One run per schedule of the experiment's config, all with ``steps`` and the config's seed,
    as one comparison; all or none are queued (ConfigError / QuotaExceeded as launch_run)."""
    with transaction.atomic():
        comparison = Comparison.objects.create(experiment=experiment, name=name, steps=steps)
        label = name or f"comparison {comparison.pk}"
        for schedule in schedules:
            launch_run(experiment, schedule, steps, f"{label} · {schedule.name}", comparison=comparison)
    return comparison


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
