"""Turn the learner's JSONL event stream into database rows and live frames, in batches.

The supervisor feeds every stdout line to ``RunIngestor.feed`` and calls ``flush_if_due``
between lines. Each line is parsed and validated into the next batch (controller/ingest/run_events.py);
a flush writes the batch in one transaction (controller/ingest/bulk_writes.py: spans and checkpoints
already stored are kept, so re-ingesting a line is harmless; metrics are upserted), then
publishes a few frames. Writes commit before frames go out, so a client that sees a frame can
always find it in the database (the websocket consumer relies on that to fill gaps).
"""

import logging
import time
from collections import deque

from django.db import DatabaseError, transaction
from django.utils import timezone

from controller.live import broadcast as live
from controller.supervision import nodes
from controller.ingest.bulk_writes import write_batch
from controller.live.frames import (assignment_frame, log_frame, metrics_frame, spans_frame, status_frame, system_frame,
                     trajectories_frame)
from controller.models import Run, StepMetric
from controller.limits.outages import OUTAGE_ERRORS, first_line
from controller.ingest.run_events import Batch, EventReader

log = logging.getLogger(__name__)

MIN_FLUSH_S = 0.02  # at most ~50 transactions a second for a run that writes line by line


class RunIngestor(EventReader):
    """Buffers one run's events (``EventReader``: parsed and validated) and writes them out every
    ``flush_s`` or ``flush_spans``; the learner's log lines go out with each flush."""

    def __init__(self, run_id: int, flush_s: float, flush_spans: int):
        super().__init__(run_id)
        self.flush_s = flush_s
        self.flush_spans = flush_spans
        self._log: deque[tuple[int, str]] = deque()  # (line number, text) from the stderr reader thread
        self._last_flush = time.monotonic()

    def add_log(self, number: int, line: str) -> None:
        """A line of the learner's log (called by the supervisor's stderr reader thread)."""
        self._log.append((number, line))

    def pending(self) -> bool:
        return bool(self.batch or self._log or self.assignments.pending)

    def wait_s(self) -> float:
        """How long the supervisor may wait for the next line before it must call flush_if_due."""
        return MIN_FLUSH_S if self.pending() else self.flush_s

    def flush_if_due(self, drained: bool = False) -> None:
        """Flush at ``flush_spans`` spans, when the oldest buffered event is ``flush_s`` old, or
        once the learner's last write is all fed (``drained``) and ``MIN_FLUSH_S`` has passed
        since the last flush: the learner writes in bursts (learner.timeline.JsonlSink), so a
        burst goes out whole and at once, and a trickle of lines still makes few transactions."""
        if not self.pending():
            return
        age = time.monotonic() - self._last_flush
        if len(self.batch.spans) >= self.flush_spans or age >= self.flush_s or (drained and age >= MIN_FLUSH_S):
            self.flush()

    def flush(self) -> None:
        batch, self.batch = self.batch, Batch()
        self._last_flush = time.monotonic()
        try:
            with transaction.atomic():
                self.assignments.apply(self.run_id, batch.spans)  # before the spans are written
                write_batch(self.run_id, batch)
        except DatabaseError:  # nothing was written: keep it all for the supervisor's next try
            self.batch = batch.followed_by(self.batch)
            raise
        self.publish_batch(batch, self.assignments.committed())
        self.publish_log()

    def publish_batch(self, batch: Batch, assigned: list[tuple[int, list[int]]]) -> None:
        """The frames of a committed batch (the database has every row they name)."""
        if batch.became_running:
            live.publish(self.run_id, status_frame(Run.objects.get(pk=self.run_id)))
        if batch.spans:
            live.publish(self.run_id, spans_frame(sorted(batch.spans, key=lambda s: s["seq"])))
        for step, assigned_trajs in assigned:  # the spans a page already holds with step -1
            live.publish(self.run_id, assignment_frame(step, assigned_trajs))
        if batch.metrics:
            live.publish(self.run_id, metrics_frame(
                [{"step": step, "values": values} for step, values in sorted(batch.metrics.items())]))
        if batch.system:
            live.publish(self.run_id, system_frame(batch.system))
        if batch.trajectories:
            live.publish(self.run_id, trajectories_frame(sorted({r.step for r in batch.trajectories})))

    def publish_log(self) -> None:
        """New log lines as one frame (the file already has them: see controller.supervision.runlog)."""
        lines = [self._log.popleft() for _ in range(len(self._log))]
        if lines:
            live.publish(self.run_id, log_frame(lines[0][0], [text for _, text in lines]))


def summarize(run_id: int, learner_summary: dict) -> dict:
    """The learner's summary, plus the step count and the mean of every numeric metric."""
    rows = list(StepMetric.objects.filter(run_id=run_id).values_list("values", flat=True))
    sums: dict[str, list[float]] = {}
    for values in rows:
        for name, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                sums.setdefault(name, []).append(float(value))
    means = {f"mean/{name}": sum(v) / len(v) for name, v in sorted(sums.items())}
    return {"steps": len(rows), **means, **learner_summary}


def finish_run(run_id: int, status: str, error: str = "", summary: dict | None = None,
               only_if: dict | None = None) -> Run:
    """Record the final state once (a finished run is never rewritten) and tell the pages.
    ``only_if``: field values the run must still have (the reaper's compare-and-set)."""
    Run.objects.filter(pk=run_id, **(only_if or {})).exclude(status__in=Run.FINISHED).update(
        status=status, error=error, summary=summarize(run_id, summary or {}), finished=timezone.now(),
    )
    run = Run.objects.get(pk=run_id)
    live.publish(run_id, status_frame(run))
    if run.status in Run.FINISHED:
        try:  # a queue of a node no worker serves, which the run's messages created, goes with it
            nodes.release_queues(run_id, run.config)
        except OUTAGE_ERRORS as err:
            log.warning("run %s: could not delete its nodes' queues (%s)", run_id, first_line(err))
    return run
