"""The Celery task that owns a run from launch to its final state (queue "runs")."""

import logging

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown

from . import live, ownership, warm
from .dispatch import claim_next_run, top_up
from .ingestion import finish_run
from .models import Run
from .frames import status_frame
from .supervisor import supervise

log = logging.getLogger(__name__)


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
def run_training(slot_run_id: int) -> str:
    """Claim the fairest queued run (queued -> starting, atomically) and supervise the learner.

    A message is a slot, not a run: the run launched with it may wait while another user's
    starts (controller/dispatch.py, round robin by user). The atomic claim makes a second
    delivery (acks_late after a lost worker, a broker redelivery) start at most one more
    run, never the same one twice; a redelivery whose run lost its supervisor ends that run
    first (controller/ownership.py).
    """
    adopted = adopt(slot_run_id)
    run_id = claim_next_run()
    if run_id is None:
        log.info("slot of run %s: no queued run may start now, nothing to do", slot_run_id)
        return "adopted" if adopted else "skipped"
    run = Run.objects.select_related("experiment", "schedule").get(pk=run_id)
    live.publish(run_id, status_frame(run))
    try:
        return supervise(run).status
    except Exception as err:
        log.exception("run %s: supervisor failed", run_id)
        return finish_run(run_id, Run.Status.FAILED, f"the controller failed while supervising: {err!r}").status
    finally:
        top_up()  # a slot for a run that a concurrency limit held back


_reaper = {}


@worker_ready.connect
def start_reaping(**_):
    """Every ``celery worker`` reaps at start (runs a killed worker left) and then
    periodically (the embedded default starts its own reaper: ``manage.py demo``)."""
    _reaper["stop"] = ownership.start_reaper()
    warm.start()  # runs fork from it (controller/warm.py)


@worker_shutdown.connect
def stop_reaping(**_):
    if "stop" in _reaper:
        _reaper.pop("stop").set()
    warm.stop()
