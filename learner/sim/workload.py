"""What one training step costs, as input to the schedule simulator (learner/sim/command.py).

A ``Workload`` is a list of ``BatchWork`` (one per recorded or drawn step; the simulator
cycles through them) plus the machine shape: rollout slots, learner ranks, reduction cost.
Two sources:

- ``workload_from_spans(events)`` replays a recorded run (JSONL events, docs/architecture.md).
  A trajectory's rollout duration is its *envelope*, first t0 to last t1 of its rollout
  spans (generate, tool, verify, teacher.score), not the sum of those spans: the trajectory
  holds its slot (KV cache, sandbox) for the whole envelope, gaps between turns included,
  and OPD's teacher.score runs concurrently with the tool call, so a sum would count that
  time twice. Its backward duration is the sum of its learner.backward spans (OPD streams
  one per turn) plus the learner's uncovered time just before it once its reward was in
  (dequeueing it, building its input: work a replay must keep, waiting excluded). Group close, optimizer and publish costs are per group / per step, the
  largest per-lane total (all ranks run them together). The reduction is inside the
  recorded optimizer span, so ``reduce_s`` is 0. Slots = distinct ``rollout/...`` lanes,
  ranks = distinct ``learner/...`` lanes; dispatch order = recorded start order.
- ``synthetic_workload(spec, steps, seed)`` draws per-trajectory rollout durations from a
  distribution rescaled so the slowest trajectory of every batch takes exactly
  ``rollout_makespan_s`` (the number users read off ``timing_s/gen``), and splits the
  learner's measured per-step wall time into a constant barrier (reduction + optimizer +
  publish + group closes) and per-trajectory backward work:
  b = (learner_total_s - barrier) * ranks / (prompts * group_size)          (seconds on one rank)
  so the batch trained alone on balanced ranks takes ``learner_total_s`` again.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from learner.timeline import Kind, LEARNER_KINDS, Metric, ROLLOUT_KINDS

if TYPE_CHECKING:
    from learner.sim.shared_engine import EngineCost

ROLLOUT_DISTS = ("lognormal", "uniform", "constant")
# A trajectory's rollout time in the step that trains it: a draft (``rollout.draft``,
# docs/speculation.md) was sampled during the step before, so it is not; its verification,
# under the trained step's weights and on its critical path, is.
TRAJ_ROLLOUT_KINDS = tuple(k for k in ROLLOUT_KINDS if k != Kind.DRAFT)


class SimInputError(ValueError):
    """Bad simulator input; ``str()`` names the flag or field and the reason, on one line."""


@dataclass(frozen=True)
class Segment:
    """A recorded rollout sub-span, in seconds relative to its trajectory's start."""

    kind: str
    t0: float
    t1: float
    turn: int | None = None
    tokens: int = 0


@dataclass(frozen=True)
class TrajWork:
    traj: int  # id in the source (recorded traj id, or index within the drawn batch)
    group: int  # group id in the source
    rollout_s: float  # slot occupancy: dispatch to reward
    backward_s: float  # learner work on one rank
    segments: tuple[Segment, ...] = ()  # recorded sub-spans (empty: one rollout.generate)


@dataclass
class BatchWork:
    trajs: list[TrajWork]  # in dispatch order
    group_close_s: dict[int, float]  # source group id -> close cost
    optimizer_s: float
    publish_s: float

    @property
    def n_groups(self) -> int:
        return len(self.group_close_s)


@dataclass
class Workload:
    batches: list[BatchWork]
    rollout_slots: int
    learner_ranks: int
    reduce_s: float = 0.0
    inputs: dict[str, Any] = field(default_factory=dict)  # echoed into the JSON report
    # the rollout engines as shared servers (learner/sim/shared_engine.py); None: each rollout
    # takes its own duration whatever else runs
    engine: "EngineCost | None" = None

    def batch(self, step: int) -> BatchWork:
        return self.batches[step % len(self.batches)]


@dataclass(frozen=True)
class SyntheticSpec:
    prompts: int = 32
    group_size: int = 8
    rollout_makespan_s: float = 650.0
    rollout_dist: str = "lognormal"
    rollout_sigma: float = 1.0
    rollout_slots: int | None = None  # None: one slot per trajectory, all start at once
    learner_total_s: float = 646.4
    learner_ranks: int = 8
    backward_sigma: float = 0.0  # lognormal spread of backward work, mean preserved
    optimizer_s: float = 5.0
    publish_s: float = 12.2
    reduce_s: float = 0.86
    group_close_s: float = 0.01

    def barrier_s(self) -> float:
        """Learner time per step that is not backward, on the busiest rank.

        Counts all ``prompts`` group closes on one rank: a group closes on the rank that ran
        its last backward, and with a whole batch in hand that is the same rank for every
        group when the group size is a multiple of the ranks (the conservative case).
        """
        return self.reduce_s + self.optimizer_s + self.publish_s + self.prompts * self.group_close_s

    def backward_s(self) -> float:
        n = self.prompts * self.group_size
        return (self.learner_total_s - self.barrier_s()) * self.learner_ranks / n

    def validate(self) -> None:
        if self.rollout_dist not in ROLLOUT_DISTS:
            raise SimInputError(f"--rollout-dist: expected one of {', '.join(ROLLOUT_DISTS)}, got {self.rollout_dist!r}")
        if self.backward_s() <= 0:
            raise SimInputError(
                f"--learner-total: {self.learner_total_s:g} s leaves no backward work after the fixed "
                f"per-step costs of {self.barrier_s():g} s (--reduce-s + --optimizer-s + --publish-s + group closes)"
            )


# ThunderSyncRL paper (docs/schedules.md, "The simulator"; `--preset paper`): Qwen 27B, 32 prompts x 8
# trajectories, 8xB200.
# Measured: rollout+verify makespan 650.0 s, learner 646.4 s; sync 1,296-1,314 s,
# streaming 687.7 s, async 695.0 s, fully-async 690.0 s, 20.5 s of learner work after the
# last reward. Assumptions that make the simulation reproduce them (the outputs are not
# set anywhere, they come out of the event simulation):
# - optimizer 5.0 s + publish 12.2 s = 17.2 s = 687.7 - 650.0 - 20.5: the per-step cost
#   after the gradient is complete, which streaming cannot hide;
# - reduction 0.86 s + one group close 0.01 s (two fp32 axpys over a rank's gradient shard)
#   + one backward (19.63 s on a rank) = 20.5 s, the tail: the last reward's own backward,
#   its group's close and the all-reduce;
# - lognormal rollout durations, sigma 1.0 (slowest ~16x the median, as multi-turn agents
#   with tools show): most rewards arrive early, so 8 ranks with 32 backward passes each
#   are busy from the first seconds and have drained their queue when the last reward lands;
# - one rollout slot per trajectory: the 256 rollouts of a batch start together.
PAPER_PRESET = SyntheticSpec()
PAPER_REFERENCE = {
    "step_s": {"sync": 1296.0, "streaming": 687.7, "async": 695.0, "fully-async": 690.0},
    "sync_step_range_s": [1296.0, 1314.0],
    "rollout_s": 650.0,
    "learner_s": 646.4,
    "tail_s": 20.5,
}


def _draw_rollouts(spec: SyntheticSpec, rng: random.Random, n: int) -> list[float]:
    if spec.rollout_dist == "constant":
        return [spec.rollout_makespan_s] * n
    if spec.rollout_dist == "uniform":
        draws = [rng.random() for _ in range(n)]
    else:
        draws = [rng.lognormvariate(0.0, spec.rollout_sigma) for _ in range(n)]
    top = max(draws)
    return [spec.rollout_makespan_s * d / top for d in draws]


def synthetic_workload(spec: SyntheticSpec, steps: int, seed: int) -> Workload:
    """One independently drawn batch per step; ``seed`` and ``step`` fix every draw."""
    spec.validate()
    n = spec.prompts * spec.group_size
    b_mean = spec.backward_s()
    batches = []
    for step in range(steps):
        rng = random.Random(seed * 1_000_003 + step)
        rollouts = _draw_rollouts(spec, rng, n)
        # lognormal with mu = -sigma^2/2 has mean 1, so the learner total is kept on average
        s = spec.backward_sigma
        backwards = [b_mean * (rng.lognormvariate(-s * s / 2, s) if s > 0 else 1.0) for _ in range(n)]
        trajs = [TrajWork(i, i // spec.group_size, rollouts[i], backwards[i]) for i in range(n)]
        batches.append(BatchWork(trajs, {g: spec.group_close_s for g in range(spec.prompts)},
                                 spec.optimizer_s, spec.publish_s))
    return Workload(
        batches, spec.rollout_slots or n, spec.learner_ranks, spec.reduce_s,
        inputs={"source": "distributions", **asdict(spec), "backward_per_traj_s": b_mean, "seed": seed},
    )


def with_overrides(spec: SyntheticSpec, **values: Any) -> SyntheticSpec:
    return replace(spec, **{k: v for k, v in values.items() if v is not None})


# ---------------------------------------------------------------- replay of a recording


# the labelled tool-latency model: a modelled wait, the same on a faster or slower machine.
# rollout.tool_wait is that wait; rollout.tool is the tool's real work since the tool calls
# left the agent loop's thread (microseconds for the calculator), and recordings made before
# held the modelled wait in rollout.tool, so both count as modelled.
MODELLED_KINDS = (Kind.TOOL, Kind.TOOL_WAIT)


def _traj_at_speed(t: TrajWork, slower: float) -> TrajWork:
    """``t`` with every recorded duration but the modelled tool waits times ``slower``; the
    gaps between sub-spans (dispatch, IPC) are machine time and scale too."""
    if not t.segments:
        return replace(t, rollout_s=t.rollout_s * slower, backward_s=t.backward_s * slower)
    segments, was, now = [], 0.0, 0.0  # end of the previous sub-span, as recorded and rescaled
    for seg in t.segments:
        t0 = now + (seg.t0 - was) * slower
        now = t0 + (seg.t1 - seg.t0) * (1.0 if seg.kind in MODELLED_KINDS else slower)
        segments.append(replace(seg, t0=t0, t1=now))
        was = seg.t1
    return replace(t, rollout_s=now + (t.rollout_s - was) * slower, backward_s=t.backward_s * slower,
                   segments=tuple(segments))


def at_speed(workload: Workload, slower: float) -> Workload:
    """The workload on a machine ``slower`` times slower at computing (0.8: 25% faster):
    generate, verify, backward, close, optimizer and publish times scale, the modelled tool
    latency does not. The bench uses it to simulate each schedule at the machine speed its
    own runs met (a shared machine's speed drifts between runs)."""
    if not slower > 0:
        raise ValueError(f"slower: must be > 0, got {slower}")
    batches = [BatchWork([_traj_at_speed(t, slower) for t in b.trajs],
                         {g: c * slower for g, c in b.group_close_s.items()},
                         b.optimizer_s * slower, b.publish_s * slower) for b in workload.batches]
    engine = workload.engine.scaled(slower) if workload.engine is not None else None
    return replace(workload, batches=batches, reduce_s=workload.reduce_s * slower, engine=engine)


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """Read a JSONL event file; errors name the flag, the file and the line."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise SimInputError(f"--spans: cannot read {path}: {err.strerror}") from None
    events = []
    for no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as err:
            raise SimInputError(f"--spans: {path} line {no} is not JSON: {err.msg}") from None
        if not isinstance(event, dict):
            raise SimInputError(f"--spans: {path} line {no} is not a JSON object")
        events.append(event)
    return events


def _span_list(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Span dicts from a stream that may also hold run/metrics events (or only bare spans)."""
    spans = []
    for e in events:
        if e.get("type", "span") != "span":
            continue
        for key in ("step", "kind", "t0", "t1", "lane"):
            if key not in e:
                raise SimInputError(f"spans: span seq={e.get('seq')} has no '{key}'")
        if e["t1"] < e["t0"]:
            raise SimInputError(f"spans: span seq={e.get('seq')} ends before it starts")
        spans.append(e)
    return spans


def _max_lane_total(spans: list[dict[str, Any]]) -> float:
    per_lane: dict[str, float] = {}
    for s in spans:
        per_lane[s["lane"]] = per_lane.get(s["lane"], 0.0) + s["t1"] - s["t0"]
    return max(per_lane.values(), default=0.0)


def _learner_overheads(spans: list[dict[str, Any]], reward_at: dict[int, float]) -> dict[int, float]:
    """Per trajectory: learner time just before its first backward that no span covers but
    the learner spent on it (taking it off the queue, building its input): the gap after
    the previous learner span on the lane, counted only from when its reward had arrived,
    so waiting for the rollout is not counted as work."""
    out: dict[int, float] = {}
    lanes: dict[str, list[dict]] = {}
    for s in spans:
        if s["kind"] in LEARNER_KINDS and s["lane"].startswith("learner/"):
            lanes.setdefault(s["lane"], []).append(s)
    for lane_spans in lanes.values():
        lane_spans.sort(key=lambda s: (s["t0"], s["t1"]))
        for prev, s in zip(lane_spans, lane_spans[1:]):
            traj = s.get("traj")
            if s["kind"] != Kind.BACKWARD or traj is None or traj in out:
                continue
            out[traj] = max(0.0, s["t0"] - max(prev["t1"], reward_at.get(traj, prev["t1"])))
    return out


def _recorded_batch(step: int, spans: list[dict[str, Any]]) -> BatchWork:
    rollout: dict[int, list[dict]] = {}
    backward: dict[int, float] = {}
    group_of: dict[int, int] = {}
    closes: dict[int, list[dict]] = {}
    for s in spans:
        if s["kind"] in TRAJ_ROLLOUT_KINDS and s.get("traj") is not None:
            rollout.setdefault(s["traj"], []).append(s)
        elif s["kind"] == Kind.BACKWARD:
            if s.get("traj") is None or s.get("group") is None:
                raise SimInputError(f"spans: learner.backward seq={s.get('seq')} of step {step} has no traj/group")
            backward[s["traj"]] = backward.get(s["traj"], 0.0) + s["t1"] - s["t0"]
            group_of[s["traj"]] = s["group"]
        elif s["kind"] == Kind.GROUP_CLOSE and s.get("group") is not None:
            closes.setdefault(s["group"], []).append(s)
    for traj, parts in rollout.items():
        # a group whose rewards all tie has advantage 0 exactly and no backward (docs/learner.md), but its
        # rollout was generated in this step all the same: the fleet's work, and the reward sync waits for
        if traj not in backward and parts[0].get("group") is not None:
            backward[traj], group_of[traj] = 0.0, parts[0]["group"]
    missing = [t for t in backward if not rollout.get(t)]
    if missing:
        raise SimInputError(f"spans: trajectory {missing[0]} of step {step} has learner.backward but no rollout spans")
    overhead = _learner_overheads(spans, {t: max(p["t1"] for p in parts) for t, parts in rollout.items()})
    trajs = []
    for traj, bw in backward.items():
        parts = rollout[traj]
        bw += overhead.get(traj, 0.0)
        start = min(p["t0"] for p in parts)
        segments = tuple(
            Segment(p["kind"], p["t0"] - start, p["t1"] - start, p.get("turn"), int(p.get("tokens") or 0))
            for p in sorted(parts, key=lambda p: (p["t0"], p["t1"]))
        )
        trajs.append((start, traj, TrajWork(traj, group_of[traj], max(p["t1"] for p in parts) - start, bw, segments)))
    trajs.sort(key=lambda x: (x[0], x[1]))
    groups = dict.fromkeys(t.group for _, _, t in trajs)
    return BatchWork(
        [t for _, _, t in trajs],
        {g: _max_lane_total(closes.get(g, [])) for g in groups},
        _max_lane_total([s for s in spans if s["kind"] == Kind.OPTIMIZER]),
        _max_lane_total([s for s in spans if s["kind"] == Kind.PUBLISH]),
    )


def _measured_steps(events: list[dict[str, Any]], spans: list[dict[str, Any]]) -> dict[int, float]:
    """Recorded step times: the ``timing_s/step`` metric, else publish end to publish end."""
    measured = {
        e["step"]: float(e["values"][Metric.STEP_S])
        for e in events
        if e.get("type") == "metrics" and Metric.STEP_S in e.get("values", {})
    }
    if measured:
        return measured
    ends = {}
    for s in spans:
        if s["kind"] == Kind.PUBLISH:
            ends[s["step"]] = max(ends.get(s["step"], 0.0), s["t1"])
    prev, out = 0.0, {}
    for step in sorted(ends):
        out[step], prev = ends[step] - prev, ends[step]
    return out


def workload_from_spans(events: Iterable[dict[str, Any]]) -> Workload:
    """Replay a recording: events as in docs/architecture.md (or bare span dicts)."""
    events = list(events)
    spans = _span_list(events)
    trained_steps = sorted({s["step"] for s in spans if s["kind"] == Kind.BACKWARD})
    if not trained_steps:
        raise SimInputError("spans: no learner.backward spans, so no trained step to replay")
    # A trajectory belongs to the step that trained it (fully-async records rollout spans
    # before the trajectory is assigned to a batch), so rollout spans are matched by traj id.
    rollout_by_traj: dict[int, list[dict]] = {}
    for s in spans:
        if s["kind"] in TRAJ_ROLLOUT_KINDS and s.get("traj") is not None:
            rollout_by_traj.setdefault(s["traj"], []).append(s)
    batches = []
    for step in trained_steps:
        learner = [s for s in spans if s["step"] == step and s["kind"] in LEARNER_KINDS]
        trajs = {s["traj"] for s in learner if s["kind"] == Kind.BACKWARD}
        # and the step's untrained rollouts (a tied group's: no backward), where the recording says
        # which step sampled them (fully-async's rollout spans do not: step -1)
        trajs |= {s["traj"] for s in spans if s["step"] == step and s["kind"] in TRAJ_ROLLOUT_KINDS
                  and s.get("traj") is not None and s.get("group") is not None}
        batches.append(_recorded_batch(step, learner + [r for t in trajs for r in rollout_by_traj.get(t, [])]))
    slots = {s["lane"] for s in spans if s["kind"] in ROLLOUT_KINDS and s["lane"].startswith("rollout/")}
    ranks = {s["lane"] for s in spans if s["kind"] in LEARNER_KINDS and s["lane"].startswith("learner/")}
    if not slots:
        raise SimInputError("spans: no rollout/... lanes, cannot tell how many rollout slots ran")
    measured = _measured_steps(events, spans)
    schedule = next(
        (e.get("config", {}).get("train", {}).get("schedule") for e in events
         if e.get("type") == "run" and e.get("status") == "started"),
        None,
    )
    return Workload(
        batches, len(slots), max(len(ranks), 1), 0.0,
        inputs={
            "source": "spans",
            "steps_recorded": trained_steps,
            "prompts_per_step": [b.n_groups for b in batches],
            "trajectories_per_step": [len(b.trajs) for b in batches],
            "rollout_slots": len(slots),
            "rollout_workers": len({lane.split("/")[1] for lane in slots}),
            "learner_ranks": max(len(ranks), 1),
            "rollout_duration": "envelope: first t0 to last t1 of the trajectory's rollout spans",
            "recorded_schedule": schedule,
            "measured_step_s": {str(k): v for k, v in sorted(measured.items())},
        },
    )
