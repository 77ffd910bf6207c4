"""The Celery task that owns a run from launch to its final state (queue "runs")."""

import logging

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown
from django.utils import timezone

from . import live, ownership
from .ingestion import finish_run
from .models import Run
from .serializers import status_frame
from .supervisor import supervise

log = logging.getLogger(__name__)


def claim(run_id: int) -> bool:
    """queued -> starting, atomically, with this process as the owner."""
    return bool(Run.objects.filter(pk=run_id, status=Run.Status.QUEUED, cancel_requested=False).update(
        status=Run.Status.STARTING, started=timezone.now(), heartbeat=timezone.now(), supervisor=ownership.me(),
    ))


def adopt(run_id: int) -> bool:
    """A redelivered message (its worker was lost: acks_late + reject_on_worker_lost) finds
    its run still starting/running under a supervisor that is certainly gone: end it now
    rather than wait for the reaper. A live owner's run is left alone."""
    run = Run.objects.filter(pk=run_id, status__in=Run.ACTIVE).first()
    if run is None:
        return False
    reason = ownership.owner_dead(run.supervisor, run.pk)
    return reason is not None and ownership.abandon(run, reason)


@shared_task(name="controller.tasks.run_training", acks_late=True, reject_on_worker_lost=True)
def run_training(run_id: int) -> str:
    """Claim the run and supervise the learner.

    The conditional UPDATE makes a second delivery of the same message (a broker
    redelivery, a duplicate the reaper sent) a no-op while the run's owner lives: only one
    task ever starts a given run.
    """
    if not claim(run_id):
        if adopt(run_id):
            return "adopted"
        log.info("run %s: not queued any more, nothing to do", run_id)
        return "skipped"
    run = Run.objects.select_related("experiment", "schedule").get(pk=run_id)
    live.publish(run_id, status_frame(run))
    try:
        return supervise(run).status
    except Exception as err:
        log.exception("run %s: supervisor failed", run_id)
        return finish_run(run_id, Run.Status.FAILED, f"the controller failed while supervising: {err!r}").status


_reaper = {}


@worker_ready.connect
def start_reaping(**_):
    """Every ``celery worker`` reaps at start (runs a killed worker left) and then
    periodically (the embedded default starts its own reaper: ``manage.py demo``)."""
    _reaper["stop"] = ownership.start_reaper()


@worker_shutdown.connect
def stop_reaping(**_):
    if "stop" in _reaper:
        _reaper.pop("stop").set()
