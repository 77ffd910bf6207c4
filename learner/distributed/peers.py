"""Rank 0's handle on ranks 1..W−1 (``DataParallelLearner``'s processes): spawning them, the
command queues down, the reports up (phases, step results, errors), and stopping them with
every wait bounded (docs/distributed.md)."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import queue
import time
from collections.abc import Callable

from learner.config import RunConfig
from learner.distributed.barrier import DistributedBatchError
from learner.distributed.ranks import stop_processes
from learner.distributed.worker import rank_main

RankPhase = Callable[[int, str, float, float, "int | None", "int | None"], None]


class RankPeers:
    """Ranks 1..W−1 as spawned processes; ``stats`` collects each rank's result of the step."""

    def __init__(self, cfg: RunConfig, policy_dir: str, init_method: str, on_rank_phase: RankPhase):
        self.world, self.timeout_s = cfg.learner.world_size, cfg.learner.timeout_s
        self.on_rank_phase = on_rank_phase
        self.stats: dict[int, dict] = {}
        ctx = multiprocessing.get_context("spawn")
        self.up_q = ctx.Queue()
        self.cmd_qs = [ctx.Queue() for _ in range(1, self.world)]
        self.procs = [ctx.Process(target=rank_main, name=f"thundersync-learner-rank-{r}", daemon=True,
                                  args=(cfg.model_dump(), policy_dir, r, self.world, init_method, self.cmd_qs[r - 1],
                                        self.up_q)) for r in range(1, self.world)]
        for p in self.procs:
            p.start()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def send(self, rank: int, msg: tuple) -> None:
        self.cmd_qs[rank - 1].put(msg)

    def broadcast(self, msg: tuple) -> None:
        for q in self.cmd_qs:
            q.put(msg)

    def drain(self) -> None:
        """Pass on every phase the other ranks reported so far."""
        while True:
            try:
                msg = self.up_q.get_nowait()
            except queue.Empty:
                return
            self._handle(msg)

    def wait_for_steps(self) -> None:
        """Until every rank reported its step, within ``learner.timeout_s``."""
        deadline = time.monotonic() + self.timeout_s
        while len(self.stats) < self.world:
            self._next_up(deadline)

    def _next_up(self, deadline: float) -> None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"learner ranks {sorted(set(range(self.world)) - set(self.stats))} did "
                                   f"not finish their step within learner.timeout_s = {self.timeout_s:g} s")
            try:
                msg = self.up_q.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                self.check_alive()
                continue
            self._handle(msg)
            return

    def _handle(self, msg) -> None:
        if msg[0] == "phase":
            self.on_rank_phase(*msg[1:])
        elif msg[0] == "stepped":
            self.stats[msg[1]] = msg[2]
        elif msg[0] == "error":
            raise RuntimeError(f"learner rank {msg[1]} failed: {msg[2]}")

    @contextlib.contextmanager
    def naming_failed_peers(self):
        """A collective that failed because a peer died or failed: say which rank and why."""
        try:
            yield
        except DistributedBatchError:
            raise  # every rank raised it together: its message already names the ranks
        except Exception as exc:
            # a dead peer's exit is seen a moment after its socket closed: wait for it, bounded
            multiprocessing.connection.wait([p.sentinel for p in self.procs], timeout=2.0)
            self.drain()
            self.check_alive()
            raise exc

    def check_alive(self) -> None:
        for r, p in enumerate(self.procs, start=1):
            if p.exitcode is not None and p.exitcode != 0:
                raise RuntimeError(f"learner rank {r} exited with code {p.exitcode}")

    def close(self) -> None:
        """Stop every rank: ask, wait, then terminate and kill whichever is left."""
        for q in self.cmd_qs:
            try:
                q.put(("stop",))
            except (ValueError, OSError):
                pass
        stop_processes(self.procs, min(self.timeout_s, 30.0))
        for q in [self.up_q, *self.cmd_qs]:
            q.cancel_join_thread()
            q.close()
