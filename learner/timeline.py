"""Spans, metrics and the sinks they flow into (docs/spans.md).

Every phase of a run is a ``Span`` with monotonic times in seconds from run start. Worker
processes stamp spans with ``time.monotonic()`` (system-wide on Linux), so spans from the
learner and the rollout fleet share one clock. Metrics are derived from spans only, so a
number the app shows is always backed by what actually ran.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Iterable, Protocol



class Kind:
    """Span kinds (docs/spans.md). The learner, the controller and, through ``conventions()``
    served to the pages, the JavaScript all name kinds through these."""

    GENERATE = "rollout.generate"
    TOOL = "rollout.tool"  # the tool's real time
    TOOL_WAIT = "rollout.tool_wait"  # the modelled latency after it (task.tool_latency)
    VERIFY = "rollout.verify"
    DRAFT = "rollout.draft"  # a turn generated as a draft of a later step, under older weights (docs/speculation.md)
    DRAFT_VERIFY = "rollout.draft_verify"  # the forward that verifies a draft against the new weights
    TEACHER = "teacher.score"
    BACKWARD = "learner.backward"
    GROUP_CLOSE = "learner.group_close"
    OPTIMIZER = "learner.optimizer"
    PUBLISH = "learner.publish"


SPAN_KINDS: tuple[str, ...] = (Kind.GENERATE, Kind.TOOL, Kind.TOOL_WAIT, Kind.VERIFY, Kind.TEACHER, Kind.DRAFT,
                               Kind.DRAFT_VERIFY, Kind.BACKWARD, Kind.GROUP_CLOSE, Kind.OPTIMIZER, Kind.PUBLISH)
LEARNER_KINDS = (Kind.BACKWARD, Kind.GROUP_CLOSE, Kind.OPTIMIZER, Kind.PUBLISH)
ROLLOUT_KINDS = (Kind.GENERATE, Kind.TOOL, Kind.TOOL_WAIT, Kind.VERIFY, Kind.TEACHER, Kind.DRAFT, Kind.DRAFT_VERIFY)


class Metric:
    """Per-step metric names (docs/spans.md; verl's where one exists)."""

    STEP_S = "timing_s/step"
    LEARNER_S = "timing_s/learner"
    GEN_S = "timing_s/gen"
    TAIL_S = "timing_s/tail"
    TRAINER_IDLE = "trainer/idle_ratio"
    TRAINER_WAIT = "trainer/wait_ratio"
    ROLLOUT_IDLE = "rollouter/idle_ratio"
    STALENESS_MEAN = "staleness/mean"
    STALENESS_MAX = "staleness/max"
    STALENESS_TURNS = "staleness/turns_"  # + k: how many trained turns had staleness k
    REWARD_MEAN = "reward/mean"
    T_START = "step/t_start"
    T_END = "step/t_end"
    LAST_REWARD_T = "step/last_reward_t"
    FIRST_BACKWARD_T = "step/first_backward_t"
    TURNS_MEAN = "response/turns_mean"
    TOKENS = "response/tokens"
    GRAD_NORM = "actor/grad_norm"
    CLIP_FRAC = "actor/clip_frac"
    PEAK_BUFFERS = "actor/peak_buffers"
    SKIPPED_TRAJECTORIES = "learner/skipped_trajectories"  # A = 0 exactly: no backward (docs/learner.md)
    SPECULATIVE_TRAJECTORIES = "learner/speculative_trajectories"
    MICRO_BATCHES = "learner/micro_batches"
    PADDING_SHARE = "learner/padding_share"  # padded token slots / all slots of the learner's micro-batches
    SHARED_PROMPT_ROWS = "learner/shared_prompt_rows"  # rows learnt against their group's shared prompt
    OPEN_ROW_COST = "learner/open_row_cost"  # an open-group row's backward time / a known row's (docs/learner.md)
    # the learner's work, load-independent: token slots forwarded and back-propagated, its own CPU
    # seconds in them, rows and micro-batches into open groups' sums, known micro-batches run
    # before the batch's last arrival (docs/learner.md)
    TOKEN_SLOTS = "learner/token_slots"
    LEARNER_CPU_S = "learner/cpu_s"
    OPEN_ROWS = "learner/open_rows"
    OPEN_MICRO_BATCHES = "learner/open_micro_batches"
    EARLY_MICRO_BATCHES = "learner/early_micro_batches"
    # why streaming learnt early or deferred (docs/learner-drain.md, "When early work pays"; a run page's
    # one sentence reads these): the share of the step's learnt rows learnt before its last arrival,
    # the share of its groups that closed in the last tenth of the rollout (every schedule), the
    # cost model's early row seconds over a known row's, and the idle moments that learnt nothing,
    # by reason (+ one of cost_model.DEFER_REASONS: unmeasured, cost, allowance, count,
    # not_near_end, overrun, policy)
    EARLY_ROW_SHARE = "learner/early_row_share"
    LATE_CLOSE_SHARE = "learner/late_close_share"
    EARLY_COST_RATIO = "learner/early_cost_ratio"
    DEFERRED = "learner/deferred_"
    PEAK_ACCUMULATOR_MB = "learner/peak_accumulator_mb"
    PEAK_LEARNER_MEMORY_MB = "learner/peak_memory_mb"  # on a GPU: max allocated over the step
    PEAK_RSS_MB = "memory/peak_rss_mb"
    GRAD_BUFFERS_MB = "memory/grad_buffers_mb"
    VERSION = "policy/version"
    DROPPED_GROUPS = "rollout/dropped_groups"
    MISMATCH_KL = "mismatch/kl"
    MISMATCH_MAX_ABS = "mismatch/max_abs"
    MISMATCH_TOKENS = "mismatch/tokens"
    TASK_TURN_ERRORS = "task/turn_errors"  # scored 0 for a malformed turn (docs/tasks.md)
    TASK_REWARD_ERRORS = "task/reward_errors"  # scored 0 for a counted data/reward error
    EVAL_REWARD = "eval/reward"  # train.eval_every (docs/tasks.md)
    EVAL_PASS_AT = "eval/pass@"  # + k
    EVAL_PROMPTS = "eval/prompts"
    EVAL_SECONDS = "eval/seconds"
    DRAFTED_TOKENS = "speculation/drafted_tokens"  # sampled tokens of the step's drafts (docs/speculation.md)
    KEPT_TOKEN_SHARE = "speculation/kept_token_share"  # of the drafted tokens, the share verification kept
    WHOLE_DRAFT_SHARE = "speculation/whole_draft_share"  # of the drafts, the share kept token for token
    KEPT_SHARE_AHEAD = "speculation/kept_token_share_ahead_"  # + "1" or "2plus": of drafts first drafted that many steps ahead
    DRAFTED_AHEAD = "speculation/drafted_tokens_ahead_"  # + "1" or "2plus": their drafted tokens
    VERIFY_S = "speculation/verify_s"  # seconds of verification forwards in the step's window
    REMAINDER_TOKENS = "speculation/remainder_tokens"  # tokens drafted trajectories sampled after verification
    VERIFIED_KV_TOKENS = "speculation/verified_kv_tokens"  # context tokens remainders did not prefill again
    SPEC_DRAFTING = "speculation/drafting"  # 1 if the step's batch was drafted (rollout.speculation.gate), else 0
    SPEC_EST_GAIN_S = "speculation/est_gain_s"  # engine seconds a drafted batch was expected to save then
    ROLLOUT_BUSY_SHARE = "rollouter/busy_share"  # the engines' busy time (generate, draft, verify) / window x workers
    RANKS_IN_SYNC = "learner/ranks_in_sync"  # data-parallel: every rank's weights equal (docs/distributed.md)
    # the curves of an RL run (learner/driver/curves.py)
    PG_LOSS = "actor/pg_loss"  # the policy loss whose gradient the barrier applied
    ENTROPY = "actor/entropy"  # mean next-token entropy over the scored tokens the learner forwarded
    KL_REF = "actor/kl_loss"  # mean k3 KL to the reference over the same tokens (algorithm.kl_coef > 0)
    LR = "actor/lr"  # the optimizer's learning rate for the step
    REWARD_STD = "reward/std"
    REWARD_MIN = "reward/min"
    REWARD_MAX = "reward/max"
    RESPONSE_LENGTH = "response_length/"  # + mean, p50, p90, min, max: generated tokens per trajectory
    SYSTEM = "system/"  # + <process>/cpu_percent, <process>/rss_mb (+ gpu_util, gpu_memory_mb on a GPU)


def conventions() -> dict[str, Any]:
    """Span kinds and metric names as the pages read them (``controller`` serves this JSON)."""
    def names(cls: type) -> dict[str, str]:
        return {k: v for k, v in vars(cls).items() if k.isupper()}

    return {"kind": names(Kind), "metric": names(Metric), "span_kinds": list(SPAN_KINDS),
            "learner_kinds": list(LEARNER_KINDS), "rollout_kinds": list(ROLLOUT_KINDS)}


@dataclass
class Span:
    step: int
    kind: str
    t0: float
    t1: float
    lane: str
    traj: int | None = None
    group: int | None = None
    turn: int | None = None
    policy_version: int | None = None
    tokens: int = 0
    seq: int = -1  # assigned by the driver's sequencer, dense from 0

    def to_event(self) -> dict[str, Any]:
        return {"type": "span", **vars(self)}  # flat fields: vars() is a cheap asdict()

    def __reduce__(self):
        # pickled as its field values: workers send thousands per step and the learner's
        # core unpickles every one (a default dataclass pickle costs about twice as much)
        return (Span, (self.step, self.kind, self.t0, self.t1, self.lane, self.traj, self.group, self.turn,
                       self.policy_version, self.tokens, self.seq))


@dataclass
class StepMetrics:
    step: int
    values: dict[str, float] = field(default_factory=dict)

    def to_event(self) -> dict[str, Any]:
        return {"type": "metrics", "step": self.step, "values": self.values}


class EventSink(Protocol):
    """Where a run reports: ``emit`` takes a ``Span``, ``StepMetrics`` or a plain dict event;
    ``idle(busy)`` is called when the learner is about to wait for the rollout fleet, so a sink
    can do deferred work then, stopping as soon as ``busy()`` says there is something to learn."""

    def emit(self, event: Span | StepMetrics | dict[str, Any]) -> None: ...

    def idle(self, busy: Callable[[], bool]) -> None: ...

    def close(self) -> None: ...


def as_event(event: Span | StepMetrics | dict[str, Any]) -> dict[str, Any]:
    return event if isinstance(event, dict) else event.to_event()


class EventsUnwritable(OSError):
    """The event stream cannot be written (one line: where and why)."""


_events_stdout: IO[str] | None = None  # see claim_stdout


def claim_stdout() -> IO[str]:
    """Keep stdout for events: ``JsonlSink('-')`` writes to a duplicate of fd 1, and fd 1 itself
    now goes to stderr, so whatever else writes there (a library's logger, C code, processes
    spawned later, such as the rollout workers) cannot corrupt the event stream."""
    global _events_stdout
    if _events_stdout is None:
        sys.stdout.flush()
        _events_stdout = os.fdopen(os.dup(1), "w")
        os.dup2(2, 1)
    return _events_stdout


class JsonlSink:
    """One JSON object per line; ``path='-'`` writes to stdout (the controller reads that).

    Serialising an event costs ~25 µs of the learner's core, and a step of the bench workload
    brings ~1,800 rollout spans through the learner, so ``emit`` only queues. The queue is
    written when the learner is about to wait for the rollout anyway (``idle``: the driver
    calls it before it blocks), in chunks, until a message from the fleet is waiting; and by
    a flusher thread once the oldest queued event is ``max_delay_s`` old, so a learner busy
    with backward passes still reports live (the page's span latency, docs/bench-web.md) without
    writing on its own path. Run status events are written at once. The order is always
    kept: whoever writes takes events from the head of the queue while holding the write lock.
    """

    MAX_DELAY_S = 0.03
    CHUNK = 64  # events per write between checks for fleet messages

    def __init__(self, path: str, max_delay_s: float | None = MAX_DELAY_S):
        self._own = path != "-"
        self._name = "stdout" if path == "-" else path
        try:
            self._fh: IO[str] = open(path, "w") if self._own else (_events_stdout or sys.stdout)
        except OSError as err:
            raise EventsUnwritable(f"cannot write events to {path}: {err.strerror or err}") from None
        self._queue: list[dict[str, Any]] = []
        self._oldest = 0.0  # when the oldest queued event arrived
        # None: writable; an EventsUnwritable the flusher met (raised on the learner's next write);
        # False: already reported, events are dropped
        self._error: EventsUnwritable | bool | None = None
        self._queue_lock = threading.Lock()  # held for list operations only: emit never waits on I/O
        self._write_lock = threading.Lock()  # one writer at a time, taking from the head: order kept
        self._stop = threading.Event()
        self._flusher = None
        if max_delay_s is not None:  # None: written only in idle/close (tests of the idle path)
            self._max_delay_s = max_delay_s
            self._flusher = threading.Thread(target=self._flush_late, name="jsonl-flusher", daemon=True)
            self._flusher.start()

    def emit(self, event: Span | StepMetrics | dict[str, Any]) -> None:
        event = as_event(event)
        with self._queue_lock:
            if not self._queue:
                self._oldest = time.monotonic()
            self._queue.append(event)
        if event["type"] == "run":
            self._write(lambda: False, wait=True)

    def idle(self, busy: Callable[[], bool]) -> None:
        self._write(busy, wait=False)  # the flusher is writing: nothing to do here

    def _write(self, busy: Callable[[], bool], wait: bool) -> None:
        if self._error is not None:  # reported once; nothing more can be written
            error, self._error = self._error, False
            with self._queue_lock:
                self._queue.clear()
            if error:
                raise error
            return
        if not self._write_lock.acquire(blocking=wait):
            return
        try:
            wrote = False
            while not (wrote and busy()):
                with self._queue_lock:
                    chunk = self._queue[:self.CHUNK]
                    del self._queue[:self.CHUNK]
                    self._oldest = time.monotonic()
                if not chunk:
                    break
                self._fh.write("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in chunk))
                wrote = True
            if wrote:
                self._fh.flush()
        except OSError as err:  # a full disk, a reader that went away (EPIPE)
            with self._queue_lock:
                self._queue.clear()
            self._error = False
            raise EventsUnwritable(f"cannot write events to {self._name}: {err.strerror or err}") from None
        finally:
            self._write_lock.release()

    def _flush_late(self) -> None:
        period = self._max_delay_s / 2
        while not self._stop.wait(period):
            with self._queue_lock:
                late = bool(self._queue) and time.monotonic() - self._oldest >= self._max_delay_s
            if late:
                try:
                    self._write(lambda: False, wait=True)
                except EventsUnwritable as err:  # the learner's thread raises it on its next write
                    self._error = err
                    return

    def close(self) -> None:
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        try:
            self._write(lambda: False, wait=True)
        finally:
            if self._own:
                try:
                    self._fh.close()
                except OSError:
                    pass


class MemorySink:
    """Keeps every event; used by tests, the bench and the CLI's summaries."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: Span | StepMetrics | dict[str, Any]) -> None:
        self.events.append(as_event(event))

    def idle(self, busy: Callable[[], bool]) -> None:
        pass

    def close(self) -> None:
        pass

    def spans(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == "span"]

    def metrics(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == "metrics"]


class FanoutSink:
    def __init__(self, *sinks: EventSink):
        self.sinks = sinks

    def emit(self, event: Span | StepMetrics | dict[str, Any]) -> None:
        for s in self.sinks:
            s.emit(event)

    def idle(self, busy: Callable[[], bool]) -> None:
        for s in self.sinks:
            s.idle(busy)

    def close(self) -> None:
        for s in self.sinks:
            s.close()


def union_length(intervals: Iterable[tuple[float, float]], lo: float, hi: float) -> float:
    """Total length of the union of ``intervals`` clipped to [lo, hi]."""
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi)
    total, cur_a, cur_b = 0.0, None, None
    for a, b in clipped:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


def _get(span: Span | dict, name: str):
    return span[name] if isinstance(span, dict) else getattr(span, name)


def window_metrics(spans: Iterable[Span | dict], t_start: float, t_end: float) -> dict[str, float]:
    """Idle ratios over the wall-clock window [t_start, t_end] of one step.

    trainer/idle_ratio: share of the window in which no learner span was running.
    rollouter/idle_ratio: share of the window in which no rollout span (generate, tool,
    verify, teacher) was running anywhere in the fleet.
    """
    spans = list(spans)
    width = max(t_end - t_start, 1e-12)
    learner = [(_get(s, "t0"), _get(s, "t1")) for s in spans if _get(s, "kind") in LEARNER_KINDS]
    rollout = [(_get(s, "t0"), _get(s, "t1")) for s in spans if _get(s, "kind") in ROLLOUT_KINDS]
    return {
        "trainer/idle_ratio": 1.0 - union_length(learner, t_start, t_end) / width,
        "rollouter/idle_ratio": 1.0 - union_length(rollout, t_start, t_end) / width,
    }
