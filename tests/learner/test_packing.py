"""Rows packed into micro-batch lines (``learner.pack_rows``, learner/grad/batching/packing.py): the layout,
the per-row log-probs against a forward of each row alone, and the learners' gradients."""

import random
from collections import Counter

import pytest
import torch

from learner.config import AlgorithmConfig
from learner.checks.exactness import random_batch, relative_error, tiny_llama
from learner.grad.learners.common import LearnerOptions
from learner.grad.batching.microbatch import Row, forward, plan_micro_batches
from learner.grad.learners.off_policy import OffPolicyLearner
from learner.grad.learners.on_policy import StreamingLearner
from learner.grad.batching.packing import layout
from learner.grad.reference import reference_gradient


def test_short_rows_share_a_line_as_wide_as_the_longest():
    grid = layout([6, 4, 2, 3, 1], 6)
    assert (grid.lines, grid.width) == (3, 6)
    assert grid.places == ((0, 0), (1, 0), (1, 4), (2, 0), (2, 3))
    assert grid.padded_slots == 2
    assert grid.positions(torch.device("cpu"))[1].tolist() == [0, 1, 2, 3, 0, 1]
    assert layout([6, 4, 2]).padded_slots == 6


def test_packed_plan_fits_more_rows_in_the_same_budget():
    rows = [Row(k, 0, [1] * n, [0] + [1] * (n - 1)) for k, n in enumerate([8, 4, 4, 2, 2])]
    assert [len(b) for b in plan_micro_batches(rows, 24)] == [3, 2]
    assert [len(b) for b in plan_micro_batches(rows, 24, pack=True)] == [5]  # 8 | 4 4 | 2 2


def test_each_rows_log_probs_are_those_of_a_forward_of_it_alone():
    model = tiny_llama(torch.float64, 0)
    rng = random.Random(1)
    rows = [Row(k, 0, [rng.randrange(32) for _ in range(n)], [0] * n) for k, n in enumerate([9, 5, 3, 4, 1])]
    fwd = forward(model, None, AlgorithmConfig(), rows, line_width=9)
    assert fwd.layout.shares_lines
    for k, row in enumerate(rows):
        alone = forward(model, None, AlgorithmConfig(), [row]).logp[0]
        assert torch.allclose(fwd.row_logp(k), alone, atol=1e-12, rtol=0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("path", ["micro-batched", "adaptive"])
def test_packed_learners_give_the_batch_gradient_with_less_padding(path, mode):
    rng = random.Random(5)
    model, ref = tiny_llama(torch.float64, 1), tiny_llama(torch.float64, 2)
    algo = AlgorithmConfig(kl_coef=0.1, entropy_coef=0.05, loss_agg_mode=mode)
    trajs = random_batch(rng) + [t for t in random_batch(random.Random(6))]
    for k, t in enumerate(trajs):
        t.id, t.group = k, t.group + (10 if k >= len(trajs) // 2 else 0)
    shares = {}
    for pack in (False, True):
        learner = StreamingLearner(model, algo, ref, LearnerOptions(path, micro_batch_tokens=4096, pack_rows=pack))
        learner.begin_batch(dict(Counter(t.group for t in trajs)))
        learner.learn(trajs)
        shares[pack] = learner.finish_batch()["padding_share"]
        got = {n: p.grad for n, p in model.named_parameters()}
        assert relative_error(got, reference_gradient(model, trajs, algo, ref)) < 1e-12
    assert shares[True] < shares[False]


def test_the_off_policy_learner_packs_exactly_too():
    rng = random.Random(7)
    model = tiny_llama(torch.float64, 3)
    algo = AlgorithmConfig()
    trajs = random_batch(rng)
    grads = []
    for pack in (False, True):
        OffPolicyLearner(model, algo, options=LearnerOptions("micro-batched", 64, pack_rows=pack)).train_batch(trajs)
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert relative_error(grads[1], grads[0]) < 1e-12
