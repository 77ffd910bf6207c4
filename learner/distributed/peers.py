"""Rank 0's handle on ranks 1..W−1 (``DataParallelLearner``'s processes): spawning this node's,
waiting for other nodes' to join (``learner.nodes``, ``learner.distributed.remote``), the
command queues down, the reports up (phases, step results, errors), and stopping them with
every wait bounded (docs/distributed.md)."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import queue
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Listener

from learner.config import RunConfig
from learner.distributed.barrier_vote import DistributedBatchError
from learner.distributed.node_rollouts import rollout_hosts
from learner.distributed.ranks import free_port, stop_processes
from learner.distributed.remote import ADDR_ENV, KEY_ENV, PORT_ENV, RemoteRank, accept_ranks, run_key
from learner.distributed.rank_worker import rank_main

RankPhase = Callable[[int, str, float, float, "int | None", "int | None"], None]


class RankPeers:
    """Ranks 1..W−1: this node's as spawned processes, other nodes' as ``RemoteRank``s that joined
    rank 0's control port; ``init_method`` is the rendezvous (a TCP store held by rank 0, at this
    node's address); ``stats`` collects each rank's result of the step."""

    def __init__(self, cfg: RunConfig, policy_dir: str, on_rank_phase: RankPhase):
        lrn = cfg.learner
        self.cfg, self.world, self.timeout_s = cfg, lrn.world_size, lrn.timeout_s
        self.on_rank_phase = on_rank_phase
        self.stats: dict[int, dict] = {}
        self.ledgers: dict[int, tuple[int, dict]] = {}  # rank: (batch, its trajectories' log-probs)
        here = lrn.node_of(0)
        remote = {r: lrn.node_of(r) for r in range(1, self.world) if lrn.node_of(r) != here}
        addr = os.environ.get(ADDR_ENV, "127.0.0.1") if remote else "127.0.0.1"
        self.init_method = f"tcp://{addr}:{free_port(addr)}"
        ctx = multiprocessing.get_context("spawn")
        self.up_q = ctx.Queue()
        peers: dict[int, object] = {r: ctx.Queue() for r in range(1, self.world) if r not in remote}
        self.procs = [ctx.Process(target=rank_main, name=f"thundersync-learner-rank-{r}", daemon=True,
                                  args=(cfg.model_dump(), policy_dir, r, self.world, self.init_method, q, self.up_q))
                      for r, q in peers.items()]
        self.ranks = list(peers)  # the rank of each of this node's processes
        self.cmd_qs: list = []
        for p in self.procs:
            p.start()
        if remote:
            try:
                peers.update(self._join(cfg, addr, remote))
            except BaseException:
                self.cmd_qs = list(peers.values())  # close() stops what started
                self.close()
                raise
        self.cmd_qs = [peers[r] for r in range(1, self.world)]  # a queue, or a RemoteRank (another node)

    def _join(self, cfg: RunConfig, addr: str, remote: dict[int, str]) -> dict[int, RemoteRank]:
        """Wait for the other nodes' ranks on the control port (``learner.timeout_s`` at most)."""
        key, port = run_key(), int(os.environ.get(PORT_ENV) or 0)
        with Listener((addr, port), authkey=key) as listener:
            if KEY_ENV not in os.environ:  # no controller placed the ranks: say how to start them
                host, port = listener.address
                for r, node in remote.items():
                    print(f"thundersync: waiting for rank {r} on node {node}: {KEY_ENV}={key.hex()} thundersync "
                          f"join-rank --control {host}:{port} --rank {r} --node {node}", file=sys.stderr)
            return accept_ranks(listener, remote, (cfg.model_dump(), self.world, self.init_method), self.up_q,
                                self.timeout_s)

    def rollout_hosts(self) -> dict[str, RemoteRank]:
        """{node: the connection to the rank that runs that node's rollout workers} (``node_rollouts``)."""
        return {node: self.cmd_qs[rank - 1] for node, rank in rollout_hosts(self.cfg).items()}

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

    def _next_up(self, deadline: float, what=None) -> None:  # what(): who is late, at the deadline
        while True:
            if (remaining := deadline - time.monotonic()) <= 0:
                late = what() if what else f"learner ranks {sorted(set(range(self.world)) - set(self.stats))}"
                raise TimeoutError(f"{late} did not finish their step within learner.timeout_s = {self.timeout_s:g} s")
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
        elif msg[0] == "logprobs":  # ("logprobs", rank, batch, {traj: array | None})
            self.ledgers[msg[1]] = (msg[2], msg[3])
        elif msg[0] == "error":
            raise RuntimeError(f"learner rank {msg[1]} failed: {msg[2]}")

    @contextlib.contextmanager
    def naming_failed_peers(self):
        """A collective that failed because a peer died or failed: say which rank and why."""
        try:
            yield
        except DistributedBatchError as exc:  # every rank raised it together: add what each said
            peers = self._peer_errors(wait_s=min(self.timeout_s, 5.0))
            if peers:
                raise DistributedBatchError("; ".join([str(exc), *peers])) from None
            raise
        except Exception as exc:
            # a dead peer's exit is seen a moment after its socket closed: wait for it, bounded
            multiprocessing.connection.wait([p.sentinel for p in self.procs], timeout=2.0)
            self.drain()
            self.check_alive()
            raise exc

    def _peer_errors(self, wait_s: float) -> list[str]:
        """The other ranks' own errors after a barrier that failed on all (each reports once)."""
        said: dict[int, str] = {}
        deadline = time.monotonic() + wait_s
        while len(said) < self.world - 1 and (remaining := deadline - time.monotonic()) > 0:
            try:
                msg = self.up_q.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            if msg[0] == "error":  # "...; rank r: <its own reason>" (barrier.exchange_counts)
                own = f"; rank {msg[1]}: "
                said[msg[1]] = msg[2].split(own, 1)[1] if own in msg[2] else msg[2]
        return [f"rank {r}: {reason}" for r, reason in sorted(said.items())]

    def check_alive(self) -> None:
        for r, p in zip(self.ranks, self.procs):
            if p.exitcode is not None and p.exitcode != 0:
                raise RuntimeError(f"learner rank {r} exited with code {p.exitcode}")
        for q in self.cmd_qs:
            if isinstance(q, RemoteRank) and q.lost:
                raise RuntimeError(f"learner rank {q.rank} (node {q.node}): the connection to it was lost")

    def close(self) -> None:
        """Stop every rank: ask, wait, then terminate and kill whichever is left."""
        for q in self.cmd_qs:
            try:
                q.close() if isinstance(q, RemoteRank) else q.put(("stop",))
            except (ValueError, OSError):
                pass
        stop_processes(self.procs, min(self.timeout_s, 30.0))
        for q in [self.up_q, *self.cmd_qs]:
            if not isinstance(q, RemoteRank):
                q.cancel_join_thread()
                q.close()
