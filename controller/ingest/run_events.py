"""What a run reports: its JSONL event lines decoded, validated and buffered for the next write.

``parse_line`` decodes and validates one stdout line without touching any state (the
supervisor's stdout reader calls it in its own thread); ``EventReader.take`` files the result
into a ``Batch``, the rows of the next flush (controller/ingest/ingestion.py), or into what the stream
said about the run itself: started, finished with a summary, failed. A line that is not a valid
event is remembered (``rejected``) and otherwise ignored.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from controller import trajectories
from controller.ingest.assignments import Assignments
from controller.models import Checkpoint
from controller.jsonapi.serializers import SPAN_FIELDS

log = logging.getLogger(__name__)

OPTIONAL_INT_FIELDS = ("traj", "group", "turn", "policy_version")
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


def parse_line(line: str) -> Parsed | None:
    """Decode and validate one line; None for a blank line."""
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


@dataclass
class Batch:
    """The validated rows a run reported since the last write, written together in one transaction."""
    spans: list[dict] = field(default_factory=list)  # span rows (SPAN_FIELDS)
    metrics: dict[int, dict] = field(default_factory=dict)  # step -> values (a later event for a step wins)
    system: list[dict] = field(default_factory=list)  # the processes on the wall clock: t, node, values
    checkpoints: list[Checkpoint] = field(default_factory=list)
    trajectories: list = field(default_factory=list)  # TrajectoryRecord, after their step
    became_running: bool = False  # the learner said "started": STARTING -> RUNNING

    def __bool__(self) -> bool:
        return bool(self.spans or self.metrics or self.system or self.checkpoints or self.trajectories
                    or self.became_running)

    def followed_by(self, newer: Batch) -> Batch:
        """This batch (a write that failed) and then ``newer``: one batch, in report order."""
        return Batch(self.spans + newer.spans, {**self.metrics, **newer.metrics}, self.system + newer.system,
                     self.checkpoints + newer.checkpoints, self.trajectories + newer.trajectories,
                     self.became_running or newer.became_running)


class EventReader:
    """One run's events, validated and filed: the rows into ``batch`` (taken by each flush), the
    fully-async step assignments into ``assignments``, the run's own state into ``finished``,
    ``summary`` and ``failure``."""

    def __init__(self, run_id: int):
        self.run_id = run_id
        self.batch = Batch()
        self.assignments = Assignments()  # fully-async: its rollout spans' steps (controller/ingest/assignments.py)
        self.finished = False
        self.summary: dict = {}
        self.failure: str = ""
        self.rejected: list[str] = []  # lines that were not valid events, for the error text

    def feed(self, line: str) -> None:
        self.take(self.parse(line))

    def parse(self, line: str) -> Parsed | None:
        """``parse_line``: touches no state of the reader (the supervisor's stdout reader thread calls it)."""
        return parse_line(line)

    def take(self, parsed: Parsed | None) -> None:
        """File one parsed line for the next flush (the supervisor's loop calls it)."""
        if parsed is None:
            return
        try:
            if parsed.error:
                raise ValueError(parsed.error)
            if parsed.span is not None:
                self.batch.spans.append(parsed.span)
            else:
                self._take(parsed.event)
        except ValueError as err:
            self.rejected.append(f"{err}: {parsed.text}")
            log.warning("run %s: ignored an event line: %s", self.run_id, err)

    def _take(self, event: dict) -> None:
        kind, batch = event.get("type"), self.batch
        if kind == "span":
            batch.spans.append(span_from_event(event))
        elif kind == "metrics":
            if not is_int32(event.get("step")) or not isinstance(event.get("values"), dict):
                raise ValueError("metrics: expected an integer step and a values object")
            batch.metrics[event["step"]] = finite_or_none(event["values"])
        elif kind == "system":
            t, node, values = event.get("t"), event.get("node"), event.get("values")
            if not (isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t)) \
                    or not isinstance(node, str) or len(node) > 200 or not isinstance(values, dict):
                raise ValueError("system: expected a finite t, a node name of at most 200 characters and a values object")
            batch.system.append({"t": float(t), "node": node, "values": finite_or_none(values)})
        elif kind == "checkpoint":
            if not is_int32(event.get("step")) or not isinstance(event.get("path"), str):
                raise ValueError("checkpoint: expected an integer step and a path")
            batch.checkpoints.append(Checkpoint(run_id=self.run_id, step=event["step"], path=event["path"]))
        elif kind == "trajectory":
            batch.trajectories.append(trajectories.record_from_event(self.run_id, event))
        elif kind == "assignment":
            self.assignments.take(event)
        elif kind == "run":
            self._take_run_event(event)
        else:
            raise ValueError(f"type: unknown event type {kind!r}")

    def _take_run_event(self, event: dict) -> None:
        status = event.get("status")
        if status == "started":
            self.batch.became_running = True
        elif status == "finished":
            self.finished = True
            self.summary = finite_or_none(event["summary"]) if isinstance(event.get("summary"), dict) else {}
        elif status == "failed":
            self.failure = str(event.get("error") or "the learner reported a failure without a message")
        else:
            raise ValueError(f"run.status: unknown status {status!r}")
