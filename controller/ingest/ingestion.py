"""Turn the learner's JSONL event stream into database rows and live frames, in batches.

The supervisor feeds every stdout line to ``RunIngestor.feed`` and calls ``flush_if_due``
between lines; a flush writes all buffered spans (``bulk_create(ignore_conflicts=True)``,
so re-ingesting a line is harmless), upserts metrics, then publishes a few frames. Writes
commit before frames go out, so a client that sees a frame can always find it in the
database (the websocket consumer relies on that to fill gaps).
"""

import json
import logging
import math
import time
from collections import deque
from typing import NamedTuple

from django.db import DatabaseError, transaction
from django.utils import timezone

from controller.live import broadcast as live
from controller.supervision import nodes
from controller import trajectories
from controller.ingest.assignments import Assignments
from controller.models import Checkpoint, Run, StepMetric, SystemSample
from controller.limits.outages import OUTAGE_ERRORS, first_line
from controller.live.frames import (assignment_frame, log_frame, metrics_frame, spans_frame, status_frame, system_frame,
                     trajectories_frame)
from controller.jsonapi.serializers import SPAN_FIELDS
from controller.ingest.bulk_writes import write_spans, write_trajectories

log = logging.getLogger(__name__)

OPTIONAL_INT_FIELDS = ("traj", "group", "turn", "policy_version")
MIN_FLUSH_S = 0.02  # at most ~50 transactions a second for a run that writes line by line
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def is_int32(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and INT32_MIN <= value <= INT32_MAX


def span_from_event(event: dict) -> dict:
    """Validate one span event: its row (``SPAN_FIELDS``); raises ValueError naming the bad field."""
    values = {name: event.get(name) for name in SPAN_FIELDS}
    values["tokens"] = event.get("tokens", 0)
    for name in ("seq", "step", "tokens", *OPTIONAL_INT_FIELDS):
        value = values[name]
        if value is None and name in OPTIONAL_INT_FIELDS:
            continue
        if not is_int32(value):
            raise ValueError(f"span.{name}: expected a 32-bit integer")
    for name in ("t0", "t1"):
        if not isinstance(values[name], (int, float)) or not math.isfinite(values[name]):
            raise ValueError(f"span.{name}: expected a finite number")
    for name in ("kind", "lane"):
        if not isinstance(values[name], str) or not 0 < len(values[name]) <= 64:
            raise ValueError(f"span.{name}: expected a string of 1-64 characters")
    return values


def finite_or_none(values: dict) -> dict:
    """JSON has no NaN/Infinity (PostgreSQL's jsonb refuses them): store null instead."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()}


class Parsed(NamedTuple):
    """One decoded stdout line: the event (and its span row), or why it is not one."""
    event: dict | None
    span: dict | None = None  # a span event's validated row
    error: str = ""
    text: str = ""


class RunIngestor:
    """Buffers one run's events and writes them out every ``flush_s`` or ``flush_spans``."""

    def __init__(self, run_id: int, flush_s: float, flush_spans: int):
        self.run_id = run_id
        self.flush_s = flush_s
        self.flush_spans = flush_spans
        self._spans: list[dict] = []  # validated span rows
        self._metrics: dict[int, dict] = {}
        self._system: list[dict] = []  # the processes on the wall clock (tracking.system_every_s): t, node, values
        self._checkpoints: list[Checkpoint] = []
        self._trajectories: list = []  # TrajectoryRecord, after their step (controller/trajectories.py)
        self._assignments = Assignments()  # fully-async: its rollout spans' steps (controller/ingest/assignments.py)
        self._became_running = False
        self._log: deque[tuple[int, str]] = deque()  # (line number, text) from the stderr reader thread
        self._last_flush = time.monotonic()
        # What the stream said about the end of the run.
        self.finished = False
        self.summary: dict = {}
        self.failure: str = ""
        self.rejected: list[str] = []  # lines that were not valid events, for the error text

    def feed(self, line: str) -> None:
        self.take(self.parse(line))

    def parse(self, line: str) -> "Parsed | None":
        """Decode and validate one line, touching no state of the ingestor: the supervisor's
        stdout reader calls it in its own (lowered-priority) thread; None for a blank line."""
        line = line.strip()
        if not line:
            return None
        try:
            event = json.loads(line)
            if not isinstance(event, dict):
                raise ValueError("not a JSON object")
            span = span_from_event(event) if event.get("type") == "span" else None
            return Parsed(event, span, "", "" if span is not None else line[:200])
        except ValueError as err:
            return Parsed(None, None, str(err), line[:200])

    def take(self, parsed: "Parsed | None") -> None:
        """Buffer one parsed line for the next flush (the supervisor's loop calls it)."""
        if parsed is None:
            return
        try:
            if parsed.error:
                raise ValueError(parsed.error)
            if parsed.span is not None:
                self._spans.append(parsed.span)
            else:
                self._take(parsed.event)
        except ValueError as err:
            self.rejected.append(f"{err}: {parsed.text}")
            log.warning("run %s: ignored an event line: %s", self.run_id, err)

    def _take(self, event: dict) -> None:
        kind = event.get("type")
        if kind == "span":
            self._spans.append(span_from_event(event))
        elif kind == "metrics":
            if not is_int32(event.get("step")) or not isinstance(event.get("values"), dict):
                raise ValueError("metrics: expected an integer step and a values object")
            self._metrics[event["step"]] = finite_or_none(event["values"])
        elif kind == "system":
            t, node, values = event.get("t"), event.get("node"), event.get("values")
            if not (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)) \
                    or not isinstance(node, str) or len(node) > 200 or not isinstance(values, dict):
                raise ValueError("system: expected a finite t, a node name of at most 200 characters and a values object")
            self._system.append({"t": float(t), "node": node, "values": finite_or_none(values)})
        elif kind == "checkpoint":
            if not is_int32(event.get("step")) or not isinstance(event.get("path"), str):
                raise ValueError("checkpoint: expected an integer step and a path")
            self._checkpoints.append(Checkpoint(run_id=self.run_id, step=event["step"], path=event["path"]))
        elif kind == "trajectory":
            self._trajectories.append(trajectories.record_from_event(self.run_id, event))
        elif kind == "assignment":
            self._assignments.take(event)
        elif kind == "run":
            self._take_run_event(event)
        else:
            raise ValueError(f"type: unknown event type {kind!r}")

    def _take_run_event(self, event: dict) -> None:
        status = event.get("status")
        if status == "started":
            self._became_running = True
        elif status == "finished":
            self.finished = True
            self.summary = finite_or_none(event["summary"]) if isinstance(event.get("summary"), dict) else {}
        elif status == "failed":
            self.failure = str(event.get("error") or "the learner reported a failure without a message")
        else:
            raise ValueError(f"run.status: unknown status {status!r}")

    def add_log(self, number: int, line: str) -> None:
        """A line of the learner's log (called by the supervisor's stderr reader thread)."""
        self._log.append((number, line))

    def pending(self) -> bool:
        return bool(self._spans or self._metrics or self._system or self._checkpoints or self._trajectories
                    or self._became_running
                    or self._log or self._assignments.pending)

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
        if len(self._spans) >= self.flush_spans or age >= self.flush_s or (drained and age >= MIN_FLUSH_S):
            self.flush()

    def flush(self) -> None:
        spans, metrics, checkpoints, trajs = self._spans, self._metrics, self._checkpoints, self._trajectories
        became_running = self._became_running
        self._spans, self._metrics, self._checkpoints, self._became_running = [], {}, [], False
        self._trajectories = []
        system, self._system = self._system, []
        self._last_flush = time.monotonic()
        try:
            with transaction.atomic():
                self._assignments.apply(self.run_id, spans)  # before the spans are written
                write_spans(self.run_id, spans)
                StepMetric.objects.bulk_create(
                    [StepMetric(run_id=self.run_id, step=step, values=values) for step, values in metrics.items()],
                    update_conflicts=True, unique_fields=["run", "step"], update_fields=["values"],
                )
                Checkpoint.objects.bulk_create(checkpoints, ignore_conflicts=True)
                SystemSample.objects.bulk_create([SystemSample(run_id=self.run_id, **x) for x in system])
                write_trajectories(trajs)
                if became_running:
                    Run.objects.filter(pk=self.run_id, status=Run.Status.STARTING).update(status=Run.Status.RUNNING)
        except DatabaseError:  # nothing was written: keep it all for the supervisor's next try
            self._spans, self._checkpoints = spans + self._spans, checkpoints + self._checkpoints
            self._trajectories = trajs + self._trajectories
            self._system = system + self._system
            self._metrics = {**metrics, **self._metrics}
            self._became_running = self._became_running or became_running
            raise
        assigned = self._assignments.committed()
        if became_running:
            live.publish(self.run_id, status_frame(Run.objects.get(pk=self.run_id)))
        if spans:
            live.publish(self.run_id, spans_frame(sorted(spans, key=lambda s: s["seq"])))
        for step, assigned_trajs in assigned:  # the spans a page already holds with step -1
            live.publish(self.run_id, assignment_frame(step, assigned_trajs))
        if metrics:
            live.publish(self.run_id, metrics_frame(
                [{"step": step, "values": values} for step, values in sorted(metrics.items())]))
        if system:
            live.publish(self.run_id, system_frame(system))
        if trajs:
            live.publish(self.run_id, trajectories_frame(sorted({r.step for r in trajs})))
        self.publish_log()

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
