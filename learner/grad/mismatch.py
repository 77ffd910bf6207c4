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
from collections.abc import Sequence

import torch

from learner.grad.objectives import token_logprobs
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


@torch.no_grad()
def learner_logprobs(model: torch.nn.Module, trajs: Sequence[Trajectory]) -> list[torch.Tensor]:
    """log π_θ(token_t | tokens_<t) per trajectory, (T_i,) float64, from one right-padded
    forward (causal: padding after a row never changes its earlier positions)."""
    if not trajs:
        return []
    device = next(model.parameters()).device
    width = max(len(t.input_ids) for t in trajs)
    ids = torch.zeros((len(trajs), width), dtype=torch.long, device=device)  # (B, T)
    for b, t in enumerate(trajs):
        ids[b, :len(t.input_ids)] = torch.tensor(t.input_ids, device=device)
    logp, _ = token_logprobs(model, ids)  # (B, T)
    return [logp[b, :len(t.input_ids)].double().cpu() for b, t in enumerate(trajs)]


def _same_version_positions(traj: Trajectory, version: int) -> list[int]:
    """Positions of the policy tokens of the turns sampled by ``version``."""
    mask = traj.loss_mask
    return [t for (start, end), v in zip(traj.turn_spans, traj.turn_versions) if v == version
            for t in range(start, end) if mask[t]]


def step_mismatch(model: torch.nn.Module, trajs: Sequence[Trajectory], version: int,
                  tolerance: float | None = None,
                  known: dict[int, torch.Tensor] | None = None) -> dict[str, float]:
    """The step's ``mismatch/*`` metrics against the learner's current weights (= ``version``);
    raises ``VersionMismatchError`` when a same-version token is off by more than ``tolerance``
    (default: SAME_VERSION_TOLERANCE for the model's dtype; no check for other dtypes, where
    bf16 kernels legitimately differ by more). ``known``: the learner's log-probs per
    trajectory id from its own forward (``LogprobLedger``); only the others are recomputed,
    except those mapped to None (the learner skipped them, A = 0: left out, not forwarded).

    The batch's same-version tokens are compared in one flat tensor: this runs at the barrier,
    on the critical path of on-policy steps (~25 ms per 256 trajectories one by one, here)."""
    dtype = next(model.parameters()).dtype
    tol = tolerance if tolerance is not None else SAME_VERSION_TOLERANCE.get(dtype)
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
