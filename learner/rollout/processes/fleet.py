"""The rollout fleet as the driver sees it: worker processes, one pipe from each, weight
acks, and workers that die (docs/processes.md, "A rollout worker dies")."""

from __future__ import annotations

import signal
import sys
import time
from collections import deque
from multiprocessing import connection

import torch.multiprocessing  # noqa: F401  (registers the shared-memory pickling of tensors)

from learner import stopping
from learner.config import RunConfig
from learner.rollout.processes.boot import BootedWorkers, stop_workers
from learner.rollout.processes.in_flight import InFlight
from learner.rollout.processes.messages import Ack, Draft, Failed, Finished, Init, Load, Ready, Spans, Work, WorkItem
from learner.rollout.processes.weights import WeightStore
from learner.timeline import Span
from learner.trajectory import ScoredTurn, Trajectory

POLL_S = 1.0  # the longest a receive blocks before it looks at the stop request and dead workers
READY_TIMEOUT_S = 600.0


class RolloutError(RuntimeError):
    """A rollout worker failed; the message carries its error text."""


def decode(msg) -> tuple[Trajectory | ScoredTurn | None, list[Span]]:
    """A data message as (finished trajectory or scored turn, or None; the spans it carries)."""
    if isinstance(msg, Spans):
        return None, msg.spans
    if isinstance(msg, Finished):
        return msg.item, msg.spans
    raise RuntimeError(f"unexpected rollout message {msg!r}")


def how_it_ended(exitcode: int | None) -> str:
    if exitcode is None:
        return "stopped answering"
    if exitcode < 0:
        return f"was killed by {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


def complete_messages(conn) -> list:
    """What a dead worker's pipe still holds, but a message cut off by the kill: its writing
    end is closed, so this ends and never blocks."""
    messages = []
    try:
        while conn.poll():
            messages.append(conn.recv())
    except (EOFError, OSError):
        pass
    return messages


class Fleet:
    """Takes over the workers ``booted`` (``learner.rollout.processes.boot``): sends each its init
    command and waits until every one is ready. Every receive has a limit
    (``rollout.receive_timeout_s``); a worker that dies is respawned in its place and the
    trajectories it had in flight are sampled again with their seeds, up to
    ``rollout.max_worker_restarts`` times per step (``begin_step``)."""

    def __init__(self, cfg: RunConfig, policy_dir: str, teacher_dir: str | None, store: WeightStore,
                 origin: float, booted: BootedWorkers):
        booted.taken = True
        self.booted = booted
        self.init = Init(cfg.model_dump_json(), policy_dir, teacher_dir, store.tensors, origin)
        self.receive_timeout_s = cfg.rollout.receive_timeout_s
        self.max_restarts = cfg.rollout.max_worker_restarts
        self.in_flight = InFlight(len(booted.procs))  # what a worker would lose if it died now
        self._inbox: deque = deque()
        self._ready: set[int] = set()
        self._acks: dict[int, tuple[int, float, float]] | None = None  # during load_all: worker -> ack
        self._loading = 0
        self.step, self.restarts = -1, 0  # worker failures in the current step
        for q in booted.cmd_qs:
            q.put(self.init)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while len(self._ready) < len(booted.procs):
            stopping.check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"rollout workers not ready within {READY_TIMEOUT_S:g}s")
            self._pull(POLL_S)

    def begin_step(self, step: int) -> None:
        self.step, self.restarts = step, 0

    # -- receiving -------------------------------------------------------------------
    def _pull(self, timeout: float) -> None:
        """Read one message from each worker that sent one within ``timeout`` into the inbox;
        a pipe that ended means its worker died. Nothing arrived: look for dead workers."""
        ready = connection.wait(self.booted.conns, timeout)
        for conn in ready:
            if conn not in self.booted.conns:
                continue  # respawned meanwhile (its worker died while this batch was read)
            w = self.booted.conns.index(conn)
            try:
                self._accept(w, conn.recv())
            except (EOFError, OSError):
                self._lost(w)
        if not ready:
            for w, proc in enumerate(self.booted.procs):
                if not proc.is_alive():
                    self._lost(w)

    def _accept(self, w: int, msg) -> None:
        if isinstance(msg, Failed):  # an error in the worker's code: sampling again would repeat it
            raise RolloutError(f"rollout worker {msg.worker}: {msg.error}")
        if isinstance(msg, Ready):
            self._ready.add(w)
            return
        if isinstance(msg, Ack) and self._acks is None:
            return  # a respawned replica's, of a publish that did not wait for it (load_all)
        self._inbox.append(self.in_flight.arrived(msg))

    def _lost(self, w: int) -> None:
        """Worker ``w`` died: keep every message it sent completely, then respawn it and
        dispatch its trajectories in flight again (same ids, seeds, dispatch batch), or fail
        the run past ``rollout.max_worker_restarts`` failures in this step."""
        proc = self.booted.procs[w]
        for msg in complete_messages(self.booted.conns[w]):
            self._accept(w, msg)
        proc.join(timeout=10)
        how = how_it_ended(proc.exitcode)
        self.restarts += 1
        if self.restarts > self.max_restarts:
            raise RolloutError(f"rollout worker {proc.name} {how}: {self.restarts} worker failure(s) in step "
                               f"{self.step}, more than rollout.max_worker_restarts ({self.max_restarts})")
        self.booted.respawn(w)
        self._ready.discard(w)
        self.booted.cmd_qs[w].put(self.init)
        if self._acks is not None and w not in self._acks:
            self.booted.cmd_qs[w].put(Load(self._loading))  # a publish waits for this replica's acknowledgement
        # sampled again at once by the workers that are up (a row samples the same tokens in
        # any batch: learner/rollout/engine/torch_engine.py), else by the new one once it has booted
        lost, others = self.in_flight.take(w), sorted(self._ready)
        for batch, items in lost.items():
            self.dispatch(batch, items, among=others or [w])
        print(f"thundersync: rollout worker {proc.name} {how} in step {self.step}; respawned, "
              f"{sum(map(len, lost.values()))} trajectories sampled again with their seeds "
              f"(failure {self.restarts} of at most {self.max_restarts} per step)", file=sys.stderr, flush=True)

    def get(self, timeout: float | None = None, interruptible: bool = True):
        """The next message; every wait has a limit (default ``rollout.receive_timeout_s``):
        a fleet silent that long (a hung tool past its own timeout, a stuck engine) fails the run."""
        limit = self.receive_timeout_s if timeout is None else timeout
        deadline = time.monotonic() + limit
        while not self._inbox:
            if interruptible:
                stopping.check()  # a safe point: SIGTERM/SIGINT stop the run here (learner/stopping.py)
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no message from the rollout fleet for {limit:g}s (rollout.receive_timeout_s)")
            self._pull(min(left, POLL_S))
        return self._inbox.popleft()

    def has_message(self) -> bool:
        """A message is waiting (never blocks, consumes nothing)."""
        return bool(self._inbox) or bool(connection.wait(self.booted.conns, 0))

    def poll(self):
        """A message already waiting, or None (never blocks)."""
        if not self._inbox:
            self._pull(0)
        return self._inbox.popleft() if self._inbox else None

    # -- sending ---------------------------------------------------------------------
    def dispatch(self, step: int, items: list[WorkItem], among: list[int] | None = None) -> None:
        """Spread the items over the workers, least-loaded first: ``among`` these, by default
        those that are up (a respawned one still booting only when none is)."""
        for w, chunk in self.in_flight.assign(step, items, among or sorted(self._ready)).items():
            self.booted.cmd_qs[w].put(Work(step, chunk))

    def draft(self, step: int, items: list[WorkItem]) -> None:
        """Later batch ``step``'s items to the workers that are up, as drafts (docs/speculation.md)."""
        for w, chunk in self.in_flight.spread_drafts(items, sorted(self._ready)).items():
            self.booted.cmd_qs[w].put(Draft(step, chunk))

    def load_all(self, version: int, on_other) -> list[tuple[int, float, float]]:
        """Every replica loads ``version``; returns (worker, t0, t1) per ack. Data messages
        that arrive meanwhile go, decoded, to ``on_other(item, spans)``. A respawned replica
        still booting gets the command too (before any later work on its queue) but the
        publish does not wait the seconds it takes to boot; its ack is dropped."""
        self._acks, self._loading = {}, version
        for q in self.booted.cmd_qs:
            q.put(Load(version))
        try:
            while not self._ready <= self._acks.keys():
                msg = self.get(interruptible=False)  # the optimizer has stepped: finish the publish first
                if isinstance(msg, Ack) and msg.version > version:
                    raise RolloutError(f"replica {msg.worker} acknowledged version {msg.version}, expected {version}")
                if isinstance(msg, Ack) and msg.version == version:
                    self._acks[msg.worker - self.booted.first_wid] = (msg.worker, msg.t0, msg.t1)
                elif not isinstance(msg, Ack):  # (an older version: a replica that was booting then)
                    on_other(*decode(msg))
            return list(self._acks.values())
        finally:
            self._acks = None

    def close(self) -> None:
        stop_workers(self.booted.cmd_qs, self.booted.procs, grace_s=10.0)
        for conn in self.booted.conns:
            conn.close()
