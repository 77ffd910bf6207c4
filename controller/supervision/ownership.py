"""No run without an owner: who supervises a run, whether it still does, and the reaper.

A `starting`/`running` run belongs to the process that claimed it: ``Run.supervisor`` is
"host:pid:start-time" of that process, and its supervisor stamps ``Run.heartbeat`` every
THUNDERSYNC_HEARTBEAT_S. The reaper (every worker runs it at start and every
THUNDERSYNC_REAP_INTERVAL_S; ``start_reaper``) ends the runs whose supervisor is gone: a
local owner whose process died at once, any other once its heartbeat has been stale
(> THUNDERSYNC_STALE_S) on two passes in a row, so a supervisor that was only cut off from
the database for a while gets to stamp again first. An abandoned run is cancelled if the
user asked, else failed with the reason (docs/controller.md "No run without an owner").
Every write is conditional on the heartbeat the reaper saw, so reapers on several workers,
and a supervisor that comes back, never overwrite each other.

A queued run that may start but whose message the broker lost (a Redis restart without
persistence) gets a new one once it has waited THUNDERSYNC_REQUEUE_AFTER_S and the queue
is empty; a message is only a slot (controller/supervision/dispatch.py), so one too many is harmless.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from contextlib import contextmanager
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from learner.stopping import sweep_semaphores

from controller.broker import backlog, enqueue
from controller.supervision.dispatch import next_run_id
from controller.supervision import liveness
from controller.ingest.ingestion import finish_run
from controller.models import Run
from controller.limits.outages import OUTAGE_ERRORS, first_line, what_is_down
from controller.supervision.processes import HOST, group_members, process_start, signal_group, works_in
from controller.supervision.resuming import requeue_attempt
from controller.supervision.runlog import run_dir

log = logging.getLogger(__name__)
HANDED_OFF = "queue:"  # Run.supervisor of a run handed to another node's queue, not yet taken
_supervising: set[int] = set()  # runs whose supervisor runs in this process right now
_stale_seen: dict[int, datetime | None] = {}  # run -> the stale heartbeat an earlier pass saw


@contextmanager
def supervising(run_id: int):
    """Mark ``run_id`` as supervised by a live thread of this process for the block."""
    _supervising.add(run_id)
    try:
        yield
    finally:
        _supervising.discard(run_id)


def owner_dead(supervisor: str, run_id: int) -> str | None:
    """Why the owner is certainly gone (only this host can tell), or None."""
    host, pid, started = (supervisor.split(":") + ["", "", ""])[:3]
    if host != HOST or not pid.isdigit():
        return None
    if int(pid) == os.getpid():
        return None if run_id in _supervising else "its supervisor in this worker process stopped"
    if process_start(int(pid)) != started:
        return f"its supervising worker process {pid} is gone"
    return None


def heartbeat_stale(run: Run, now: datetime) -> bool:
    """No heartbeat in the database for THUNDERSYNC_STALE_S and no sign of life from the
    supervisor in the run directory (controller/supervision/liveness.py): a supervisor that only lost the
    database is not stale."""
    limit = timedelta(seconds=settings.THUNDERSYNC_STALE_S)
    stale = run.heartbeat is None or now - run.heartbeat > limit
    return stale and not liveness.alive(run.pk, run.supervisor)


def kill_leftovers(run: Run) -> None:
    """Stop what is left of the run's process group on this host: SIGTERM (the learner
    stops at a safe point), SIGKILL after THUNDERSYNC_CANCEL_GRACE_S, then check the group is
    gone and remove the semaphores a killed group leaves. The learner stops by itself once
    its supervisor is gone (parent-death signal, broken stdout pipe); this is for one that
    hangs. The group is the run's if one of its processes works in the run's directory
    (cold or forked by the warm runner, the learner and its workers do), whatever its command
    line; a reused pid elsewhere is left alone."""
    if not run.pids or run.supervisor.split(":")[0] != HOST:
        return
    pgid = int(run.pids[0])
    if any(works_in(pid, run_dir(run.pk)) for pid in group_members(pgid)):
        for sig, wait_s in ((signal.SIGTERM, settings.THUNDERSYNC_CANCEL_GRACE_S), (signal.SIGKILL, 10.0)):
            if not signal_group(pgid, sig, wait_s):
                break
        if left := group_members(pgid):
            log.error("run %s: process group %s still has members %s 10s after SIGKILL", run.pk, pgid, left)
    sweep_semaphores({pgid})


def abandon(run: Run, reason: str) -> bool:
    """End a run whose supervisor is gone, or resume it from its latest checkpoint (up to
    THUNDERSYNC_AUTO_RESUMES attempts); False if its owner stamped it meanwhile."""
    kill_leftovers(run)
    cas = {"heartbeat": run.heartbeat, "supervisor": run.supervisor, "status__in": Run.ACTIVE}
    if not run.cancel_requested and run.attempt < settings.THUNDERSYNC_AUTO_RESUMES and run.checkpoints.exists():
        if requeue_attempt(run.pk, only_if=cas):
            log.warning("run %s: %s, resuming it from its latest checkpoint", run.pk, reason)
            return True
        return False
    if run.cancel_requested:
        status, error = Run.Status.CANCELLED, ""
    else:
        why_not = ("no checkpoint to resume from" if not run.checkpoints.exists()
                   else f"not resumed again after {run.attempt} attempts (THUNDERSYNC_AUTO_RESUMES)")
        status, error = Run.Status.FAILED, f"the run lost its supervisor ({reason}); {why_not}"
    ended = finish_run(run.pk, status, error, only_if={"heartbeat": run.heartbeat, "supervisor": run.supervisor})
    if ended.status == status and ended.heartbeat == run.heartbeat:
        log.warning("run %s: %s, ended %s", run.pk, reason, status)
        return True
    return False


def reap_active(now: datetime) -> int:
    ended = 0
    for run in Run.objects.filter(status__in=Run.ACTIVE):
        reason = owner_dead(run.supervisor, run.pk)
        if reason is None and heartbeat_stale(run, now):
            seen = _stale_seen.get(run.pk, "unseen")
            _stale_seen[run.pk] = run.heartbeat
            if seen != run.heartbeat:
                continue  # stale once: the owner may only have lost the database; look again
            age = "never" if run.heartbeat is None else f"{(now - run.heartbeat).total_seconds():.0f}s ago"
            reason = f"its supervisor {run.supervisor or '(none)'} last reported {age}"
            if run.supervisor.startswith(HANDED_OFF):  # controller/supervision/nodes.py: rank 0's node never took it
                reason = (f"no worker took it from queue {run.supervisor.removeprefix(HANDED_OFF)} within "
                          f"{settings.THUNDERSYNC_STALE_S:g}s (is a worker of that node running?)")
        if reason is not None:
            ended += abandon(run, reason)
            _stale_seen.pop(run.pk, None)
    return ended


def requeue_lost(now: datetime) -> int:
    """One slot (controller/supervision/dispatch.py) when a queued run may start, has waited
    THUNDERSYNC_REQUEUE_AFTER_S since its last message, and the broker holds none: its
    message was lost. A slot too many is harmless (it claims nothing)."""
    run_id = next_run_id()
    if run_id is None:
        return 0
    cutoff = now - timedelta(seconds=settings.THUNDERSYNC_REQUEUE_AFTER_S)
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        return 0  # withdrawn meanwhile (a launch whose message the broker refused)
    if (run.enqueued or run.created) > cutoff or backlog() != 0:
        return 0
    if not Run.objects.filter(pk=run_id, status=Run.Status.QUEUED, enqueued=run.enqueued).update(enqueued=now):
        return 0  # another worker's reaper sent it
    log.warning("run %s: queued for %.0fs and the broker holds no message: sending one again", run_id,
                (now - (run.enqueued or run.created)).total_seconds())
    enqueue(run_id, None)
    return 1


def reap() -> tuple[int, int]:
    """One pass: (runs ended, queued runs re-sent)."""
    now = timezone.now()
    return reap_active(now), requeue_lost(now)


def start_reaper(interval_s: float | None = None, each_pass=None) -> threading.Event:
    """Reap now and then every ``interval_s`` in a daemon thread; set the event to stop it.
    ``each_pass``: called before each pass (a worker stamps its nodes, controller/supervision/nodes.py)."""
    stop = threading.Event()
    interval_s = interval_s or settings.THUNDERSYNC_REAP_INTERVAL_S

    def loop() -> None:
        while True:
            if each_pass is not None:
                each_pass()
            try:
                reap()
            except OUTAGE_ERRORS as err:  # the database or the broker is down: try again on the next pass
                log.warning("reaper pass skipped: the %s is unreachable (%s)", what_is_down(err), first_line(err))
            except Exception:
                log.warning("reaper pass failed", exc_info=True)
            finally:
                connection.close()  # this thread's own; a broken one is not reused
            if stop.wait(interval_s):
                return

    threading.Thread(target=loop, name="thundersync-reaper", daemon=True).start()
    return stop
