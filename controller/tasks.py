"""The Celery task that owns a run from launch to its final state (queue "runs")."""

import logging

from celery import shared_task

from . import live
from .dispatch import claim_next_run, top_up
from .ingestion import finish_run
from .models import Run
from .serializers import status_frame
from .supervisor import supervise

log = logging.getLogger(__name__)


@shared_task(name="controller.tasks.run_training", acks_late=True)
def run_training(slot_run_id: int) -> str:
    """Claim the fairest queued run (queued -> starting, atomically) and supervise the learner.

    A message is a slot, not a run: the run launched with it may wait while another user's
    starts (controller/dispatch.py, round robin by user). The atomic claim makes a second
    delivery (acks_late after a lost worker, a broker redelivery) start at most one more
    run, never the same one twice.
    """
    run_id = claim_next_run()
    if run_id is None:
        log.info("slot of run %s: no queued run may start now, nothing to do", slot_run_id)
        return "skipped"
    run = Run.objects.select_related("experiment", "schedule").get(pk=run_id)
    live.publish(run_id, status_frame(run))
    try:
        return supervise(run).status
    except Exception as err:
        log.exception("run %s: supervisor failed", run_id)
        return finish_run(run_id, Run.Status.FAILED, f"the controller failed while supervising: {err!r}").status
    finally:
        top_up()  # a slot for a run that a concurrency limit held back
