"""Train/inference mismatch and the sampled-version check.

The rollout engine reports, for every sampled token y_t, its behavior log-prob
b_t = log π_engine(y_t | y_<t). The learner recomputes l_t = log π_θ(y_t | y_<t) in its own
forward. With the same weights the two differ only by kernels and precision; with different
weights they differ by the policy change. Per step we report, over the policy tokens whose
turn was sampled by the version the learner holds at the barrier (so the number is the
engine/learner mismatch proper, not staleness):

    mismatch/kl       mean_t k3(r_t),  r_t = exp(l_t − b_t),  k3(r) = (r − 1) − log r  (≥ 0)
                      the unbiased sample estimate of KL(π_engine ‖ π_θ) from y_t ~ π_engine
    mismatch/max_abs  max_t |l_t − b_t|
    mismatch/tokens   how many tokens entered (0 when every turn came from another version,
                      as in async steps after the first; kl and max_abs are then NaN, like
                      any metric with nothing to measure)

``check_sampled_versions`` is the loud half: a turn that says it was sampled by version v,
while the learner holds v, must reproduce the learner's log-probs; if it does not, the
recorded version is wrong (a replica sampled with other weights), and the run stops.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from learner.grad.objectives import compute_dtype, token_logprobs
from learner.timeline import Metric
from learner.trajectory import Trajectory

# |l − b| above this on a same-version token cannot be float32 kernel noise (measured
# ~1e-6 on the tiny model, docs/vllm.md) but is well below one optimizer step's change.
SAME_VERSION_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-3}


class VersionMismatchError(RuntimeError):
    """A trajectory was sampled by another policy version than the one recorded or expected."""


def k3(learner_logp: torch.Tensor, behavior_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(π_b ‖ π_θ): (r − 1) − log r with r = exp(l − b); same shape."""
    log_r = learner_logp - behavior_logp
    return torch.expm1(log_r) - log_r


# The barrier's recompute is bounded by these, not by B × T × V: one forward holds at most
# TOKEN_BUDGET token slots (rows × the longest row), and its logits exist TOKEN_CHUNK positions
# × VOCAB_CHUNK vocabulary entries at a time (fp32: 1024 × 32768 × 4 B = 128 MiB), whatever the
# batch and the vocabulary. Unchunked, 256 rows × 1000 tokens at a 150k vocabulary is ~150 GB.
TOKEN_BUDGET = 16384
TOKEN_CHUNK = 1024
VOCAB_CHUNK = 32768


def _head_and_body(model: torch.nn.Module):
    """(decoder, output projection) when logits are exactly ``head(decoder(ids).last_hidden_state)``
    (a plain Linear head, no logit scaling or soft-capping), else None (the whole forward is used)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None) \
            or getattr(config, "logits_scaling", None):
        return None
    try:
        head, body = model.get_output_embeddings(), model.get_decoder()
    except (AttributeError, NotImplementedError):
        return None
    if type(head) is not torch.nn.Linear or body is None or body is model:
        return None
    return body, head


def _rows_by_budget(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Indices of rows, longest first, in forwards of at most ``budget`` token slots (a row
    longer than the budget goes alone)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def _chunked_target_logprobs(hidden: torch.Tensor, targets: torch.Tensor, head: torch.nn.Linear,
                             token_chunk: int, vocab_chunk: int) -> torch.Tensor:
    """log softmax(head(hidden))[targets] per position, (N,) float64, from (N, H) hidden states
    and (N,) target ids, never holding more than token_chunk × vocab_chunk logits: a running
    log-sum-exp over vocabulary chunks (each chunk's in the compute dtype, as ``token_logprobs``'s
    log_softmax, combined in float64) and the target's logit taken from its chunk."""
    weight, bias = head.weight, head.bias
    vocab, out = weight.shape[0], []
    for n0 in range(0, hidden.shape[0], token_chunk):
        h, y = hidden[n0:n0 + token_chunk], targets[n0:n0 + token_chunk]
        lse = torch.full((h.shape[0],), -math.inf, dtype=torch.float64, device=h.device)
        picked = torch.zeros((h.shape[0],), dtype=torch.float64, device=h.device)
        for v0 in range(0, vocab, vocab_chunk):
            v1 = min(v0 + vocab_chunk, vocab)
            logits = F.linear(h, weight[v0:v1], None if bias is None else bias[v0:v1])  # (n, Vc)
            logits = logits.to(compute_dtype(logits.dtype))
            lse = torch.logaddexp(lse, torch.logsumexp(logits, dim=-1).double())
            inside = (y >= v0) & (y < v1)
            if bool(inside.any()):
                local = (y - v0).clamp(0, v1 - v0 - 1)
                got = logits.gather(-1, local[:, None]).squeeze(-1).double()
                picked = torch.where(inside, got, picked)
            del logits
        out.append(picked - lse)
    return torch.cat(out) if out else torch.zeros((0,), dtype=torch.float64, device=hidden.device)


@torch.no_grad()
def learner_logprobs(model: torch.nn.Module, trajs: Sequence[Trajectory], token_budget: int = TOKEN_BUDGET,
                     token_chunk: int = TOKEN_CHUNK, vocab_chunk: int = VOCAB_CHUNK) -> list[torch.Tensor]:
    """log π_θ(token_t | tokens_<t) per trajectory, (T_i,) float64 on the host (position 0: 0).

    Rows are right-padded into forwards of at most ``token_budget`` token slots (causal:
    padding after a row never changes its earlier positions); a model whose logits are a plain
    Linear over the decoder's last hidden state (HF causal LMs: Llama, Qwen, Mistral) never
    materialises its (B, T, V) logits: ``token_chunk`` positions × ``vocab_chunk`` vocabulary
    entries at a time. Other models run their whole forward per budgeted batch (``token_logprobs``)."""
    if not trajs:
        return []
    device = next(model.parameters()).device
    parts = _head_and_body(model)
    out: list[torch.Tensor | None] = [None] * len(trajs)
    for rows in _rows_by_budget([len(t.input_ids) for t in trajs], token_budget):
        width = max(len(trajs[i].input_ids) for i in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long, device=device)  # (b, T)
        for b, i in enumerate(rows):
            ids[b, :len(trajs[i].input_ids)] = torch.tensor(trajs[i].input_ids, device=device)
        if parts is None:
            logp, _ = token_logprobs(model, ids)  # (b, T)
            for b, i in enumerate(rows):
                out[i] = logp[b, :len(trajs[i].input_ids)].double().cpu()
            continue
        body, head = parts
        hidden = body(input_ids=ids, use_cache=False).last_hidden_state  # (b, T, H)
        lengths = [len(trajs[i].input_ids) for i in rows]
        # position t−1 of row b predicts token t: the real positions of every row, flattened
        at = torch.cat([b * width + torch.arange(n - 1, device=device) for b, n in enumerate(lengths)])
        rows_h = hidden.reshape(-1, hidden.shape[-1]).index_select(0, at)  # (N, H)
        targets = torch.cat([ids[b, 1:n] for b, n in enumerate(lengths)])
        del hidden
        logp = _chunked_target_logprobs(rows_h, targets, head, token_chunk, vocab_chunk).cpu()
        at = 0
        for b, i in enumerate(rows):
            n = lengths[b]
            out[i] = F.pad(logp[at:at + n - 1], (1, 0))
            at += n - 1
    return out  # type: ignore[return-value]


def _same_version_positions(traj: Trajectory, version: int) -> list[int]:
    """Positions of the policy tokens of the turns sampled by ``version``."""
    mask = traj.loss_mask
    return [t for (start, end), v in zip(traj.turn_spans, traj.turn_versions) if v == version
            for t in range(start, end) if mask[t]]


def step_mismatch(model: torch.nn.Module, trajs: Sequence[Trajectory], version: int,
                  tolerance: float | None = None,
                  known: dict[int, torch.Tensor] | None = None,
                  engine_dtype: torch.dtype | None = None) -> dict[str, float]:
    """The step's ``mismatch/*`` metrics against the learner's current weights (= ``version``);
    raises ``VersionMismatchError`` when a same-version token is off by more than ``tolerance``
    (default: SAME_VERSION_TOLERANCE for the model's dtype and the engine's, ``engine_dtype``,
    None: the model's; no check when either is another dtype, where bf16 kernels legitimately
    differ by more: the figures are reported, the run goes on). ``known``: the learner's log-probs per
    trajectory id from its own forward (``LogprobLedger``); only the others are recomputed,
    except those mapped to None (the learner skipped them, A = 0: left out, not forwarded).

    The batch's same-version tokens are compared in one flat tensor: this runs at the barrier,
    on the critical path of on-policy steps (~25 ms per 256 trajectories one by one, here)."""
    dtype = next(model.parameters()).dtype
    tol = tolerance
    if tol is None and (engine_dtype is None or engine_dtype in SAME_VERSION_TOLERANCE):
        tol = SAME_VERSION_TOLERANCE.get(dtype)
    lengths = {t.id: len(t.input_ids) for t in trajs}
    known = known or {}
    logps = {i: lp for i, lp in known.items() if lp is not None and lengths.get(i) == len(lp)}  # whole trajectories
    missing = [t for t in trajs if t.id not in logps and not (t.id in known and known[t.id] is None)]
    logps.update(zip((t.id for t in missing), learner_logprobs(model, missing)))
    owners, learner, behavior = [], [], []  # (first flat index, traj, positions); l_t; b_t
    for traj in trajs:
        positions = _same_version_positions(traj, version) if traj.id in logps else []
        if positions:
            owners.append((len(behavior), traj, positions))
            learner.append(logps[traj.id][torch.tensor(positions)])
            behavior.extend(traj.behavior_logprobs[t] for t in positions)
    if not owners:
        return {Metric.MISMATCH_KL: float("nan"), Metric.MISMATCH_MAX_ABS: float("nan"), Metric.MISMATCH_TOKENS: 0.0}
    learner_t, behavior_t = torch.cat(learner), torch.tensor(behavior, dtype=torch.float64)
    diff = (learner_t - behavior_t).abs()
    worst_at = int(diff.argmax())
    worst = float(diff[worst_at])
    if tol is not None and worst > tol:
        first, traj, positions = owners[bisect.bisect_right([o[0] for o in owners], worst_at) - 1]
        t = positions[worst_at - first]
        turn = next(i for i, (s, e) in enumerate(traj.turn_spans) if s <= t < e)
        raise VersionMismatchError(
            f"trajectory {traj.id} turn {turn}: recorded as sampled by version {version}, but its behavior "
            f"log-prob at position {t} differs from the learner's version-{version} log-prob by {worst:.3g} "
            f"(> {tol:g}); the replica sampled with other weights")
    n = len(behavior)
    return {Metric.MISMATCH_KL: float(k3(learner_t, behavior_t).sum()) / n, Metric.MISMATCH_MAX_ABS: worst, Metric.MISMATCH_TOKENS: float(n)}


def check_sampled_versions(trajs: Sequence[Trajectory], expected: dict[int, int]) -> None:
    """Every turn of a trajectory dispatched for step s was sampled by ``expected[s]``
    (sync/streaming: the version being trained; async: the version the fleet acknowledged
    before the batch was dispatched)."""
    for traj in trajs:
        want = expected.get(traj.step)
        if want is None:
            continue
        for turn, v in enumerate(traj.turn_versions):
            if v != want:
                raise VersionMismatchError(
                    f"trajectory {traj.id} turn {turn}: sampled by version {v}, but step {traj.step} was "
                    f"dispatched to a fleet acknowledged at version {want}")
