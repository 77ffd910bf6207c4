"""Every trajectory readable: after its step, one ``{"type": "trajectory"}`` event per trajectory
with its decoded text (prompt, each turn, each observation the tools returned), reward, advantage,
group and how it was sampled (docs/spans.md, "Trajectory records").

Decoding runs on one background thread, after the step's metrics: the learner never waits for it
(the sink's ``emit`` is thread-safe). Texts are bounded: a segment keeps at most
``SEGMENT_CHARS`` characters and a trajectory ``TRAJECTORY_CHARS``, the cut marked in the text."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from learner.config import AlgorithmConfig
from learner.grad.learners.common import batch_advantages
from learner.timeline import EventSink
from learner.trajectory import Trajectory
from learner.registries.objectives import objective as objective_of

log = logging.getLogger(__name__)

SEGMENT_CHARS = 4000  # a prompt, turn or observation longer than this keeps its head and tail
TRAJECTORY_CHARS = 16000  # past this, later segments keep only the marker
CLOSE_TIMEOUT_S = 30.0


def bounded(text: str, cap: int) -> tuple[str, bool]:
    """``text`` cut to about ``cap`` characters: its head and tail around a marker naming the cut."""
    if len(text) <= cap:
        return text, False
    head, tail = cap * 3 // 4, cap // 4
    return f"{text[:head]}\n… [{len(text) - head - tail} characters cut] …\n{text[len(text) - tail:]}", True


def segments(traj: Trajectory, decode) -> list[dict[str, Any]]:
    """The trajectory's text in order: the prompt, then each generated turn and the observation
    after it (a turn followed by an observation made a tool call; the observation is its result)."""
    ids, spans = traj.input_ids, traj.turn_spans
    parts: list[tuple[str, int | None, int, int, bool]] = []  # (role, turn, start, end, observed after)
    first = spans[0][0] if spans else len(ids)
    parts.append(("prompt", None, 0, first, False))
    for k, (start, end) in enumerate(spans):
        nxt = spans[k + 1][0] if k + 1 < len(spans) else len(ids)
        parts.append(("turn", k, start, end, nxt > end))
        if nxt > end:
            parts.append(("observation", k, end, nxt, False))
    out, used = [], 0
    for role, turn, start, end, observed in parts:
        if start >= end:
            continue
        text, cut = bounded(decode(ids[start:end]), min(SEGMENT_CHARS, max(TRAJECTORY_CHARS - used, 0)))
        used += len(text)
        seg = {"role": role, "text": text, "tokens": end - start, "cut": cut}
        if turn is not None:
            seg["turn"] = turn
            if role == "turn":
                seg["version"] = traj.turn_versions[turn] if turn < len(traj.turn_versions) else None
                seg["tool_call"] = observed
                if turn < len(traj.drafted_versions) and traj.drafted_versions[turn] >= 0:
                    seg["drafted_by"] = traj.drafted_versions[turn]
        out.append(seg)
    return out


def trajectory_events(step: int, trajs: Sequence[Trajectory], tokenizer, algo: AlgorithmConfig) -> list[dict]:
    """The step's trajectory events (``advantage``: GRPO's A_i over the step's groups; None for OPD)."""
    adv = batch_advantages(trajs, algo.advantage) if objective_of(algo.objective).group_advantage and trajs else {}
    no_aux = algo.kl_coef == 0 and algo.entropy_coef == 0

    def decode(ids):
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    events = []
    for t in trajs:
        a = adv.get(t.id)
        events.append({
            "type": "trajectory", "step": step, "traj": t.id, "group": t.group, "reward": float(t.reward),
            "advantage": a, "zero_gradient": a == 0.0 and no_aux, "turns": len(t.turn_spans),
            "tokens": t.n_scored, "versions": list(t.turn_versions),
            "drafted": any(v >= 0 for v in t.drafted_versions), "error": t.error,
            "segments": segments(t, decode),
        })
    return events


class TrajectoryRecords:
    """Decodes each step's trajectories on one background thread and emits their events."""

    def __init__(self, sink: EventSink, tokenizer, algo: AlgorithmConfig):
        self.sink, self.tokenizer, self.algo = sink, tokenizer, algo
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="trajectory-text")
        self._pending: list[Future] = []

    def submit(self, step: int, trajs: Sequence[Trajectory]) -> None:
        self._pending = [f for f in self._pending if not f.done()]
        self._pending.append(self._pool.submit(self._emit, step, list(trajs)))

    def _emit(self, step: int, trajs: list[Trajectory]) -> None:
        try:
            for event in trajectory_events(step, trajs, self.tokenizer, self.algo):
                self.sink.emit(event)
        except Exception:  # the run's training does not depend on its texts
            log.exception("step %s: the trajectories' text could not be recorded", step)

    def close(self, wait_for_them: bool = True) -> None:
        """Emit what is still being decoded (at most ``CLOSE_TIMEOUT_S``), or drop it (a failed run)."""
        if wait_for_them:
            wait(self._pending, timeout=CLOSE_TIMEOUT_S)
        self._pool.shutdown(wait=False, cancel_futures=True)
