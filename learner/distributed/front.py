"""Rank 0's learner when a run has data-parallel ranks (``learner.world_size`` > 1 or
``learner.engine: deepspeed``): the calls of ``StreamingLearner`` plus ``reduce``/``step``.

Rank 0 is the driver process: it receives every trajectory from the rollout fleet, learns those
of the groups it owns and forwards the others to their owner rank (``learner.distributed.worker``),
so all W ranks stream backward passes at once. At the barrier every rank checks itself and joins
the one integer all-reduce, then the gradient reduction and the optimizer step; rank 0 publishes.
The other ranks' phases come back as spans on their own lanes, ``learner/<rank>``.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import queue
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Listener

import torch

from learner.config import RunConfig
from learner.distributed.barrier import DistributedBatchError
from learner.distributed.ranks import init_rank, stop_processes
from learner.distributed.remote import ADDR_ENV, KEY_ENV, PORT_ENV, RemoteRank, accept_ranks, free_port, run_key
from learner.distributed.worker import broadcast_from_rank0, param_digest, rank_main
from learner.gradients import LearnerOptions, PhaseCallback, StreamingLearner
from learner.trajectory import ScoredTurn, Trajectory

RankPhase = Callable[[int, str, float, float, "int | None", "int | None"], None]


class DataParallelLearner:
    def __init__(self, cfg: RunConfig, model: torch.nn.Module, ref_model, policy_dir: str, on_rank_phase: RankPhase,
                 optimizer: torch.optim.Optimizer | None = None):
        from learner.distributed.engines import broadcast_optimizer_state, make_engine
        from learner.distributed.rank import RankLearner

        self.cfg, self.world = cfg, cfg.learner.world_size
        self.timeout_s = cfg.learner.timeout_s
        self.on_rank_phase = on_rank_phase
        self.up_q = multiprocessing.get_context("spawn").Queue()
        self.cmd_qs: list = []  # ranks 1..W−1: a queue (this node) or a RemoteRank (another node)
        self.procs: list = []  # this node's rank processes
        try:
            init_method = start_peers(cfg, policy_dir, self.up_q, self.cmd_qs, self.procs)
            init_rank(0, self.world, init_method, self.timeout_s)
            torch.set_num_threads(1)
            self.local = RankLearner(StreamingLearner(model, cfg.algorithm, ref_model, LearnerOptions.from_config(cfg)),
                                     0, self.world)
            lrn, train = cfg.learner, cfg.train
            self.engine = make_engine(lrn.engine, model, train.lr, train.weight_decay, train.grad_clip,
                                      lrn.zero_stage, lrn.offload_optimizer, optimizer)
            broadcast_from_rank0(model)
            broadcast_optimizer_state(self.engine)  # a resumed run: rank 0 loaded its checkpoint
        except BaseException:
            self.close()
            raise
        self.rank_stats: dict[int, dict] = {}

    @property
    def pids(self) -> list[int]:
        """Process ids of ranks 1..W−1 (rank 0 is this process)."""
        return [p.pid for p in self.procs]

    # -- what StreamingLearner offers ------------------------------------------------------
    @property
    def path(self) -> str:
        return self.local.learner.path

    @property
    def ref_model(self):
        return self.local.learner.ref_model

    @property
    def logprobs(self):
        return self.local.learner.logprobs

    @property
    def owners(self) -> dict[int, int]:
        return self.local.owners

    def begin_batch(self, group_sizes: Mapping[int, int]) -> None:
        sizes = dict(group_sizes)
        for q in self.cmd_qs:
            q.put(("begin", sizes))
        self.local.begin_batch(sizes)

    def learn(self, items: Sequence[Trajectory | ScoredTurn], on_phase: PhaseCallback | None = None) -> dict:
        owners = self.local.owners
        by_rank: dict[int, list] = {}
        for item in items:
            by_rank.setdefault(owners.get(item.group, 0), []).append(item)
        for rank, part in by_rank.items():
            if rank:
                self.cmd_qs[rank - 1].put(("learn", part))
        stats = self.local.learn(by_rank.get(0, []), on_phase) if 0 in by_rank else {}
        self.drain()
        return stats

    def on_trajectory(self, traj: Trajectory, on_phase: PhaseCallback | None = None) -> dict:
        return self.learn([traj], on_phase)

    def on_turn(self, turn: ScoredTurn, on_phase: PhaseCallback | None = None) -> dict:
        return self.learn([turn], on_phase)

    def idle_work(self, on_phase: PhaseCallback | None = None) -> bool:
        self.drain()
        return self.local.idle_work(on_phase)

    def finish_batch(self) -> dict:
        """Every rank's barrier (its own check + the integer all-reduce); raises on every rank alike."""
        for q in self.cmd_qs:
            q.put(("finish",))
        self._check_alive()
        with self._naming_failed_peers():
            stats = self.local.finish_batch()
        self.rank_stats = {0: stats}
        return stats

    # -- the reduction and the step ----------------------------------------------------------
    def reduce(self) -> None:
        with self._naming_failed_peers():
            self.engine.reduce()

    def reduced_grads(self) -> list[torch.Tensor]:
        return self.engine.reduced_grads()

    def step(self) -> float:
        """Clip the reduced gradient, one optimizer step, and wait for every rank's own step."""
        with self._naming_failed_peers():
            norm = self.engine.step()
        self.rank_stats[0]["param_digest"] = param_digest(self.local.learner.model)
        deadline = time.monotonic() + self.timeout_s
        while len(self.rank_stats) < self.world:
            self._next_up(deadline)
        digests = {r: s.get("param_digest") for r, s in self.rank_stats.items()}
        if len(set(digests.values())) != 1:  # the invariant data parallelism rests on
            raise RuntimeError(f"learner ranks diverged after the optimizer step: parameter digests {digests}")
        return norm

    # -- messages from the other ranks --------------------------------------------------------
    def drain(self) -> None:
        """Pass on every phase the other ranks reported so far."""
        while True:
            try:
                msg = self.up_q.get_nowait()
            except queue.Empty:
                return
            self._handle(msg)

    def _next_up(self, deadline: float) -> None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"learner ranks {sorted(set(range(self.world)) - set(self.rank_stats))} did "
                                   f"not finish their step within learner.timeout_s = {self.timeout_s:g} s")
            try:
                msg = self.up_q.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                self._check_alive()
                continue
            self._handle(msg)
            return

    def _handle(self, msg) -> None:
        if msg[0] == "phase":
            self.on_rank_phase(*msg[1:])
        elif msg[0] == "stepped":
            self.rank_stats[msg[1]] = msg[2]
        elif msg[0] == "error":
            raise RuntimeError(f"learner rank {msg[1]} failed: {msg[2]}")

    @contextlib.contextmanager
    def _naming_failed_peers(self):
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
            self._check_alive()
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

    def _check_alive(self) -> None:
        for p in self.procs:
            if p.exitcode is not None and p.exitcode != 0:
                raise RuntimeError(f"learner rank {p.rank} exited with code {p.exitcode}")
        for q in self.cmd_qs:
            if isinstance(q, RemoteRank) and q.lost:
                raise RuntimeError(f"learner rank {q.rank} (node {q.node}): the connection to it was lost")

    def close(self) -> None:
        """Stop every rank: ask, wait, then terminate and kill whichever is left; leave the group."""
        import torch.distributed as dist

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
        if dist.is_initialized():
            dist.destroy_process_group()


def start_peers(cfg: RunConfig, policy_dir: str, up_q, cmd_qs: list, procs: list) -> str:
    """Ranks 1..W−1, appended to ``cmd_qs`` (and ``procs``) as they start: spawned here for this
    node's ranks; a control port that the ranks of other nodes join (learner.distributed.remote).
    Returns the rendezvous ``init_method`` (a TCP store held by rank 0, at this node's address)."""
    lrn = cfg.learner
    here = lrn.node_of(0)
    remote = {r: lrn.node_of(r) for r in range(1, lrn.world_size) if lrn.node_of(r) != here}
    addr = os.environ.get(ADDR_ENV, "127.0.0.1") if remote else "127.0.0.1"
    init_method = f"tcp://{addr}:{free_port(addr)}"
    ctx = multiprocessing.get_context("spawn")
    peers: dict[int, object] = {}
    for r in range(1, lrn.world_size):
        if r not in remote:
            peers[r] = ctx.Queue()
            proc = ctx.Process(target=rank_main, name=f"thundersync-learner-rank-{r}", daemon=True,
                               args=(cfg.model_dump(), policy_dir, r, lrn.world_size, init_method, peers[r], up_q))
            proc.rank = r
            proc.start()
            procs.append(proc)
    if remote:
        key, port = run_key(), int(os.environ.get(PORT_ENV) or 0)
        with Listener((addr, port), authkey=key) as listener:
            if KEY_ENV not in os.environ:  # no controller placed the ranks: say how to start them
                host, port = listener.address
                for r, node in remote.items():
                    print(f"thundersync: waiting for rank {r} on node {node}: {KEY_ENV}={key.hex()} thundersync "
                          f"join-rank --control {host}:{port} --rank {r} --node {node}", file=sys.stderr)
            peers.update(accept_ranks(listener, remote, (cfg.model_dump(), lrn.world_size, init_method), up_q,
                                      lrn.timeout_s))
    cmd_qs.extend(peers[r] for r in range(1, lrn.world_size))
    return init_method


def uses_ranks(cfg: RunConfig) -> bool:
    """Does this run's learner go through ``DataParallelLearner`` (ranks or the DeepSpeed engine)?"""
    return cfg.learner.world_size > 1 or cfg.learner.engine != "torch"


def rank_lane(rank: int, node: str | None = None) -> str:
    """A learner rank's Gantt lane; in a run that spans nodes it names the rank's node."""
    return f"learner/{rank}@{node}" if node else f"learner/{rank}"


def rank_metrics(spans: list[dict], t_start: float, t_end: float, cfg: RunConfig, rank_stats: dict[int, dict]) -> dict:
    """Per-rank step metrics: ``learner/<r>/idle_ratio`` (no span on the rank's lane), its
    trajectories and backward seconds, and ``learner/ranks_in_sync`` (1: every rank's weights
    hashed equal after the step). ``trainer/idle_ratio`` stays the learner as a whole: the share
    of the step with no learner span on any rank."""
    from learner.timeline import union_length

    width = max(t_end - t_start, 1e-12)
    out: dict[str, float] = {}
    world = cfg.learner.world_size
    for r in range(world):
        lane = rank_lane(r, cfg.learner.node_of(r))
        busy = [(s["t0"], s["t1"]) for s in spans if s.get("lane") == lane and s["kind"].startswith("learner.")]
        out[f"learner/{r}/idle_ratio"] = 1.0 - union_length(busy, t_start, t_end) / width
        stats = rank_stats.get(r, {})
        if stats:
            out[f"learner/{r}/trajectories"] = float(stats.get("rank_trajectories", 0))
            out[f"learner/{r}/backward_s"] = float(stats.get("backward_s", 0.0))
    digests = {s.get("param_digest") for s in rank_stats.values()}
    if len(rank_stats) == world:
        out["learner/ranks_in_sync"] = 1.0 if len(digests) == 1 and None not in digests else 0.0
    return out
