"""What every learner shares: the learner-path options, GRPO advantages over a batch, the
learner's own log-prob ledger, and how a micro-batch is counted and reported (docs/learner.md).

Timing: ``learn``, ``idle_work`` and ``train_batch`` take an optional ``on_phase(kind, t0, t1,
traj, group)`` callback, called with ``time.monotonic()`` stamps for each ``learner.backward``
and ``learner.group_close`` phase. A micro-batch of n rows is one forward and one backward;
its interval is reported as n consecutive equal shares, one per trajectory (padded rows cost
the same), so every trajectory keeps its backward span.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from learner.config import (LEARNER_PATHS, AdvantageConfig, AlgorithmConfig, LearnerConfig,  # noqa: F401
                            RunConfig, TrainConfig)
from learner.grad.accumulator import GradAccumulator
from learner.grad.fixed_point import FixedPointSum
from learner.grad.batching.microbatch import Row
from learner.grad.batching.packing import Layout
from learner.grad.objectives import advantages, check_algorithm
from learner.timeline import Kind
from learner.trajectory import Trajectory

PhaseCallback = Callable[[str, float, float, "int | None", "int | None"], None]


def _default(section, field: str):
    """The config schema's default of ``section.field`` (pydantic), so no default is said twice."""
    return section.model_fields[field].default


@dataclass(frozen=True)
class LearnerOptions:
    """How the learner batches its work (``learner.*`` and ``train.micro_batch_tokens`` of a run)."""

    # Defaults are the config's own (``learner.*``, ``train.micro_batch_tokens``): one source of truth;
    # ``from_config`` resolves the config's nulls (path auto, deterministic, speculate_zero_variance).
    path: str = "adaptive"  # streaming's learner path, what ``learner.path: auto`` resolves to there
    micro_batch_tokens: int = _default(TrainConfig, "micro_batch_tokens")
    max_open_groups: int | None = _default(LearnerConfig, "max_open_groups")  # K; None = unlimited
    accumulator_device: str = _default(LearnerConfig, "accumulator_device")  # device or host
    deterministic: bool = False  # G in fixed point (learner.deterministic; learner/grad/learners/deterministic.py)
    speculate_zero_variance: bool = False  # adaptive: learn zero-variance candidates in idle time
    drain_policy: str = _default(LearnerConfig, "drain_policy")  # learner/grad/batching/cost_model.py
    early_work_share: float = _default(LearnerConfig, "early_work_share")  # cost-aware: early work's premium cap
    pack_rows: bool = _default(LearnerConfig, "pack_rows")  # learner/grad/batching/packing.py
    shared_prompt_backward: bool = _default(LearnerConfig, "shared_prompt_backward")  # batching/shared_prompt.py
    shared_prompt_max_tokens: int = _default(LearnerConfig, "shared_prompt_max_tokens")
    grouped_backward: bool = _default(LearnerConfig, "grouped_backward")  # learner/grad/batching/grouped.py

    def __post_init__(self) -> None:
        if self.path not in LEARNER_PATHS:
            raise ValueError(f"learner.path: {self.path!r} is not one of {', '.join(LEARNER_PATHS)}")

    @classmethod
    def from_config(cls, cfg: RunConfig) -> "LearnerOptions":
        return cls(path=cfg.learner_path(), micro_batch_tokens=cfg.train.micro_batch_tokens,
                   max_open_groups=cfg.learner.max_open_groups, accumulator_device=cfg.learner.accumulator_device,
                   deterministic=cfg.deterministic_learner(),
                   speculate_zero_variance=cfg.speculate_zero_variance(), drain_policy=cfg.learner.drain_policy,
                   early_work_share=cfg.learner.early_work_share, pack_rows=cfg.learner.pack_rows,
                   shared_prompt_backward=cfg.learner.shared_prompt_backward,
                   shared_prompt_max_tokens=cfg.learner.shared_prompt_max_tokens,
                   grouped_backward=cfg.learner.grouped_backward)

    @property
    def min_stream_tokens(self) -> int:
        """Adaptive: the least work (tokens) a streaming backward starts with before the whole batch
        has arrived; a smaller one costs more per row in fixed overhead than waiting does."""
        return self.micro_batch_tokens // 4 if self.path == "adaptive" else 0

    @property
    def budget(self) -> int:
        """Token budget per micro-batch; 0 puts every row in its own (per-trajectory)."""
        return 0 if self.path == "per-trajectory" else self.micro_batch_tokens

    def accumulator(self, params: Sequence[torch.nn.Parameter]) -> GradAccumulator | FixedPointSum:
        if self.deterministic:
            return FixedPointSum(params)
        return GradAccumulator(params, group_device="cpu" if self.accumulator_device == "host" else None)


@dataclass(frozen=True)
class OptimizerStep:
    """A learner's step at the barrier: ``optimizer`` over its trainable parameters, the batch
    gradient clipped to ``grad_clip`` first (``train.grad_clip``; 0: not clipped)."""

    optimizer: torch.optim.Optimizer
    grad_clip: float = 0.0

    def __call__(self, params: Sequence[torch.nn.Parameter]) -> float:
        return clip_and_step(params, self.optimizer, self.grad_clip)


def clip_and_step(params: Sequence[torch.nn.Parameter], optimizer: torch.optim.Optimizer, grad_clip: float) -> float:
    """Clip the gradient in ``p.grad`` (0: no clipping, the norm is still measured), one optimizer
    step, gradients cleared; returns the norm before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return float(norm)


class InProcessLearner:
    """What a learner that lives in the driver's process does at the barrier, once its batch's
    gradient is in ``p.grad`` (``StreamingLearner``, ``OffPolicyLearner``; cf.
    ``DataParallelLearner``). Needs ``model``, ``acc`` and ``optimizer``."""

    model: torch.nn.Module
    acc: GradAccumulator | FixedPointSum
    optimizer: OptimizerStep | None

    @property
    def pids(self) -> list[int]:
        return []  # no processes of its own

    def step(self) -> float:
        """Clip the finished batch's gradient, one optimizer step, gradients cleared."""
        if self.optimizer is None:
            raise RuntimeError("step: this learner was built without an optimizer (OptimizerStep)")
        return self.optimizer(self.acc.params)

    def batch_gradient(self) -> dict[str, torch.Tensor]:
        return {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}

    def metrics(self, spans: list[dict], t_start: float, t_end: float) -> dict[str, float]:
        return {}  # one process, one lane: the step's own metrics say it all

    def close(self) -> None:
        """Nothing to release: the learner lives in the driver's process."""


# ---------------------------------------------------------------- shared helpers


def batch_advantages(trajs: Sequence[Trajectory], adv: AdvantageConfig) -> dict[int, float]:
    """A_i for every trajectory, each group's statistics over its members present in ``trajs``."""
    by_group: dict[int, list[Trajectory]] = defaultdict(list)
    for traj in trajs:
        by_group[traj.group].append(traj)
    out: dict[int, float] = {}
    for members in by_group.values():
        for traj, a in zip(members, advantages([t.reward for t in members], adv.std, adv.eps)):
            if traj.id in out:
                raise ValueError(f"trajectory {traj.id}: id appears twice in the batch")
            out[traj.id] = a
    return out


def check_ref(algo: AlgorithmConfig, ref_model: torch.nn.Module | None) -> None:
    check_algorithm(algo)
    if algo.kl_coef > 0 and ref_model is None:
        raise ValueError("ref_model: algorithm.kl_coef > 0 needs a frozen reference model")


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


class LogprobLedger:
    """The learner's own detached log-probs, per trajectory, as its forward computed them
    (OPD: the longest prefix seen). The train/inference mismatch metric reads them at the
    barrier instead of running another forward. A trajectory whose backward was skipped
    (A = 0, no KL/entropy) has no forward: it is recorded as None, and the metric leaves it out
    rather than forward it at the barrier, on the step's critical path (``learner.grad.mismatch``)."""

    def __init__(self) -> None:
        self._by_traj: dict[int, torch.Tensor | None] = {}

    def keep(self, traj: int, logp: torch.Tensor) -> None:  # logp: (T,)
        old = self._by_traj.get(traj)
        if old is None or len(old) < len(logp):
            self._by_traj[traj] = logp.detach().double().cpu()

    def skip(self, traj: int) -> None:
        self._by_traj.setdefault(traj, None)

    def take(self) -> dict[int, torch.Tensor | None]:
        taken, self._by_traj = self._by_traj, {}
        return taken


def report_micro_batch(state, rows: list[Row], grid: Layout, t0: float, t1: float,
                       on_phase: PhaseCallback | None) -> None:
    """Count a micro-batch (and its padded token slots) and report it as one equal share of its
    interval per row."""
    state.micro_batches += 1
    state.rows += len(rows)
    state.token_slots += grid.slots  # lines × longest row (learner/grad/batching/packing.py)
    state.padded_slots += grid.padded_slots
    state.backward_s += t1 - t0
    if on_phase:
        share = (t1 - t0) / len(rows)
        for k, row in enumerate(rows):
            on_phase(Kind.BACKWARD, t0 + k * share, t0 + (k + 1) * share if k + 1 < len(rows) else t1,
                     row.traj, row.group)


def padding_stats(state) -> dict:
    """``padding_share``: padded token slots over all token slots of the step's micro-batches."""
    return {"padding_share": state.padded_slots / state.token_slots} if state.token_slots else {}


def memory_stats(acc: GradAccumulator, peak_buffers: int) -> dict:
    """Peak gradient-sized buffers and their MB; on a GPU also the peak allocated memory of the step."""
    mb = 2.0**20
    stats = {"peak_buffers": peak_buffers, "peak_accumulator_mb": peak_buffers * acc.buffer_bytes() / mb}
    device = acc.params[0].device
    if device.type == "cuda":
        stats["peak_memory_mb"] = torch.cuda.max_memory_allocated(device) / mb
    return stats
