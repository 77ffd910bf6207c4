"""Rollout workers on every node of a run that spans nodes (docs/distributed-nodes.md, "Rollouts on
every node").

With ``learner.nodes`` and ``rollout.on_every_node`` each node other than the first runs its own
``rollout.workers`` (or vLLM replicas), hosted by the node's first learner rank (the
``thundersync join-rank`` process): a ``Fleet`` over this node's workers, exactly as rank 0's,
with its own weight store. After every optimizer step the host publishes **its own** parameters
into that store: every rank's weights are bit-identical after the step (checked by digest each
step), so no weights cross the network. Rank 0's ``PlacedFleet`` sends each group to the node of
the rank that will learn it; what the workers send (spans, finished trajectories, scored turns,
weight-load acks) goes up the control connection to rank 0, which records it and forwards each
item to its owner rank as for its own workers.

Control messages (on the rank's control connection, ``learner.distributed.remote``):
down ``("fleet", "start", origin, version)``, ``("fleet", "begin_step", step)``,
``("fleet", "dispatch", step, items)``, ``("fleet", "load", version)`` to the fleet thread here, and
``("publish", version)`` to the rank's own loop (it touches the model between
steps); up ``("fleet-ready",)``, ``("fleet-msg", message)``, ``("fleet-acks", version, acks)``,
``("fleet-error", text)``.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from multiprocessing import connection

from learner.config import RunConfig
from learner.registries.objectives import objective as objective_of

FLEET_UP = ("fleet-ready", "fleet-msg", "fleet-acks", "fleet-error")
WAIT_SLICE_S = 0.5  # the longest the fleet thread blocks before it looks at its stop flag


def rollout_hosts(cfg: RunConfig) -> dict[str, int]:
    """``{node: the rank that hosts its rollout workers}`` for every node but the first (rank 0's
    fleet is the driver's own); empty when the run is on one node or ``rollout.on_every_node`` is off."""
    lrn = cfg.learner
    if not lrn.nodes or not cfg.rollout.on_every_node:
        return {}
    per_node = lrn.world_size // len(lrn.nodes)
    return {node: i * per_node for i, node in enumerate(lrn.nodes) if i > 0}


class WakeQueue:
    """A thread-safe queue that ``multiprocessing.connection.wait`` can wait on (a pipe carries
    one byte per message), so one wait covers worker pipes and messages from another thread."""

    def __init__(self):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)

    def fileno(self) -> int:
        return self._r

    def put(self, msg) -> None:
        self._q.put(msg)
        try:
            os.write(self._w, b"\0")
        except OSError:
            pass  # closed: nobody waits any more

    def take_all(self) -> list:
        try:
            while os.read(self._r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        out = []
        while True:
            try:
                out.append(self._q.get_nowait())
            except queue.Empty:
                return out

    def empty(self) -> bool:
        return self._q.empty()

    def close(self) -> None:
        for fd in (self._r, self._w):
            try:
                os.close(fd)
            except OSError:
                pass


class NodeRollouts:
    """This node's rollout fleet, run by a thread of its first rank's process. Its workers are
    spawned at once (they import torch while the rank loads its model); ``attach`` gives it the
    rank's model once built, ``("fleet", "start", ...)`` from rank 0 its run clock and version."""

    def __init__(self, cfg: RunConfig, node: str, policy_dir: str, send_up: Callable[[tuple], None]):
        from learner.rollout.processes.boot import boot_fleet, workers_per_node

        self.cfg, self.node, self.policy_dir, self.send_up = cfg, node, policy_dir, send_up
        self.commands = WakeQueue()
        self.booted = boot_fleet(cfg, first_wid=cfg.learner.nodes.index(node) * workers_per_node(cfg))
        self.model = None
        self.store = None
        self.fleet = None
        self._model_ready, self._stop = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"rollouts-{node}", daemon=True)
        self._thread.start()

    def attach(self, model) -> None:
        """The rank's model (its weights are what this node's workers sample with)."""
        self.model = model
        self._model_ready.set()

    def publish(self, version: int) -> None:
        """Called by the rank's loop between steps: its parameters as ``version``; the workers'
        loads wait for it (``WeightStore.read_into``)."""
        from learner.lora import publish_view

        if self.store is None:
            raise RuntimeError(f"node {self.node}: a publish before rank 0 started this node's rollouts")
        self.store.publish(publish_view(self.model), version)

    # -- the fleet thread -------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._start()
            self.send_up(("fleet-ready",))
            while not self._stop.is_set():
                connection.wait([self.commands, *self.fleet.booted.conns], WAIT_SLICE_S)
                for cmd in self.commands.take_all():
                    self._command(cmd)
                while (msg := self.fleet.poll()) is not None:
                    self.send_up(("fleet-msg", msg))
        except BaseException as exc:  # rank 0 fails the run naming this node
            if not self._stop.is_set():
                self.send_up(("fleet-error", f"{type(exc).__name__}: {exc}".splitlines()[0]))

    def _start(self) -> None:
        from learner.lora import publish_view
        from learner.rollout.processes.fleet import READY_TIMEOUT_S, Fleet
        from learner.models.loading import resolve_model_dir
        from learner.rollout.processes.weights import WeightStore

        deadline = time.monotonic() + READY_TIMEOUT_S
        cmd = None
        while cmd is None:
            if self._stop.is_set():
                raise RuntimeError("stopped before the rollouts started")
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 did not start node {self.node}'s rollouts within {READY_TIMEOUT_S:g} s")
            connection.wait([self.commands], WAIT_SLICE_S)
            cmd = next((c for c in self.commands.take_all() if c[0] == "start"), None)
        _, origin, version = cmd
        if not self._model_ready.wait(max(deadline - time.monotonic(), 0.0)) or self.model is None:
            raise TimeoutError(f"node {self.node}: the rank's model was not built within {READY_TIMEOUT_S:g} s")
        cfg = self.cfg
        teacher = (str(resolve_model_dir(cfg.model.teacher, cfg.model.cache_dir, cfg.model.builtin_seed))
                   if objective_of(cfg.algorithm.objective).teacher_scored else None)
        self.store = WeightStore(publish_view(self.model), counters=self.booted.counters)
        if version:
            self.store.publish(publish_view(self.model), version)  # a resumed run: the rank holds its weights
        self.fleet = Fleet(cfg, self.policy_dir, teacher, self.store, origin, self.booted)

    def _command(self, cmd: tuple) -> None:
        from learner.rollout.processes.messages import Finished, Spans

        if cmd[0] == "stop":
            return  # close() set the flag already
        if cmd[0] == "begin_step":
            self.fleet.begin_step(cmd[1])
        elif cmd[0] == "dispatch":
            self.fleet.dispatch(cmd[1], cmd[2])
        elif cmd[0] == "load":
            def passed_on(item, spans) -> None:  # what arrives while the replicas load goes up in order
                self.send_up(("fleet-msg", Spans(spans) if item is None else Finished(item, spans)))

            self.send_up(("fleet-acks", cmd[1], self.fleet.load_all(cmd[1], on_other=passed_on)))
        else:
            raise RuntimeError(f"node {self.node}: unknown rollout command {cmd[0]!r}")

    def close(self) -> None:
        """Stop the thread, then the workers (``Fleet.close``, or the booted ones if none started)."""
        self._stop.set()
        self._model_ready.set()  # a thread still waiting for the model: it finds the stop flag
        self.commands.put(("stop",))
        self._thread.join(timeout=10.0)
        if self.fleet is not None:
            self.fleet.close()
        else:
            self.booted.close()
        self.commands.close()
