"""Messages to the workers, sent by task name (the task bodies live in controller/tasks.py,
which imports the supervisor; senders import only this module, so no import circle forms).

Sent through Celery's current app, as ``task.apply_async`` would: the routes of
``CELERY_TASK_ROUTES`` apply by name.
"""

from __future__ import annotations

import logging

from celery import current_app
from django.conf import settings
from django.utils import timezone

from controller.models import Run
from controller.limits.outages import OUTAGE_ERRORS

log = logging.getLogger(__name__)
RUN_TRAINING = "controller.tasks.run_training"
SUPERVISE_ON_NODE = "controller.tasks.supervise_on_node"
RUN_RANK = "controller.tasks.run_rank"


def enqueue(run_id: int, task_id: str | None) -> None:
    """One slot on the runs queue (controller/supervision/dispatch.py), sent for ``run_id``."""
    Run.objects.filter(pk=run_id).update(enqueued=timezone.now())  # the reaper re-sends a lost message
    current_app.send_task(RUN_TRAINING, args=[run_id], task_id=task_id)


def enqueue_or_withdraw(run_id: int, task_id: str) -> None:
    """A new run's first message; if the broker is down, the queued run is deleted and the
    error raised (the request answers 503, controller/limits/outages.py): no run is left that looks
    launched but has no message."""
    try:
        enqueue(run_id, task_id)
    except OUTAGE_ERRORS:
        Run.objects.filter(pk=run_id, status=Run.Status.QUEUED).delete()
        raise


def enqueue_or_leave_to_reaper(run_id: int, task_id: str) -> None:
    """A resumed attempt's message; if the broker is down, the run stays queued and the
    reaper sends it once the broker is back (``ownership.requeue_lost``)."""
    try:
        enqueue(run_id, task_id)
    except OUTAGE_ERRORS as err:
        log.warning("run %s: the broker is unreachable (%s); the reaper sends its message later", run_id, err)


def hand_to_node(run_id: int, queue: str) -> None:
    """Rank 0 of a run that spans nodes, to its first node's queue (controller/supervision/nodes.py)."""
    current_app.send_task(SUPERVISE_ON_NODE, args=[run_id], queue=queue)


def start_rank(run_id: int, rank: int, node: str, control: str, key: str, queue: str) -> None:
    """One learner rank of a run that spans nodes, to that node's queue (controller/supervision/nodes.py)."""
    current_app.send_task(RUN_RANK, args=[run_id, rank, node, control, key], queue=queue)


def forget_queue(queue: str) -> None:
    """Delete ``queue`` with its messages and its binding (controller/supervision/nodes.py: a node's queue
    that no worker serves). On Redis: the binding set of its exchange (a queue Celery creates on
    send has an exchange of its own name) and its list per priority; elsewhere kombu's delete."""
    with current_app.connection_for_write() as conn:
        channel = conn.default_channel
        if not hasattr(channel, "_q_for_pri"):
            channel.queue_delete(queue)
            return
        # DEL is one of the commands kombu's client prefixes with global_keyprefix itself
        channel.client.delete(channel.keyprefix_queue % queue, channel.keyprefix_binding_permanent % queue,
                              *{channel._q_for_pri(queue, pri) for pri in channel.priority_steps})


def backlog() -> int | None:
    """Messages waiting in the runs queue (not those being worked on); None if the broker
    cannot be looked into (only Redis can) or is down."""
    try:
        with current_app.connection_for_read() as conn:
            channel = conn.default_channel
            if not hasattr(channel, "_q_for_pri"):
                return None
            queue = settings.CELERY_TASK_ROUTES[RUN_TRAINING]["queue"]
            # LLEN is one of the commands kombu's client prefixes with global_keyprefix itself
            return sum(channel.client.llen(channel._q_for_pri(queue, pri)) for pri in channel.priority_steps)
    except Exception as err:  # the broker is down: nothing to send to anyway
        log.warning("reaper: cannot look into the broker: %s", err)
        return None
