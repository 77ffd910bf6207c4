"""What the trainer drives: the streaming/sync learner, the off-policy learner, and the reference.

StreamingLearner (schedules ``sync`` and ``streaming``; the same class, so both give the same
update up to summation order), per batch:

    learner.begin_batch({group_id: group_size, ...})
    GRPO: learner.on_trajectory(traj)   # each trajectory as its reward arrives, any order
    OPD:  learner.on_turn(turn)         # each turn as the teacher scores it, any order;
          learner.on_trajectory(traj)   # optional, when it ends: checks all its turns arrived
    stats = learner.finish_batch()      # barrier: batch normaliser, result in p.grad
    # caller: clip_grad_norm_, optimizer.step(), optimizer.zero_grad()

Timing: ``on_trajectory``, ``on_turn`` and ``OffPolicyLearner.train_batch`` take an optional
``on_phase(kind, t0, t1, traj, group)`` callback, called with ``time.monotonic()`` stamps for
each ``learner.backward`` and ``learner.group_close`` phase; the returned stats carry the same
durations (``backward_s``, ``close_s``).

Conventions (docs/math.md) are in ``learner.objectives``; the accumulators in ``learner.streaming``.
"""

from __future__ import annotations

import array
import math
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch

from learner.config import AdvantageConfig, AlgorithmConfig
from learner.objectives import (
    advantages,
    agg_weights,
    aux_token_loss,
    batch_normaliser,
    check_algorithm,
    clipped_pg_token_loss,
    opd_token_loss,
    pg_token_loss,
    token_logprobs,
)
from learner.streaming import GradAccumulator, OpenGroupError
from learner.timeline import Kind
from learner.trajectory import ScoredTurn, Trajectory

PhaseCallback = Callable[[str, float, float, "int | None", "int | None"], None]


# ---------------------------------------------------------------- record → tensors


def trajectory_tensors(traj: Trajectory, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids (1, T) long and loss_mask (T,) long, validated."""
    n = len(traj.input_ids)
    if n == 0:
        raise ValueError(f"trajectory {traj.id}: input_ids is empty")
    if len(traj.loss_mask) != n:
        raise ValueError(f"trajectory {traj.id}: loss_mask has {len(traj.loss_mask)} entries for {n} input_ids")
    if not set(traj.loss_mask) <= {0, 1}:
        raise ValueError(f"trajectory {traj.id}: loss_mask entries must be 0 or 1")
    if traj.loss_mask[0]:
        raise ValueError(f"trajectory {traj.id}: loss_mask[0] is 1 but position 0 has no preceding token")
    owner = f"trajectory {traj.id}"
    return _long_tensor(traj.input_ids, device, f"{owner}: input_ids")[None], _long_tensor(traj.loss_mask, device, f"{owner}: loss_mask")


def _long_tensor(values: Sequence[int], device: torch.device, what: str) -> torch.Tensor:
    """int64 tensor of a list of ints: through an array buffer, ~3x cheaper than torch.tensor(list)
    (this runs on the learner's core once per trajectory)."""
    try:
        buf = array.array("q", values)
    except (TypeError, OverflowError) as err:
        raise ValueError(f"{what}: must be a list of int64 values ({err})") from None
    return torch.frombuffer(buf, dtype=torch.long).to(device) if buf else torch.zeros(0, dtype=torch.long, device=device)


def _per_position(
    values: Sequence[float | None] | None, mask: Sequence[int], what: str, owner: str, dtype, device
) -> torch.Tensor:
    """(T,) tensor of a per-position log-prob list; required and finite where mask is 1, 0 elsewhere."""
    if values is None:
        raise ValueError(f"{owner}: {what} is missing")
    if len(values) != len(mask):
        raise ValueError(f"{owner}: {what} has {len(values)} entries for {len(mask)} positions")
    out = []
    for t, (m, v) in enumerate(zip(mask, values)):
        if m and (v is None or not math.isfinite(v)):
            raise ValueError(f"{owner}: {what}[{t}] must be a finite log-prob for a scored token, got {v}")
        out.append(float(v) if m else 0.0)
    return torch.tensor(out, dtype=dtype, device=device)


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


def forward_terms(
    model: torch.nn.Module, ref_model: torch.nn.Module | None, algo: AlgorithmConfig, input_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logp (B, T) with its graph, and the per-token KL/entropy terms (B, T) or None."""
    logp, entropy = token_logprobs(model, input_ids, with_entropy=algo.entropy_coef > 0)
    ref_logp = None
    if algo.kl_coef > 0 and ref_model is not None:
        with torch.no_grad():
            ref_logp = token_logprobs(ref_model, input_ids)[0].to(logp.dtype)
    return logp, aux_token_loss(logp, entropy, ref_logp, algo.kl_coef, algo.entropy_coef)


def _device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _check_ref(algo: AlgorithmConfig, ref_model: torch.nn.Module | None) -> None:
    check_algorithm(algo)
    if algo.kl_coef > 0 and ref_model is None:
        raise ValueError("ref_model: algorithm.kl_coef > 0 needs a frozen reference model")


def _trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


class LogprobLedger:
    """The learner's own detached log-probs, per trajectory, as its forward computed them
    (OPD: the longest prefix seen). The train/inference mismatch metric reads them at the
    barrier instead of running another forward."""

    def __init__(self) -> None:
        self._by_traj: dict[int, torch.Tensor] = {}

    def keep(self, traj: int, logp: torch.Tensor) -> None:  # logp: (T,)
        old = self._by_traj.get(traj)
        if old is None or len(old) < len(logp):
            self._by_traj[traj] = logp.detach().double().cpu()

    def take(self) -> dict[int, torch.Tensor]:
        taken, self._by_traj = self._by_traj, {}
        return taken


# ---------------------------------------------------------------- sync / streaming


@dataclass
class _Batch:
    group_sizes: dict[int, int]
    arrived: dict[int, int]
    traj_ids: set[int] = field(default_factory=set)
    turns: set[tuple[int, int]] = field(default_factory=set)  # OPD (traj, turn) seen
    scored_by_traj: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # OPD
    n_tokens: int = 0
    peak_buffers: int = 1


class StreamingLearner:
    """Exact streaming GRPO / per-turn OPD: one optimizer step per batch, zero staleness."""

    def __init__(self, model: torch.nn.Module, algo: AlgorithmConfig, ref_model: torch.nn.Module | None = None):
        _check_ref(algo, ref_model)
        self.model, self.algo, self.ref_model = model, algo, ref_model
        self.acc = GradAccumulator(_trainable(model))
        self._batch: _Batch | None = None
        self.logprobs = LogprobLedger()

    def begin_batch(self, group_sizes: Mapping[int, int]) -> None:
        """Start a batch of the given groups; discards any gradient left in p.grad."""
        if self._batch is not None:  # its partial sums would leak into this batch's gradient
            raise RuntimeError("begin_batch: the previous batch was not finished (call finish_batch first)")
        if not group_sizes:
            raise ValueError("group_sizes: a batch needs at least one group")
        for g, size in group_sizes.items():
            if not isinstance(size, int) or size < 1:
                raise ValueError(f"group_sizes[{g}]: a group size must be an integer >= 1, got {size!r}")
        for p in self.acc.params:
            p.grad = None
        self._batch = _Batch(group_sizes=dict(group_sizes), arrived={g: 0 for g in group_sizes})

    def _state(self, call: str) -> _Batch:
        if self._batch is None:
            raise RuntimeError(f"{call}: call begin_batch first")
        return self._batch

    def _admit(self, state: _Batch, group: int, owner: str) -> int:
        size = state.group_sizes.get(group)
        if size is None:
            raise ValueError(f"{owner}: group {group} is not in this batch's group_sizes")
        return size

    def on_trajectory(self, traj: Trajectory, on_phase: PhaseCallback | None = None) -> dict:
        """GRPO: h_i = ∇ Σ_t w_{i,t}(−ρ_{i,t}) into its group's sums (S_k, T'_k), KL/entropy into G;
        closes the group when its last member arrived. OPD: checks the trajectory's turns all arrived."""
        state = self._state("on_trajectory")
        owner = f"trajectory {traj.id}"
        size = self._admit(state, traj.group, owner)
        if traj.id in state.traj_ids:
            raise ValueError(f"{owner}: already fed in this batch")
        if self.algo.objective == "opd":
            return self._complete_opd_trajectory(state, traj)
        if state.arrived[traj.group] >= size:
            raise ValueError(f"{owner}: group {traj.group} already has its {size} trajectories")
        # the span covers all of this trajectory's learner work: its inputs, forward, backward,
        # group sums, and releasing its graph
        t0 = time.monotonic()
        ids, mask = trajectory_tensors(traj, _device(self.model))  # (1, T), (T,)
        state.traj_ids.add(traj.id)
        if state.arrived[traj.group] == 0:
            self.acc.open_group(traj.group)
            state.peak_buffers = max(state.peak_buffers, self.acc.buffer_count())
        logp, aux = forward_terms(self.model, self.ref_model, self.algo, ids)  # (1, T), (1, T) | None
        self.logprobs.keep(traj.id, logp[0])
        w = agg_weights(mask, self.algo.loss_agg_mode, dtype=logp.dtype)  # (T,)
        (w * pg_token_loss(logp[0], 1.0)).sum().backward(retain_graph=aux is not None)
        self.acc.add_to_group(traj.group, traj.reward)
        if aux is not None:
            (w * aux[0]).sum().backward()
            self.acc.add_direct()
        del logp, aux, w
        state.arrived[traj.group] += 1
        n_tokens = sum(traj.loss_mask)
        state.n_tokens += n_tokens
        t1 = time.monotonic()
        if on_phase:
            on_phase(Kind.BACKWARD, t0, t1, traj.id, traj.group)

        stats = {"n_tokens": n_tokens, "group_closed": False, "backward_s": t1 - t0, "close_s": 0.0}
        if state.arrived[traj.group] == size:
            mu, denom = self.acc.close_group(traj.group, self.algo.advantage.std, self.algo.advantage.eps)
            t2 = time.monotonic()
            if on_phase:
                on_phase(Kind.GROUP_CLOSE, t1, t2, None, traj.group)
            stats.update(group_closed=True, close_s=t2 - t1, group_mean=mu, group_denom=denom)
        return stats

    def _complete_opd_trajectory(self, state: _Batch, traj: Trajectory) -> dict:
        expected = traj.n_scored
        got = state.scored_by_traj.get(traj.id, 0)
        if got != expected:
            raise ValueError(
                f"trajectory {traj.id}: {got} of its {expected} scored tokens arrived as turns before it ended"
            )
        state.traj_ids.add(traj.id)
        return {"n_tokens": expected, "group_closed": False, "backward_s": 0.0, "close_s": 0.0}

    def on_turn(self, turn: ScoredTurn, on_phase: PhaseCallback | None = None) -> dict:
        """OPD: backward of Σ_{t∈turn} (stopgrad logp_t − logp^T_t) ρ_t (+ KL/entropy) straight into G.

        The forward runs over the trajectory prefix up to the turn's end; only the turn's tokens
        are in the loss. Their count joins N_tokens, applied once in ``finish_batch``.
        """
        state = self._state("on_turn")
        owner = f"turn {turn.turn} of trajectory {turn.traj}"
        if self.algo.objective != "opd":
            raise ValueError(f"{owner}: on_turn is for objective opd; GRPO learns per trajectory (on_trajectory)")
        self._admit(state, turn.group, owner)
        if (turn.traj, turn.turn) in state.turns:
            raise ValueError(f"{owner}: already fed in this batch")
        start, end = turn.turn_span
        if not 1 <= start < end <= len(turn.input_ids):
            raise ValueError(f"{owner}: turn_span {turn.turn_span} must satisfy 1 <= start < end <= {len(turn.input_ids)}")
        t0 = time.monotonic()  # the span covers the turn's inputs, forward, backward, graph release
        device = _device(self.model)
        ids = _long_tensor(turn.input_ids[:end], device, f"{owner}: input_ids")[None]  # (1, end)
        all_scored = [1] * (end - start)
        teacher = _per_position(turn.teacher_logprobs, all_scored, "teacher_logprobs", owner, torch.float64, device)
        state.turns.add((turn.traj, turn.turn))
        logp, aux = forward_terms(self.model, self.ref_model, self.algo, ids)  # (1, end)
        self.logprobs.keep(turn.traj, logp[0])
        teacher = teacher.to(logp.dtype)  # (end - start,)
        terms = opd_token_loss(logp[0, start:], teacher)
        if aux is not None:
            terms = terms + aux[0, start:]
        terms.sum().backward()  # every OPD token weight is 1 (OPD_LOSS_AGG_MODES)
        self.acc.add_direct()
        del logp, aux, terms
        state.n_tokens += end - start
        state.scored_by_traj[turn.traj] += end - start
        t1 = time.monotonic()
        if on_phase:
            on_phase(Kind.BACKWARD, t0, t1, turn.traj, turn.group)
        return {"n_tokens": end - start, "group_closed": False, "backward_s": t1 - t0, "close_s": 0.0}

    def finish_batch(self) -> dict:
        """Barrier: p.grad = normaliser · G (1/N_tokens, 1/B or 1/C); raises if a group is incomplete."""
        state = self._state("finish_batch")
        n_traj = sum(state.group_sizes.values())
        if self.algo.objective == "grpo":
            missing = {g: n for g, n in state.arrived.items() if n < state.group_sizes[g]}
            if missing:
                detail = ", ".join(f"{g} ({n}/{state.group_sizes[g]})" for g, n in missing.items())
                raise OpenGroupError(f"finish_batch: groups not complete: {detail}")
        normaliser = batch_normaliser(
            self.algo.loss_agg_mode, state.n_tokens, n_traj, self.algo.loss_scale_constant
        )
        self.acc.finalize(normaliser)
        self._batch = None
        return {"n_tokens": state.n_tokens, "n_traj": n_traj, "normaliser": normaliser, "peak_buffers": state.peak_buffers}


# ---------------------------------------------------------------- async / fully-async


class OffPolicyLearner:
    """One optimizer step per batch of (possibly stale) trajectories: clipped PPO against behavior log-probs.

    GRPO: A_i from each group's members in the batch. OPD: per-token A_t = log π_T − log π_b.
    Same aggregation weights and batch normalisers as the on-policy learner.
    """

    def __init__(self, model: torch.nn.Module, algo: AlgorithmConfig, ref_model: torch.nn.Module | None = None):
        _check_ref(algo, ref_model)
        self.model, self.algo, self.ref_model = model, algo, ref_model
        self.acc = GradAccumulator(_trainable(model))
        self.logprobs = LogprobLedger()

    def train_batch(self, trajs: Sequence[Trajectory], on_phase: PhaseCallback | None = None) -> dict:
        if not trajs:
            raise ValueError("trajs: a batch needs at least one trajectory")
        algo, device = self.algo, _device(self.model)
        adv_by_traj = batch_advantages(trajs, algo.advantage) if algo.objective == "grpo" else {}
        for p in self.acc.params:
            p.grad = None
        n_tokens, n_clipped, backward_s = 0, 0, 0.0
        for traj in trajs:
            owner = f"trajectory {traj.id}"
            t0 = time.monotonic()  # the span covers the trajectory's inputs ... clip statistics
            ids, mask = trajectory_tensors(traj, device)  # (1, T), (T,)
            logp, aux = forward_terms(self.model, self.ref_model, algo, ids)
            logp = logp[0]  # (T,)
            self.logprobs.keep(traj.id, logp)
            behavior = _per_position(traj.behavior_logprobs, traj.loss_mask, "behavior_logprobs", owner, logp.dtype, device)
            if algo.objective == "grpo":
                adv = adv_by_traj[traj.id]
            else:
                teacher = _per_position(traj.teacher_logprobs, traj.loss_mask, "teacher_logprobs", owner, logp.dtype, device)
                adv = teacher - behavior  # (T,)
            terms = clipped_pg_token_loss(logp, behavior, adv, algo.clip_ratio, mask)
            if aux is not None:
                terms = terms + aux[0]
            w = agg_weights(mask, algo.loss_agg_mode, dtype=logp.dtype)
            (w * terms).sum().backward()
            self.acc.add_direct()
            with torch.no_grad():
                rho = torch.exp(logp - behavior)[mask.bool()]
                n_clipped += int(((rho < 1 - algo.clip_ratio) | (rho > 1 + algo.clip_ratio)).sum())
            n_tokens += sum(traj.loss_mask)
            del logp, aux, terms, w, rho
            t1 = time.monotonic()
            backward_s += t1 - t0
            if on_phase:
                on_phase(Kind.BACKWARD, t0, t1, traj.id, traj.group)
        normaliser = batch_normaliser(algo.loss_agg_mode, n_tokens, len(trajs), algo.loss_scale_constant)
        self.acc.finalize(normaliser)
        return {
            "n_tokens": n_tokens,
            "n_traj": len(trajs),
            "normaliser": normaliser,
            "clip_frac": n_clipped / max(n_tokens, 1),
            "backward_s": backward_s,
        }


# ---------------------------------------------------------------- reference


def reference_gradient(
    model: torch.nn.Module, trajs: Sequence[Trajectory], algo: AlgorithmConfig, ref_model: torch.nn.Module | None = None
) -> dict[str, torch.Tensor]:
    """Batch-synchronous on-policy gradient straight from docs/math.md: one loss over the batch, one backward.

    loss = normaliser · Σ_i Σ_t w_{i,t} (ℓ_{i,t} + aux_{i,t}), ℓ = −A_i ρ (GRPO, advantages up front)
    or (stopgrad logp − logp^T) ρ (OPD); no accumulators, no group sums. Each trajectory's forward
    runs at its own length (no padding), as the learner's does, so that in float32 the comparison
    measures the streaming algebra rather than the rounding of differently shaped matmuls (the
    independent audit in ``learner.audit`` does use a padded batch). Does not touch p.grad.
    """
    _check_ref(algo, ref_model)
    if not trajs:
        raise ValueError("trajs: a batch needs at least one trajectory")
    device = _device(model)
    adv_by_traj = batch_advantages(trajs, algo.advantage) if algo.objective == "grpo" else {}
    traj_losses, n_tokens = [], 0
    for traj in trajs:
        ids, mask = trajectory_tensors(traj, device)  # (1, T), (T,)
        logp, aux = forward_terms(model, ref_model, algo, ids)
        logp = logp[0]  # (T,)
        if algo.objective == "grpo":
            terms = pg_token_loss(logp, adv_by_traj[traj.id])
        else:
            owner = f"trajectory {traj.id}"
            terms = opd_token_loss(logp, _per_position(traj.teacher_logprobs, traj.loss_mask, "teacher_logprobs", owner, logp.dtype, device))
        if aux is not None:
            terms = terms + aux[0]
        traj_losses.append((agg_weights(mask, algo.loss_agg_mode, dtype=logp.dtype) * terms).sum())
        n_tokens += int(mask.sum())
    normaliser = batch_normaliser(algo.loss_agg_mode, n_tokens, len(trajs), algo.loss_scale_constant)
    loss = normaliser * torch.stack(traj_losses).sum()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return {n: (torch.zeros_like(p) if g is None else g) for (n, p), g in zip(named, grads)}
