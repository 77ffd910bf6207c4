"""Rank 0's learner when a run has data-parallel ranks (``learner.world_size`` > 1 or
``learner.engine: deepspeed``): the calls of ``StreamingLearner`` plus ``reduce``/``step``.

Rank 0 is the driver process: it receives every trajectory from the rollout fleet, learns those
of the groups it owns and forwards the others to their owner rank (``learner.distributed.rank_worker``),
so all W ranks stream backward passes at once. At the barrier every rank checks itself and joins
the one integer all-reduce, then the gradient reduction and the optimizer step; rank 0 publishes.
The other ranks' phases come back as spans on their own lanes, ``learner/<rank>`` (``learner/<rank>@<node>``
in a run that spans nodes, whose other nodes' ranks ``RankPeers`` reaches through ``learner.distributed.remote``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import torch

from learner.config import RunConfig
from learner.distributed.barrier_vote import collectives_raise_on_timeout
from learner.distributed.peers import RankPeers, RankPhase
from learner.distributed.ranks import init_rank
from learner.placement import learner_device, local_rank
from learner.distributed.rank_worker import broadcast_from_rank0, weights_fingerprint
from learner.grad.learners.common import LearnerOptions, PhaseCallback
from learner.grad.learners.on_policy import StreamingLearner
from learner.trajectory import ScoredTurn, Trajectory

__all__ = ["DataParallelLearner", "RankPhase", "rank_lane", "rank_metrics", "uses_ranks"]


class DataParallelLearner:
    """Rank 0's ``RankLearner`` and engine, with ranks 1..W−1 as ``RankPeers``."""

    def __init__(self, cfg: RunConfig, model: torch.nn.Module, ref_model, policy_dir: str, on_rank_phase: RankPhase,
                 optimizer: torch.optim.Optimizer | None = None):
        """``optimizer``: the run's AdamW, which the torch engine steps (checkpoints save and load it)."""
        from learner.distributed.engines import broadcast_optimizer_state, make_learner_engine
        from learner.distributed.rank import RankLearner

        self.cfg, self.world = cfg, cfg.learner.world_size
        self._reduced = False  # this batch's gradient summed over the ranks already (``reduce``)
        self._batches = 0  # barriers passed: the ranks number their log-prob reports alike
        self.peers = RankPeers(cfg, policy_dir, on_rank_phase)
        try:
            collectives_raise_on_timeout()  # NCCL: a stuck collective raises, naming the rank (not an abort)
            local, local_world = local_rank(cfg, 0)
            init_rank(0, self.world, self.peers.init_method, cfg.learner.timeout_s, local_rank=local,
                      device=learner_device(cfg, 0), local_world_size=local_world)
            torch.set_num_threads(1)
            self.local = RankLearner(StreamingLearner(model, cfg.algorithm, ref_model, LearnerOptions.from_config(cfg)),
                                     0, self.world)
            lrn, train = cfg.learner, cfg.train
            self.engine = make_learner_engine(lrn.engine, model, train.lr, train.weight_decay, train.grad_clip,
                                      lrn.zero_stage, lrn.offload_optimizer, optimizer)
            broadcast_from_rank0(model)
            broadcast_optimizer_state(self.engine)  # a resumed run: rank 0 loaded its checkpoint
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        """Process ids of ranks 1..W−1 (rank 0 is this process)."""
        return self.peers.pids

    @property
    def rank_stats(self) -> dict[int, dict]:
        """Each rank's stats of the last step (rank 0's from ``finish_batch``, the others' after ``step``)."""
        return self.peers.stats

    # -- what StreamingLearner offers ------------------------------------------------------
    @property
    def path(self) -> str:
        return self.local.learner.path

    @property
    def ref_model(self):
        return self.local.learner.ref_model

    @property
    def logprobs(self) -> "RanksLedger":
        """Every rank's log-probs of its own trajectories (rank 0's ledger and what the others sent
        after the barrier): the mismatch metric forwards no other rank's trajectory on rank 0."""
        return RanksLedger(self)

    @property
    def owners(self) -> dict[int, int]:
        return self.local.owners

    def begin_batch(self, group_sizes: Mapping[int, int]) -> None:
        sizes = dict(group_sizes)
        self.peers.broadcast(("begin", sizes))
        self.local.begin_batch(sizes)

    def learn(self, items: Sequence[Trajectory | ScoredTurn], on_phase: PhaseCallback | None = None) -> dict:
        owners = self.local.owners
        by_rank: dict[int, list] = {}
        for item in items:
            by_rank.setdefault(owners.get(item.group, 0), []).append(item)
        for rank, part in by_rank.items():
            if rank:
                self.peers.send(rank, ("learn", part))
        stats = self.local.learn(by_rank.get(0, []), on_phase) if 0 in by_rank else {}
        self.peers.drain()
        return stats

    def on_trajectory(self, traj: Trajectory, on_phase: PhaseCallback | None = None) -> dict:
        return self.learn([traj], on_phase)

    def on_turn(self, turn: ScoredTurn, on_phase: PhaseCallback | None = None) -> dict:
        return self.learn([turn], on_phase)

    def idle_work(self, on_phase: PhaseCallback | None = None) -> bool:
        self.peers.drain()
        return self.local.idle_work(on_phase)

    def finish_batch(self, on_phase: PhaseCallback | None = None) -> dict:
        """Every rank's barrier (its own check + the integer all-reduce); raises on every rank alike."""
        self.peers.broadcast(("finish",))
        self.peers.check_alive()
        with self.peers.naming_failed_peers():
            stats = self.local.finish_batch(on_phase)
        self.peers.stats = {0: stats}
        self._reduced = False
        self._batches += 1
        return stats

    # -- the reduction and the step ----------------------------------------------------------
    def reduce(self) -> None:
        """The batch gradient: every rank's share, summed (once per batch)."""
        if self._reduced:
            return
        with self.peers.naming_failed_peers():
            self.engine.reduce()
        self._reduced = True

    def batch_gradient(self) -> dict[str, torch.Tensor]:
        """The reduced gradient by parameter name (ZeRO-1/2: gathered from the partitions)."""
        self.reduce()
        names = [n for n, p in self.local.learner.model.named_parameters() if p.requires_grad]
        return dict(zip(names, self.engine.reduced_grads()))

    def metrics(self, spans: list[dict], t_start: float, t_end: float) -> dict[str, float]:
        return rank_metrics(spans, t_start, t_end, self.cfg, self.rank_stats)

    def step(self) -> float:
        """Reduce, clip the reduced gradient, one optimizer step, and wait for every rank's own step."""
        self.reduce()
        with self.peers.naming_failed_peers():
            norm = self.engine.step()
        self.peers.stats[0]["param_digest"] = weights_fingerprint(self.local.learner.model, self._batches,
                                                                  self.cfg.learner.digest_every)
        self.peers.wait_for_steps()
        digests = {r: s.get("param_digest") for r, s in self.rank_stats.items()}
        if len(set(digests.values())) != 1:  # the invariant data parallelism rests on
            raise RuntimeError(f"learner ranks diverged after the optimizer step: parameter digests {digests}")
        return norm

    def close(self) -> None:
        """Stop every rank (``RankPeers.close``), then leave the process group."""
        import torch.distributed as dist

        self.peers.close()
        if dist.is_initialized():
            dist.destroy_process_group()


class RanksLedger:
    """``LogprobLedger.take`` over all ranks: rank 0's own, plus each other rank's report of the
    batch (``RankLearner.own_logprobs``), awaited within ``learner.timeout_s``."""

    def __init__(self, front: DataParallelLearner):
        self.front = front

    def take(self) -> dict[int, torch.Tensor | None]:
        front = self.front
        merged = front.local.learner.logprobs.take()
        peers, batch = front.peers, front._batches
        late = lambda: [r for r in range(1, front.world) if peers.ledgers.get(r, (None,))[0] != batch]  # noqa: E731
        deadline = time.monotonic() + peers.timeout_s
        with peers.naming_failed_peers():
            while late():  # each other rank's report of this batch (its barrier passed)
                peers._next_up(deadline, lambda: f"learner ranks {late()} (their log-probs)")
        for _, report in (peers.ledgers.pop(r) for r in range(1, front.world)):
            merged.update({i: None if lp is None else torch.from_numpy(lp) for i, lp in report.items()})
        return merged


def uses_ranks(cfg: RunConfig) -> bool:
    """Does this run's learner go through ``DataParallelLearner`` (ranks or the DeepSpeed engine)?"""
    return cfg.learner_ranks()


def rank_lane(rank: int, node: str | None = None) -> str:
    """A learner rank's Gantt lane; in a run that spans nodes it names the rank's node."""
    return f"learner/{rank}@{node}" if node else f"learner/{rank}"


def rank_metrics(spans: list[dict], t_start: float, t_end: float, cfg: RunConfig, rank_stats: dict[int, dict]) -> dict:
    """Per-rank step metrics: ``learner/<r>/idle_ratio`` (no span on the rank's lane), its
    trajectories and backward seconds, ``learner/ranks_in_sync`` (1: every rank's weights
    hashed equal after the step) and, with the shared-prompt backward, ``learner/shared_prompt_rows``
    summed over the ranks. ``trainer/idle_ratio`` stays the learner as a whole: the share
    of the step with no learner span on any rank."""
    from learner.timeline import LEARNER_KINDS, Metric, union_length

    width = max(t_end - t_start, 1e-12)
    out: dict[str, float] = {}
    world = cfg.learner.world_size
    for r in range(world):
        lane = rank_lane(r, cfg.learner.node_of(r))
        busy = [(s["t0"], s["t1"]) for s in spans if s.get("lane") == lane and s["kind"] in LEARNER_KINDS]
        out[f"learner/{r}/idle_ratio"] = 1.0 - union_length(busy, t_start, t_end) / width
        stats = rank_stats.get(r, {})
        if stats:
            out[f"learner/{r}/trajectories"] = float(stats.get("rank_trajectories", 0))
            out[f"learner/{r}/backward_s"] = float(stats.get("backward_s", 0.0))
    shared = [s["shared_prompt_rows"] for s in rank_stats.values() if "shared_prompt_rows" in s]
    if shared:  # learner.shared_prompt_backward: every rank's, not rank 0's alone
        out[Metric.SHARED_PROMPT_ROWS] = float(sum(shared))
    digests = {s.get("param_digest") for s in rank_stats.values()}
    if len(rank_stats) == world:
        out[Metric.RANKS_IN_SYNC] = 1.0 if len(digests) == 1 and None not in digests else 0.0
    return out
