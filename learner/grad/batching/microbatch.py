"""Padded micro-batches under a token budget: one forward and one backward for many rows (docs/learner.md).

A *row* is what one trajectory contributes to one backward: the tokens forwarded, the
positions in the loss, and what weights them (GRPO: the advantage, known or 1 for a group's
running sums; OPD: the teacher's log-probs; off-policy: the behavior log-probs). Rows are
right-padded to the longest row of their micro-batch: position ids stay 0..T−1 for every real
token and, attention being causal, no real token attends to padding; padded positions have
loss weight 0. ``plan_micro_batches`` takes rows longest first while rows × longest row ≤
``train.micro_batch_tokens`` (verl's and TRL's token budget; a row longer than the budget goes
alone).

    loss(micro-batch) = Σ_rows Σ_t w_{i,t} (pg_{i,t} + aux_{i,t})          (B, T) → scalar

with w the aggregation weights of ``learner.grad.objectives.agg_weights`` and the batch
normaliser applied once at the barrier, as everywhere. Gradients come from
``torch.autograd.grad`` and go to the caller's accumulator; ``p.grad`` is never touched.
"""

from __future__ import annotations

import array
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from learner.config import AlgorithmConfig
from learner.grad.objectives import (
    agg_weights,
    aux_token_loss,
    clipped_pg_token_loss,
    k3_kl,
    opd_token_loss,
    pg_token_loss,
    token_logprobs,
)
from learner.grad.batching.packing import Layout, layout
from learner.grad.batching.shared_prompt import PastInputs
from learner.trajectory import ScoredTurn, Trajectory
from learner.registries.objectives import objective as objective_of

PAD_ID = 0  # any valid id: padded positions are masked out of attention and loss


@dataclass
class Row:
    traj: int
    group: int
    ids: list[int]  # tokens forwarded
    mask: list[int]  # 1 where the token is in this row's loss
    adv: float = 1.0  # on-policy GRPO: the coefficient of −ρ (A_i, or 1 for a running-sum member)
    teacher: list[float] | None = None  # OPD: teacher log-prob per position (0 where mask is 0)
    behavior: list[float] | None = None  # off-policy: behavior log-prob per position (0 where mask is 0)
    prompt: int = 0  # tokens of its group's shared prompt cut off the front (learner/grad/batching/shared_prompt.py)

    @property
    def n_scored(self) -> int:
        return sum(self.mask)


# ---------------------------------------------------------------- records → rows


def check_trajectory(traj: Trajectory) -> None:
    """input_ids and loss_mask consistent; raises ValueError naming the trajectory and field."""
    n = len(traj.input_ids)
    if n == 0:
        raise ValueError(f"trajectory {traj.id}: input_ids is empty")
    if len(traj.loss_mask) != n:
        raise ValueError(f"trajectory {traj.id}: loss_mask has {len(traj.loss_mask)} entries for {n} input_ids")
    if not set(traj.loss_mask) <= {0, 1}:
        raise ValueError(f"trajectory {traj.id}: loss_mask entries must be 0 or 1")
    if traj.loss_mask[0]:
        raise ValueError(f"trajectory {traj.id}: loss_mask[0] is 1 but position 0 has no preceding token")
    check_ids(traj.input_ids, f"trajectory {traj.id}: input_ids")


def check_ids(values: Sequence[int], what: str) -> None:
    try:
        array.array("q", values)
    except (TypeError, OverflowError) as err:
        raise ValueError(f"{what}: must be a list of int64 values ({err})") from None


def per_position(values: Sequence[float | None] | None, mask: Sequence[int], what: str, owner: str) -> list[float]:
    """A per-position log-prob list, required and finite where mask is 1, 0.0 elsewhere."""
    if values is None:
        raise ValueError(f"{owner}: {what} is missing")
    if len(values) != len(mask):
        raise ValueError(f"{owner}: {what} has {len(values)} entries for {len(mask)} positions")
    out = []
    for t, (m, v) in enumerate(zip(mask, values)):
        if m and (v is None or not math.isfinite(v)):
            raise ValueError(f"{owner}: {what}[{t}] must be a finite log-prob for a scored token, got {v}")
        out.append(float(v) if m else 0.0)
    return out


def grpo_row(traj: Trajectory, adv: float) -> Row:
    check_trajectory(traj)
    return Row(traj.id, traj.group, list(traj.input_ids), list(traj.loss_mask), adv=adv)


def off_policy_row(traj: Trajectory, objective: str) -> Row:
    """Row of the clipped off-policy loss; GRPO's advantage is set by the caller (``row.adv``)."""
    check_trajectory(traj)
    owner = f"trajectory {traj.id}"
    behavior = per_position(traj.behavior_logprobs, traj.loss_mask, "behavior_logprobs", owner)
    teacher = (per_position(traj.teacher_logprobs, traj.loss_mask, "teacher_logprobs", owner)
               if objective_of(objective).teacher_scored else None)
    return Row(traj.id, traj.group, list(traj.input_ids), list(traj.loss_mask), teacher=teacher, behavior=behavior)


def check_turn(turn: ScoredTurn) -> None:
    owner = f"turn {turn.turn} of trajectory {turn.traj}"
    start, end = turn.turn_span
    if not 1 <= start < end <= len(turn.input_ids):
        raise ValueError(f"{owner}: turn_span {turn.turn_span} must satisfy 1 <= start < end <= {len(turn.input_ids)}")
    check_ids(turn.input_ids, f"{owner}: input_ids")
    per_position(turn.teacher_logprobs, [1] * (end - start), "teacher_logprobs", owner)


def opd_row(turns: Sequence[ScoredTurn]) -> Row:
    """One row for scored turns of one trajectory: a forward over the longest prefix, the loss on
    every turn's tokens (causal attention: a token's log-prob is the same in any longer prefix)."""
    turns = sorted(turns, key=lambda t: t.turn_span[1])
    ids = list(turns[-1].input_ids[: turns[-1].turn_span[1]])
    mask, teacher = [0] * len(ids), [0.0] * len(ids)
    for turn in turns:
        start, end = turn.turn_span
        if list(turn.input_ids[:end]) != ids[:end]:
            raise ValueError(f"turn {turn.turn} of trajectory {turn.traj}: input_ids are not a prefix of its "
                             "trajectory's later turns")
        for t, v in zip(range(start, end), turn.teacher_logprobs):
            mask[t], teacher[t] = 1, float(v)
    return Row(turns[0].traj, turns[0].group, ids, mask, teacher=teacher)


# ---------------------------------------------------------------- planning and padding


class MicroBatchRows(list):
    """The rows of one planned micro-batch; packed: in line order, with the width of its lines."""

    def __init__(self, rows: Sequence[Row] = (), line_width: int | None = None):
        super().__init__(rows)
        self.line_width = line_width


def plan_micro_batches(rows: Sequence[Row], budget: int, pack: bool = False) -> list[MicroBatchRows]:
    """Longest first, each micro-batch as many rows as fit rows × longest ≤ ``budget`` (at least
    one). ``pack``: every row first-fit into lines as wide as the longest row of all (short rows
    fill the room long ones leave), ⌊budget / width⌋ lines per micro-batch (at least one); the
    padded plan where that has fewer token slots (a small budget, where padded micro-batches of
    short rows are narrower)."""
    ordered = sorted(rows, key=lambda r: -len(r.ids))
    padded: list[MicroBatchRows] = []
    for row in ordered:
        if padded and (len(padded[-1]) + 1) * len(padded[-1][0].ids) <= budget:
            padded[-1].append(row)
        else:
            padded.append(MicroBatchRows([row]))
    if not (pack and ordered):
        return padded
    width = len(ordered[0].ids)
    grid = layout([len(r.ids) for r in ordered], width)
    if grid.slots >= sum(len(part) * len(part[0].ids) for part in padded):
        return padded
    lines: list[list[Row]] = [[] for _ in range(grid.lines)]
    for row, (line, _) in zip(ordered, grid.places):
        lines[line].append(row)
    per = max(1, budget // width)
    return [MicroBatchRows([r for line in lines[k:k + per] for r in line], width) for k in range(0, len(lines), per)]


@dataclass
class Forward:
    """A micro-batch's forward: log-probs with their graph and the per-token terms, all (B, T) on
    the micro-batch's grid (``layout``: a row per line, right-padded, or rows packed into lines)."""

    rows: list[Row]
    layout: Layout
    logp: torch.Tensor  # (B, T)
    aux: torch.Tensor | None  # (B, T) KL/entropy terms, or None when both are off
    mask: torch.Tensor  # (B, T) 0/1 in the log-prob dtype
    w: torch.Tensor  # (B, T) aggregation weights (0 on padding)
    # detached, for the step's metrics (``stats``): entropy at the scored tokens, k3 KL to the reference
    entropy: torch.Tensor | None = None  # (B, T), NaN where not taken (learner.grad.objectives.detached_entropy)
    kl: torch.Tensor | None = None  # (B, T), only with a reference (algorithm.kl_coef > 0)

    def per_position(self, field: str) -> torch.Tensor:
        return self.layout.place([getattr(r, field) for r in self.rows], self.logp.dtype, self.logp.device)

    def per_row(self, field: str) -> torch.Tensor:
        """A per-row value (GRPO's ``adv``) at each of its row's positions."""
        values = [[getattr(r, field)] * len(r.ids) for r in self.rows]
        return self.layout.place(values, self.logp.dtype, self.logp.device)

    def row_logp(self, k: int) -> torch.Tensor:
        """Row k's log-probs (T_k,), as a forward of that row alone gives them (0 on a cut prompt)."""
        values = self.layout.row_values(self.logp, k)
        return F.pad(values, (self.rows[k].prompt, 0)) if self.rows[k].prompt else values


def forward(model: torch.nn.Module, ref_model: torch.nn.Module | None, algo: AlgorithmConfig,
            rows: Sequence[Row], line_width: int | None = None, stats: bool = False,
            past: PastInputs | None = None, grid: Layout | None = None) -> Forward:
    """One forward of ``rows``: right-padded with an attention mask (none for a single row: nothing
    is padded), or with a ``line_width`` packed into lines of that width, position ids restarting
    per row (``learner.grad.batching.packing``); with ``past`` (rows cut after their shared prompts,
    right-padded) attending to the prompts' keys/values, positions continuing after them.
    ``stats``: also the detached entropy and KL the step's metrics read (``learner.grad.loss_tally``),
    from this forward's own log-softmax."""
    device = next(model.parameters()).device
    rows = list(rows)
    if grid is None:  # ``grid``: a packed layout of these rows in this order chosen by the caller
        grid = layout([len(r.ids) for r in rows], None if past is not None else line_width)
    ids = grid.place([r.ids for r in rows], torch.long, device)  # (B, T)
    attn = positions = None
    if past is not None:
        own = grid.place([[1] * len(r.ids) for r in rows], torch.long, device)  # (B, T)
        attn = torch.cat([past.prompt_mask, own], dim=1)  # (B, L + T)
        positions = past.offsets[:, None] + torch.arange(grid.width, device=device)[None]  # (B, T)
    elif grid.shares_lines:
        positions = grid.positions(device)  # (B, T)
    elif len(rows) > 1:
        attn = grid.place([[1] * len(r.ids) for r in rows], torch.long, device)  # (B, T)
    mask = grid.place([r.mask for r in rows], torch.long, device)  # (B, T)
    with_entropy = algo.entropy_coef > 0
    logp, entropy = token_logprobs(model, ids, with_entropy=with_entropy, attention_mask=attn,
                                   position_ids=positions, entropy_at=mask if stats and not with_entropy else None,
                                   past_key_values=past and past.cache)
    ref_logp = None
    if algo.kl_coef > 0 and ref_model is not None:
        with torch.no_grad():
            ref_logp = token_logprobs(ref_model, ids, attention_mask=attn, position_ids=positions,
                                      past_key_values=past and past.ref_cache)[0].to(logp.dtype)
    aux = aux_token_loss(logp, entropy if with_entropy else None, ref_logp, algo.kl_coef, algo.entropy_coef)
    mask = mask.to(logp.dtype)
    if grid.shares_lines and algo.loss_agg_mode == "seq-mean-token-mean":  # 1/|o_i| per row, not per line
        scored = grid.place([[max(r.n_scored, 1)] * len(r.ids) for r in rows], logp.dtype, device)
        w = mask / scored.clamp(min=1.0)
    else:
        w = agg_weights(mask, algo.loss_agg_mode, dtype=logp.dtype)
    fwd = Forward(rows, grid, logp, aux, mask, w)
    if stats:
        # with an entropy term its own H at every scored token
        fwd.entropy = torch.where(mask > 0, entropy.detach(), math.nan) if with_entropy else entropy
        fwd.kl = None if ref_logp is None else k3_kl(logp.detach(), ref_logp)
    return fwd


def on_policy_pg_loss(fwd: Forward, objective: str) -> torch.Tensor:
    """Σ w·pg: GRPO −A_i ρ per row (A_i = ``row.adv``); OPD (stopgrad logp − logp^T) ρ."""
    if objective_of(objective).teacher_scored:
        return (fwd.w * opd_token_loss(fwd.logp, fwd.per_position("teacher"))).sum()
    return (fwd.w * pg_token_loss(fwd.logp, fwd.per_row("adv"))).sum()


def off_policy_loss(fwd: Forward, objective: str, clip: float) -> tuple[torch.Tensor, int]:
    """Σ w·(clipped PPO + aux) and the number of scored tokens whose ratio is outside the clip range."""
    behavior = fwd.per_position("behavior")
    if objective_of(objective).teacher_scored:
        adv = fwd.per_position("teacher") - behavior  # (B, T) per-token A_t = log π_T − log π_b
    else:
        adv = fwd.per_row("adv")
    terms = clipped_pg_token_loss(fwd.logp, behavior, adv, clip, fwd.mask)
    if fwd.aux is not None:
        terms = terms + fwd.aux
    with torch.no_grad():
        rho = torch.exp(fwd.logp - behavior)[fwd.mask.bool()]
        clipped = int(((rho < 1 - clip) | (rho > 1 + clip)).sum())
    return (fwd.w * terms).sum(), clipped


def grads_of(loss: torch.Tensor, params: Sequence[torch.nn.Parameter], retain: bool = False) -> list:
    return list(torch.autograd.grad(loss, params, retain_graph=retain, allow_unused=True))


def split_grads(pg: torch.Tensor, aux: torch.Tensor | None, params: Sequence[torch.nn.Parameter],
                one_pass: bool) -> tuple[list, list | None]:
    """∇pg and ∇aux separately (they go to different accumulators). ``one_pass``: one batched
    vector-Jacobian product with the two cotangents (1, 0) and (0, 1), a single traversal of the
    graph; otherwise two backward passes (the first keeping the graph)."""
    if aux is None:
        return grads_of(pg, params), None
    if not one_pass:
        return grads_of(pg, params, retain=True), grads_of(aux, params)
    eye = torch.eye(2, dtype=pg.dtype, device=pg.device)
    both = torch.autograd.grad(torch.stack([pg, aux]), params, grad_outputs=eye, is_grads_batched=True,
                               allow_unused=True)
    return [None if g is None else g[0] for g in both], [None if g is None else g[1] for g in both]
