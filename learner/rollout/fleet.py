"""The rollout fleet as the driver sees it: worker processes, their queues, weight acks."""

from __future__ import annotations

import queue

import torch.multiprocessing  # noqa: F401  (registers the shared-memory pickling of tensors)

from learner import stopping
from learner.config import RunConfig
from learner.rollout.boot import BootedWorkers, stop_workers
from learner.rollout.messages import Ack, Failed, Finished, Init, Load, Ready, Spans, Work, WorkItem
from learner.rollout.weights import WeightStore
from learner.timeline import Span
from learner.trajectory import ScoredTurn, Trajectory


class RolloutError(RuntimeError):
    """A rollout worker failed; the message carries its error text."""


def decode(msg) -> tuple[Trajectory | ScoredTurn | None, list[Span]]:
    """A data message as (finished trajectory or scored turn, or None; the spans it carries)."""
    if isinstance(msg, Spans):
        return None, msg.spans
    if isinstance(msg, Finished):
        return msg.item, msg.spans
    raise RuntimeError(f"unexpected rollout message {msg!r}")


class Fleet:
    """Takes over the workers ``booted`` (``learner.rollout.boot``): sends each its init
    command and waits until every one is ready."""

    def __init__(self, cfg: RunConfig, policy_dir: str, teacher_dir: str | None, store: WeightStore,
                 origin: float, booted: BootedWorkers):
        booted.taken = True
        self.out_q, self.cmd_qs, self.procs = booted.out_q, booted.cmd_qs, booted.procs
        self.load = [0] * len(self.procs)  # trajectories in flight per worker (least-loaded dispatch)
        self._owner: dict[int, int] = {}  # traj -> worker
        self.receive_timeout_s = cfg.rollout.receive_timeout_s
        cfg_json = cfg.model_dump_json()
        for q in self.cmd_qs:
            q.put(Init(cfg_json, policy_dir, teacher_dir, store.tensors, origin))
        self._early: list = []
        waiting = set(range(len(self.procs)))
        while waiting:
            msg = self._get_raw(timeout=600)
            if isinstance(msg, Ready):
                waiting.discard(msg.worker)
            else:
                self._early.append(msg)

    def _get_raw(self, timeout: float | None, interruptible: bool = True):
        """The next message; every wait has a limit (default ``rollout.receive_timeout_s``):
        a fleet silent that long (a hung tool past its own timeout, a stuck engine) fails the run."""
        limit = self.receive_timeout_s if timeout is None else timeout
        timeout = limit
        while True:
            if interruptible:
                stopping.check()  # a safe point: SIGTERM/SIGINT stop the run here (learner/stopping.py)
            try:
                msg = self.out_q.get(timeout=min(timeout, 1.0))
            except queue.Empty:
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead:
                    raise RolloutError(f"rollout worker(s) {', '.join(dead)} died")
                timeout -= 1.0
                if timeout <= 0:
                    raise TimeoutError(f"no message from the rollout fleet for {limit:g}s (rollout.receive_timeout_s)")
                continue
            if isinstance(msg, Failed):
                raise RolloutError(f"rollout worker {msg.worker}: {msg.error}")
            return msg

    def get(self, timeout: float | None = None, interruptible: bool = True):
        if self._early:
            return self._early.pop(0)
        msg = self._get_raw(timeout, interruptible)
        self._returned(msg)
        return msg

    def _returned(self, msg) -> None:
        """A finished trajectory frees its place on its worker (least-loaded dispatch)."""
        if isinstance(msg, Finished) and isinstance(msg.item, Trajectory):
            self.load[self._owner.pop(msg.item.id)] -= 1

    def has_message(self) -> bool:
        """A message is waiting (never blocks, consumes nothing)."""
        return bool(self._early) or not self.out_q.empty()

    def poll(self):
        """A message already waiting, or None (never blocks)."""
        if self._early:
            return self._early.pop(0)
        try:
            msg = self.out_q.get_nowait()
        except queue.Empty:
            return None
        if isinstance(msg, Failed):
            raise RolloutError(f"rollout worker {msg.worker}: {msg.error}")
        self._returned(msg)
        return msg

    def poll_data(self) -> tuple[Trajectory | ScoredTurn | None, list[Span]] | None:
        """The next data message already waiting, decoded, or None (never blocks)."""
        msg = self.poll()
        return None if msg is None else decode(msg)

    def get_data(self, timeout: float | None = None) -> tuple[Trajectory | ScoredTurn | None, list[Span]]:
        """The next data message, decoded (blocks up to ``timeout``)."""
        return decode(self.get(timeout))

    def dispatch(self, step: int, items: list[WorkItem]) -> None:
        """Spread the items over the workers, least-loaded first."""
        per_worker: dict[int, list[WorkItem]] = {}
        for item in items:
            w = min(range(len(self.load)), key=lambda i: self.load[i])
            self.load[w] += 1
            self._owner[item.traj] = w
            per_worker.setdefault(w, []).append(item)
        for w, chunk in per_worker.items():
            self.cmd_qs[w].put(Work(step, chunk))

    def load_all(self, version: int, on_other) -> list[tuple[int, float, float]]:
        """Every replica loads ``version``; returns (worker, t0, t1) per ack. Data messages
        that arrive meanwhile go, decoded, to ``on_other(item, spans)``."""
        for q in self.cmd_qs:
            q.put(Load(version))
        acks = []
        while len(acks) < len(self.cmd_qs):
            msg = self.get(interruptible=False)  # the optimizer has stepped: finish the publish first
            if isinstance(msg, Ack):
                if msg.version != version:
                    raise RolloutError(f"replica {msg.worker} acknowledged version {msg.version}, expected {version}")
                acks.append((msg.worker, msg.t0, msg.t1))
            else:
                on_other(*decode(msg))
        return acks

    def close(self) -> None:
        stop_workers(self.cmd_qs, self.procs, grace_s=10.0)
