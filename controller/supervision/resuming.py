"""Resume a run from its latest checkpoint: a new attempt of the same run
(docs/controller.md, "Checkpoints and resume").

Every run's learner writes under its run directory (``train.output_dir``, default
``output``): the final model, and with ``train.checkpoint_every`` its checkpoints, each
reported as a ``Checkpoint`` row. Resuming a failed or cancelled run puts it back in the
queue with ``attempt`` raised; its next supervisor starts ``thundersync train --resume``
on that directory. The learner continues with the step after the checkpoint, numbers its
spans after every stored one and starts its clock after the last stored span, so the
timeline and the charts continue; the metrics of steps the earlier attempt had done past
the checkpoint are replaced by the new attempt's (one row per step).
"""

import logging
import uuid
from functools import partial
from pathlib import Path

from django.db import transaction
from django.db.models import F, Max

from learner.checkpoint import PREFIX, discard, list_checkpoints, remove_uncommitted
from learner.checkpoint_integrity import damage

from controller.live import broadcast as live
from controller.broker import enqueue_or_leave_to_reaper
from controller.models import Run, Span
from controller.supervision.nodes import check_nodes
from controller.limits.quotas import check_queue
from controller.live.frames import status_frame

log = logging.getLogger(__name__)
DEFAULT_OUTPUT = "output"


class ResumeRefused(Exception):
    pass


def output_dir(config: dict) -> str:
    """Where the run's learner writes, relative to its run directory."""
    return (config.get("train") or {}).get("output_dir") or DEFAULT_OUTPUT


def requeue_attempt(run_id: int, only_if: dict | None = None, owner=None) -> bool:
    """Queue the run again as its next attempt (``only_if``: field values it must still have;
    ``owner``: check their queued-runs quota in the same transaction, quotas.check_queue)."""
    task_id = str(uuid.uuid4())
    with transaction.atomic():
        if owner is not None:
            check_queue(owner)
        requeued = Run.objects.filter(pk=run_id, **(only_if or {})).update(
            status=Run.Status.QUEUED, cancel_requested=False, error="", finished=None, supervisor="",
            heartbeat=None, pids=[], attempt=F("attempt") + 1, celery_task_id=task_id, start_task_id="",
        )
        if requeued:
            transaction.on_commit(partial(enqueue_or_leave_to_reaper, run_id, task_id))
    if requeued:
        live.publish(run_id, status_frame(Run.objects.get(pk=run_id)))
    return bool(requeued)


def request_resume(run: Run) -> Run:
    """Resume ``run`` (failed or cancelled, with a checkpoint); raises ResumeRefused with the
    reason, or quotas.QuotaExceeded."""
    if run.status not in Run.RESUMABLE:
        raise ResumeRefused(f"the run is {run.status}: only a failed or cancelled run can be resumed")
    if not run.checkpoints.exists():
        raise ResumeRefused("the run wrote no checkpoint to resume from (train.checkpoint_every)")
    check_nodes(run.config)  # its nodes' workers may be gone since (nodes.UnknownNode, a 400)
    if not requeue_attempt(run.pk, only_if={"status__in": Run.RESUMABLE}, owner=run.experiment.owner):
        raise ResumeRefused("the run changed meanwhile: reload it")
    run.refresh_from_db()
    return run


def remove_half_written(run_dir: Path, config: dict) -> None:
    """Checkpoints never committed (learner/checkpoint.py): the temporary directories a run
    killed while writing one (or a full disk) left, and any torn ``step-*`` one."""
    for name in remove_uncommitted(run_dir / output_dir(config)):
        log.info("%s: removed the uncommitted checkpoint %s", run_dir, name)


def commit_point(run: Run, run_dir: Path) -> None:
    """Make the newest checkpoint the database acknowledged the newest on disk, so ``--resume``
    continues from it: checkpoints written after it (by a learner that died before its report
    was stored, e.g. one writing a boundary checkpoint after its SIGTERM) are removed, with the
    half-written ones; their steps are trained again, so every step has its metrics and the
    spans stay dense. If none of the acknowledged ones is left on disk (pruned by
    ``train.keep_checkpoints``), the disk's own are kept: resuming from them beats failing."""
    remove_half_written(run_dir, run.config)
    on_disk = {int(path.name.removeprefix(PREFIX)): path for path in list_checkpoints(run_dir / output_dir(run.config))}
    acknowledged = set(run.checkpoints.values_list("step", flat=True)) & set(on_disk)
    # a damaged one does not count (learner/checkpoint_integrity.py): the learner would skip it,
    # and removing the newer ones for it could leave nothing to resume from
    intact = [step for step in sorted(acknowledged, reverse=True) if damage(on_disk[step], load_unverified=False) is None][:1]
    if not intact:
        return
    for step, path in on_disk.items():
        if step > intact[0] and step not in acknowledged:  # a damaged one is the learner's to set aside and name
            log.warning("run %s: checkpoint of step %s was never recorded: removed, resuming from step %s",
                        run.pk, step, intact[0])
            discard(path)


def resume_arguments(run: Run, run_dir) -> list[str]:
    """``thundersync train`` arguments of a resumed attempt."""
    stored = Span.objects.filter(run=run).aggregate(seq=Max("seq"), t=Max("t1"))
    last_seq = stored["seq"] if stored["seq"] is not None else -1
    return ["--resume", str(run_dir / output_dir(run.config)), "--seq-from", str(last_seq + 1),
            "--clock-from", repr(float(stored["t"] or 0.0))]
