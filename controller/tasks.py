"""The Celery task that owns a run from launch to its final state (queue "runs")."""

import logging

from celery import shared_task
from django.utils import timezone

from . import live
from .ingestion import finish_run
from .models import Run
from .serializers import status_frame
from .supervisor import supervise

log = logging.getLogger(__name__)


@shared_task(name="controller.tasks.run_training", acks_late=True)
def run_training(run_id: int) -> str:
    """Claim the run (queued -> starting, atomically) and supervise the learner.

    The conditional UPDATE makes a second delivery of the same message (acks_late after a
    lost worker, a broker redelivery) a no-op: only one task ever starts a given run.
    """
    claimed = Run.objects.filter(pk=run_id, status=Run.Status.QUEUED, cancel_requested=False).update(
        status=Run.Status.STARTING, started=timezone.now()
    )
    if not claimed:
        log.info("run %s: not queued any more, nothing to do", run_id)
        return "skipped"
    run = Run.objects.select_related("experiment", "schedule").get(pk=run_id)
    live.publish(run_id, status_frame(run))
    try:
        return supervise(run).status
    except Exception as err:
        log.exception("run %s: supervisor failed", run_id)
        return finish_run(run_id, Run.Status.FAILED, f"the controller failed while supervising: {err!r}").status
