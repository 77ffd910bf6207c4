"""Which queued run starts next: round robin over users, not the broker's FIFO.

Each launched run puts one message on the Celery queue "runs", but a message is only a
slot: the worker that takes it starts the queued run that is fairest now. That is a run of
the user with a queued run, fewer running runs than their ``concurrent_runs`` quota, and
the longest time since one of their runs started (never first), their oldest queued run
first. So users who queue many runs at once interleave with everyone else instead of
starving them. A comparison's runs start one at a time, in the order they were launched (its
alternating rounds, controller/supervision/launching.py): two of them training at once would share the
cores, and their ratio would measure that contention. A slot that finds nothing it may start is dropped; when a run ends, one
slot is sent again if runs are waiting (``top_up``), which is when a limit frees up.

The pick and the claim (queued -> starting) happen in one transaction under a PostgreSQL
advisory lock, so two workers never pick concurrently past a user's limit (SQLite, the
embedded demo, has one worker and serialises writers anyway). A cancel takes no such lock: it
may end the picked run between the pick and the claim. So the claim is one conditional
``UPDATE ... WHERE status='queued' AND NOT cancel_requested``: a run cancelled meanwhile stays
``cancelled`` and the worker picks again (a run that left the queue while it was being picked
likewise), and returns nothing when nothing is left to start.
"""

from django.db import connection, transaction
from django.db.models import Count, Max, Min, Q
from django.utils import timezone

from controller.broker import enqueue
from controller.models import Run
from controller.supervision.processes import me
from controller.limits.quotas import quotas_for

DISPATCH_LOCK = 0x7453_0001  # pg_advisory_xact_lock key: "ts" + 1
ACTIVE = (Run.Status.STARTING, Run.Status.RUNNING)
PICK_TRIES = 5  # picks per claim when a cancel keeps winning the race (each loss is a run gone from the queue)


def waiting():
    return Run.objects.filter(status=Run.Status.QUEUED, cancel_requested=False)


def startable():
    """Waiting runs that may start now: not one of a comparison with a run starting or running."""
    busy = Run.objects.filter(status__in=ACTIVE, comparison__isnull=False).values("comparison_id")
    return waiting().filter(Q(comparison__isnull=True) | ~Q(comparison_id__in=busy))


def next_run_id() -> int | None:
    """The queued run that should start now (see the module doc), or None."""
    for _ in range(PICK_TRIES):
        owners = dict(startable().values_list("experiment__owner").annotate(oldest=Min("created")))
        if not owners:
            return None
        running = dict(Run.objects.filter(status__in=ACTIVE, experiment__owner__in=owners)
                       .values_list("experiment__owner").annotate(n=Count("id")))
        last_start = dict(Run.objects.filter(started__isnull=False, experiment__owner__in=owners)
                          .values_list("experiment__owner").annotate(last=Max("started")))
        quotas = quotas_for(owners)
        eligible = [u for u in owners if running.get(u, 0) < quotas[u].concurrent_runs]
        if not eligible:
            return None
        never = timezone.now().replace(year=1)
        user = min(eligible, key=lambda u: (last_start.get(u) or never, owners[u], u))
        run_id = startable().filter(experiment__owner=user).order_by("created", "id").values_list(
            "id", flat=True).first()
        if run_id is not None:
            return run_id
        # that user's waiting runs left the queue while we looked (a cancel): look again
    return None


def claim_next_run(task_id: str = "") -> int | None:
    """Atomically mark the fairest queued run ``starting`` and return its id (None: nothing
    may start now). ``task_id``: the message claiming it, recorded on the run (a redelivery
    of that message adopts this run, whichever run the message was sent for)."""
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [DISPATCH_LOCK])
        for _ in range(PICK_TRIES):
            run_id = next_run_id()
            if run_id is None:
                return None
            now = timezone.now()  # the claimer owns the run from here on (controller/supervision/ownership.py)
            if Run.objects.filter(pk=run_id, status=Run.Status.QUEUED, cancel_requested=False).update(
                    status=Run.Status.STARTING, started=now, heartbeat=now, supervisor=me(),
                    start_task_id=task_id or ""):
                return run_id
            # lost the race: the run was cancelled after the pick (a cancel takes no dispatch lock)
        return None


def top_up() -> None:
    """After a run ends: one more slot if runs are waiting (it may start one that a limit held)."""
    first = waiting().order_by("created", "id").values_list("id", flat=True).first()
    if first is not None:
        enqueue(first, None)
