"""The barrier's train/inference mismatch metrics and same-version guard (learner.grad.mismatch)."""

import math
import random

import pytest
import torch

from learner.grad.mismatch import VersionMismatchError, k3, step_mismatch
from learner.trajectory import Trajectory

VERSION = 3


def _batch(seed: int = 0, n: int = 12) -> tuple[list[Trajectory], dict[int, torch.Tensor]]:
    """Trajectories of two or three turns, some turns sampled by an older version; behavior
    log-probs a little off the learner's (kernel noise)."""
    rng = random.Random(seed)
    trajs, known = [], {}
    for i in range(n):
        ids, mask, spans, versions = [1] * 5, [0] * 5, [], []
        for turn in range(rng.randint(2, 3)):
            start = len(ids)
            ids += [rng.randint(2, 50) for _ in range(rng.randint(2, 6))]
            mask += [1] * (len(ids) - start)
            spans.append((start, len(ids)))
            versions.append(VERSION if turn or i % 3 else VERSION - 1)
            ids += [7, 8]  # observation tokens: never compared
            mask += [0, 0]
        learner = [rng.uniform(-4.0, -0.1) for _ in ids]
        behavior = [lp + rng.uniform(-1e-4, 1e-4) if m else 0.0 for lp, m in zip(learner, mask)]
        trajs.append(Trajectory(id=i, group=i // 4, step=0, input_ids=ids, loss_mask=mask, behavior_logprobs=behavior,
                                turn_versions=versions, turn_spans=spans))
        known[i] = torch.tensor(learner, dtype=torch.float64)
    return trajs, known


def _one_by_one(trajs, known) -> tuple[float, float, int]:
    """The definition, token by token: mean k3 and max |l - b| over same-version policy tokens."""
    kl, worst, n = 0.0, 0.0, 0
    for traj in trajs:
        for (start, end), v in zip(traj.turn_spans, traj.turn_versions):
            for t in range(start, end):
                if v == VERSION and traj.loss_mask[t]:
                    l_t, b_t = float(known[traj.id][t]), traj.behavior_logprobs[t]
                    kl += float(k3(torch.tensor(l_t, dtype=torch.float64), torch.tensor(b_t, dtype=torch.float64)))
                    worst, n = max(worst, abs(l_t - b_t)), n + 1
    return kl / n, worst, n


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_flat_comparison_matches_the_definition(seed):
    trajs, known = _batch(seed)
    m = step_mismatch(torch.nn.Linear(2, 2), trajs, VERSION, known=known)
    kl, worst, n = _one_by_one(trajs, known)
    assert m["mismatch/tokens"] == n > 0
    assert m["mismatch/max_abs"] == pytest.approx(worst, rel=1e-12)
    assert m["mismatch/kl"] == pytest.approx(kl, rel=1e-9)


def test_a_trajectory_the_learner_skipped_is_left_out_not_forwarded():
    trajs, known = _batch()
    skipped = trajs[3]
    known[skipped.id] = None  # A = 0: the learner never forwarded it (LogprobLedger.skip)
    m = step_mismatch(torch.nn.Linear(2, 2), trajs, VERSION, known=known)  # a Linear cannot forward ids
    rest = {i: lp for i, lp in known.items() if lp is not None}
    assert m["mismatch/tokens"] == _one_by_one([t for t in trajs if t.id in rest], rest)[2]


def test_no_same_version_token_gives_nan():
    trajs, known = _batch()
    m = step_mismatch(torch.nn.Linear(2, 2), trajs, VERSION + 1, known=known)
    assert m["mismatch/tokens"] == 0 and math.isnan(m["mismatch/kl"]) and math.isnan(m["mismatch/max_abs"])


def test_a_token_off_by_more_than_the_tolerance_names_its_trajectory_turn_and_position():
    trajs, known = _batch()
    traj = trajs[7]
    start, end = traj.turn_spans[1]
    traj.behavior_logprobs[start + 1] -= 0.5  # a replica that sampled with other weights
    with pytest.raises(VersionMismatchError, match=rf"trajectory 7 turn 1: .* position {start + 1} differs .* by 0\.5"):
        step_mismatch(torch.nn.Linear(2, 2), trajs, VERSION, known=known)
    # the same offset on a turn of an older version is staleness, not an error
    old = trajs[0]
    assert old.turn_versions[0] == VERSION - 1
    old.behavior_logprobs[old.turn_spans[0][0]] -= 0.5
    traj.behavior_logprobs[start + 1] += 0.5
    assert step_mismatch(torch.nn.Linear(2, 2), trajs, VERSION, known=known)["mismatch/max_abs"] < 1e-3
