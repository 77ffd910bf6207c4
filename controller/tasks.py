"""The Celery task that owns a run from launch to its final state (queue "runs")."""

import logging
from functools import partial

from celery import shared_task
from celery.signals import worker_ready, worker_shutdown

from django.conf import settings
from django.utils import timezone

from controller.live import broadcast as live
from controller.supervision import nodes
from controller.supervision import ownership
from controller.supervision import priority
from controller import sandbox_hosts
from controller.supervision import warm
from controller.broker import hand_to_node
from controller.supervision.dispatch import claim_next_run, top_up
from controller.ingest.ingestion import finish_run
from controller.models import Run
from controller.live.frames import status_frame
from controller.supervision.processes import me
from controller.supervision.supervisor import supervise

log = logging.getLogger(__name__)


def adopt(task_id: str | None) -> bool:
    """A redelivered message (its worker was lost: acks_late + reject_on_worker_lost) finds
    the run its first delivery claimed (``Run.start_task_id``: with fair dispatch that need
    not be the run the message was sent for) still starting/running under a supervisor that
    is certainly gone: end it now rather than wait for the reaper. A live owner's run, and
    any other run, are left alone."""
    if not task_id:
        return False
    run = Run.objects.filter(start_task_id=task_id, status__in=Run.ACTIVE).first()
    if run is None:
        return False
    reason = ownership.owner_dead(run.supervisor, run.pk)
    return reason is not None and ownership.abandon(run, reason)


@shared_task(bind=True, name="controller.tasks.run_training", acks_late=True, reject_on_worker_lost=True)
def run_training(self, slot_run_id: int) -> str:
    """Claim the fairest queued run (queued -> starting, atomically) and supervise the learner.

    A message is a slot, not a run: the run launched with it may wait while another user's
    starts (controller/supervision/dispatch.py, round robin by user). The atomic claim makes a second
    delivery (acks_late after a lost worker, a broker redelivery) start at most one more
    run, never the same one twice; a redelivery whose run lost its supervisor ends that run
    first (controller/supervision/ownership.py).
    """
    adopted = adopt(self.request.id)
    run_id = claim_next_run(self.request.id)
    if run_id is None:
        log.info("slot of run %s: no queued run may start now, nothing to do", slot_run_id)
        return "adopted" if adopted else "skipped"
    run = Run.objects.select_related("experiment", "schedule").get(pk=run_id)
    live.publish(run_id, status_frame(run))
    try:
        first, _ = nodes.placement(run.config)
        if first is not None and first != settings.THUNDERSYNC_NODE:  # rank 0 runs on the run's first node
            Run.objects.filter(pk=run_id).update(supervisor=ownership.HANDED_OFF + nodes.queue_of(first),
                                                 heartbeat=timezone.now())
            hand_to_node(run_id, nodes.queue_of(first))
            return "handed to node " + first
        return supervise_and_finish(run)
    finally:
        top_up()  # a slot for a run that a concurrency limit held back


def supervise_and_finish(run: Run) -> str:
    try:
        return supervise(run).status
    except Exception as err:
        log.exception("run %s: supervisor failed", run.pk)
        return finish_run(run.pk, Run.Status.FAILED, f"the controller failed while supervising: {err!r}").status


@shared_task(bind=True, name="controller.tasks.supervise_on_node", acks_late=True, reject_on_worker_lost=True)
def supervise_on_node(self, run_id: int) -> str:
    """Rank 0 of a run that spans nodes, on its first node (queue runs.<node>): take the run
    over from the worker that claimed it (this task's id becomes the run's starting task, for
    adoption after a lost worker), and supervise it as any run (controller/supervision/nodes.py)."""
    if adopt(self.request.id):
        return "adopted"
    handed = ownership.HANDED_OFF + nodes.queue_of(settings.THUNDERSYNC_NODE)
    if not Run.objects.filter(pk=run_id, status=Run.Status.STARTING, supervisor=handed).update(
            supervisor=me(), heartbeat=timezone.now(), start_task_id=self.request.id):
        return "skipped"
    return supervise_and_finish(Run.objects.select_related("experiment", "schedule").get(pk=run_id))


@shared_task(name="controller.tasks.run_rank", acks_late=False)
def run_rank(run_id: int, rank: int, node: str, control: str, key: str) -> str:
    """One learner rank of a run that spans nodes, on this worker's node (queue runs.<node>);
    not redelivered if its worker is lost: the run has failed by then (controller/supervision/nodes.py)."""
    return nodes.run_rank_on_this_node(run_id, rank, node, control, key)


_reaper = {}


@worker_ready.connect
def start_reaping(sender=None, **_):
    """Every ``celery worker`` stamps its nodes and reaps at start (runs a killed worker left)
    and then periodically (the embedded default starts its own reaper: ``manage.py demo``)."""
    queues = sorted(sender.app.amqp.queues.consume_from) if sender is not None else []
    nodes.stamp_quietly(queues)  # before the worker says it is ready: a launch may name its nodes from then on
    _reaper["stop"] = ownership.start_reaper(each_pass=partial(nodes.stamp_quietly, queues))
    sandbox_hosts.report()  # can this host confine the python-sandbox tool (launches read it)
    warm.start()  # runs fork from it (controller/supervision/warm.py)
    _reaper["restore_priority"] = priority.lower_session()  # runs lead sessions of their own: they come first


@worker_shutdown.connect
def stop_reaping(**_):
    if "stop" in _reaper:
        _reaper.pop("stop").set()
    warm.stop()
    _reaper.pop("restore_priority", lambda: None)()
