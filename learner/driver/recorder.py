"""The run clock and the span stream of one run: numbering, the sink, the spans and fleet
waits still inside a step's window (docs/spans.md)."""

from __future__ import annotations

import time

from learner.timeline import EventSink, Kind, Span
from learner.trajectory import ScoredTurn, Trajectory

LEARNER_LANE = "learner/0"


class Recorder:
    def __init__(self, sink: EventSink, learner_lane: str = LEARNER_LANE):
        self.sink, self.learner_lane = sink, learner_lane  # rank 0's lane (docs/distributed.md)
        self.origin = time.monotonic()
        self.seq = 0
        self.recent: list[dict] = []  # span events still inside a step window (metrics)
        self.waits: list[tuple[float, float]] = []  # run-clock intervals blocked on the fleet for data
        self.step = 0  # the step spans are stamped with
        self.first_backward: float | None = None  # run clock of the step's first backward, any rank
        self.backward_tokens: dict[int, int] = {}  # traj -> tokens its (next) learner.backward trains on

    def now(self) -> float:
        return time.monotonic() - self.origin

    def emit_span(self, span: Span) -> None:
        """Number the span and pass it on as an event (a dict, as the sink and the step
        window take it; this runs on the learner's core, once per span)."""
        event = span.to_event()
        event["seq"] = self.seq
        self.seq += 1
        self.sink.emit(event)
        self.recent.append(event)

    def emit_spans(self, spans: list[Span]) -> None:
        for s in spans:
            self.emit_span(s)

    def assign(self, step: int, trajs: list[Trajectory]) -> None:
        """``trajs`` are trained in ``step``: fully-async rolls a group out before any step takes
        it, so its rollout spans carry step -1 until this event (docs/spans.md, "Assignment"),
        which the controller applies to them; ``policy_version`` stays the sampling version."""
        self.sink.emit({"type": "assignment", "step": step, "trajs": [t.id for t in trajs]})

    def begin_step(self, step: int) -> None:
        self.step, self.first_backward = step, None

    def phase(self, kind: str, t0: float, t1: float, version: int, traj, group, lane: str | None = None) -> None:
        """A learner phase stamped with raw ``time.monotonic()`` (the learner's callback)."""
        t0, t1 = t0 - self.origin, t1 - self.origin
        if kind == Kind.BACKWARD and (self.first_backward is None or t0 < self.first_backward):
            self.first_backward = t0
        self.learner_span(kind, t0, t1, version, traj, group, lane)

    def expect_backward(self, item: Trajectory | ScoredTurn) -> None:
        """The tokens ``item``'s backward trains on, for its span (the learner may run it later:
        micro-batches, idle work)."""
        if isinstance(item, ScoredTurn):
            self.backward_tokens[item.traj] = item.turn_span[1] - item.turn_span[0]
        else:
            self.backward_tokens[item.id] = item.n_scored

    def learner_span(self, kind: str, t0: float, t1: float, version: int, traj=None, group=None,
                     lane: str | None = None) -> None:
        """A learner phase on ``lane`` (a data-parallel rank's own lane ``learner/<rank>``; rank 0's by default)."""
        tokens = self.backward_tokens.get(traj, 0) if kind == Kind.BACKWARD else 0
        self.emit_span(Span(step=self.step, kind=kind, t0=t0, t1=t1, lane=lane or self.learner_lane, traj=traj,
                            group=group, policy_version=version, tokens=tokens))

    def replica_spans(self, acks: list[tuple[int, float, float]], version: int) -> None:
        for w, t0, t1 in acks:  # one publish span per replica that loaded the weights
            self.emit_span(Span(step=self.step, kind=Kind.PUBLISH, t0=t0, t1=t1, lane=f"replica/{w}",
                                policy_version=version))

    def window(self, t_start: float, t_end: float, trained: list[Trajectory]) -> tuple[list[dict], list[tuple[float, float]]]:
        """The spans and waits of the step window [t_start, t_end]; forgets those that end
        before ``t_end`` (the next window starts there) and the ``trained`` trajectories."""
        for traj in trained:
            self.backward_tokens.pop(traj.id, None)
        spans, waits = [s for s in self.recent if s["t1"] > t_start], self.waits
        self.recent = [s for s in self.recent if s["t1"] > t_end]
        self.waits = [w for w in self.waits if w[1] > t_end]
        return spans, waits
