"""Unit tests of the docs/math.md formulas in learner.grad.objectives."""

import math

import pytest
import torch

from learner.config import AlgorithmConfig
from learner.checks.exactness import tiny_llama
from learner.grad.objectives import (
    advantages,
    agg_weights,
    batch_normaliser,
    check_algorithm,
    clipped_pg_token_loss,
    group_stats,
    k3_kl,
    opd_token_loss,
    pg_token_loss,
    token_logprobs,
)

torch.set_num_threads(1)


@pytest.mark.parametrize("std", ["unbiased", "population", "none"])
def test_group_of_one_has_zero_advantage(std):
    assert advantages([3.7], std, 1e-6) == [0.0]
    assert advantages([3.7], std, 0.0) == [0.0]  # unbiased n−1 = 0 must not divide by zero


@pytest.mark.parametrize("std", ["unbiased", "population", "none"])
@pytest.mark.parametrize("value", [0.1, 1.0, 100.3, -7.25])
def test_all_equal_rewards_give_exactly_zero(std, value):
    for eps in (1e-6, 0.0):
        assert advantages([value] * 3, std, eps) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("std,correction", [("unbiased", 1), ("population", 0)])
def test_group_stats_match_torch_std(std, correction):
    rewards = [0.3, 1.9, -0.4, 2.2, 100.0]
    mu, denom = group_stats(rewards, std, 1e-6)
    r = torch.tensor(rewards, dtype=torch.float64)
    assert mu == pytest.approx(float(r.mean()), rel=1e-15)
    assert denom == pytest.approx(float(r.std(correction=correction)) + 1e-6, rel=1e-14)
    expected = ((r - r.mean()) / (r.std(correction=correction) + 1e-6)).tolist()
    assert advantages(rewards, std, 1e-6) == pytest.approx(expected, rel=1e-13)


def test_dr_grpo_does_not_divide():
    assert advantages([1.0, 0.0, 0.0, 0.0], "none", 1e-6) == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_group_stats_rejects_bad_input():
    with pytest.raises(ValueError, match="advantage.std"):
        group_stats([1.0, 2.0], "sample", 1e-6)
    with pytest.raises(ValueError, match="rewards"):
        group_stats([], "unbiased", 1e-6)
    with pytest.raises(ValueError, match="finite"):
        group_stats([1.0, math.nan], "unbiased", 1e-6)


def test_agg_weights_per_mode():
    mask = torch.tensor([0, 1, 1, 0, 1, 1])
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"):
        assert torch.equal(agg_weights(mask, mode), mask.double())
    w = agg_weights(mask, "seq-mean-token-mean")
    assert torch.allclose(w, mask.double() / 4) and float(w.sum()) == pytest.approx(1.0)
    assert torch.equal(agg_weights(torch.zeros(4), "seq-mean-token-mean"), torch.zeros(4, dtype=torch.float64))
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_weights(mask, "sum")


def test_batch_normaliser_per_mode():
    assert batch_normaliser("token-mean", 40, 8, 256.0) == 1 / 40
    assert batch_normaliser("seq-mean-token-mean", 40, 8, 256.0) == 1 / 8
    assert batch_normaliser("seq-mean-token-sum", 40, 8, 256.0) == 1 / 8
    assert batch_normaliser("seq-mean-token-sum-norm", 40, 8, 256.0) == 1 / 256
    with pytest.raises(ValueError, match="n_tokens"):
        batch_normaliser("token-mean", 0, 8, 256.0)


def test_k3_is_zero_at_the_reference_and_positive_elsewhere():
    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    assert torch.equal(k3_kl(logp, logp.detach()), torch.zeros(3))
    kl = k3_kl(logp, torch.tensor([-1.5, -1.0, -0.5]))
    assert (kl[:2] > 0).all() and kl[2] == 0
    kl.sum().backward()  # ∂/∂logp = 1 − exp(ref − logp)
    assert torch.allclose(logp.grad, 1 - torch.exp(torch.tensor([-0.5, 1.0, 0.0])))


def test_pg_and_opd_gradients_are_score_function_forms():
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    pg_token_loss(logp, 0.5).sum().backward()
    assert torch.equal(logp.grad, torch.tensor([-0.5, -0.5]))  # −A ∇log π
    logp.grad = None
    teacher = torch.tensor([-0.3, -2.5])
    loss = opd_token_loss(logp, teacher)
    assert torch.allclose(loss, logp.detach() - teacher)
    loss.sum().backward()
    assert torch.allclose(logp.grad, logp.detach() - teacher)  # (log π_b − log π_T) ∇log π


def test_clipped_loss_equals_pg_on_policy_and_clips_off_policy():
    logp = torch.tensor([-1.0, -2.0, -0.7], requires_grad=True)
    mask = torch.tensor([1, 1, 1])
    clipped_pg_token_loss(logp, logp.detach(), 0.8, 0.2, mask).sum().backward()
    assert torch.allclose(logp.grad, torch.full((3,), -0.8))
    logp.grad = None
    behavior = logp.detach() - torch.tensor([0.0, 0.5, -0.5])  # ρ = 1, e^0.5 (> 1.2), e^−0.5 (< 0.8)
    clipped_pg_token_loss(logp, behavior, 1.0, 0.2, mask).sum().backward()
    # A > 0: the ρ > 1+c token is clipped (no gradient); the ρ < 1−c one keeps −A ρ ∇log π.
    assert torch.allclose(logp.grad, torch.tensor([-1.0, 0.0, -math.exp(-0.5)]))


def test_opd_rejects_per_sequence_token_mean():
    with pytest.raises(ValueError, match="algorithm.loss_agg_mode"):
        check_algorithm(AlgorithmConfig(objective="opd", loss_agg_mode="seq-mean-token-mean"))


@pytest.mark.parametrize("dtype,expected", [(torch.float64, torch.float64), (torch.bfloat16, torch.float32)])
def test_token_logprobs_shift_and_dtype(dtype, expected):
    model = tiny_llama(dtype, seed=3)
    ids = torch.tensor([[1, 5, 9, 2, 7], [3, 3, 4, 0, 31]])
    logp, entropy = token_logprobs(model, ids, with_entropy=True)
    assert logp.shape == entropy.shape == (2, 5) and logp.dtype == entropy.dtype == expected
    assert torch.equal(logp[:, 0], torch.zeros(2, dtype=expected))
    dist = torch.log_softmax(model(ids).logits.to(expected), -1)  # (B, T, V)
    assert torch.allclose(logp[1, 3], dist[1, 2, 0]) and torch.allclose(logp[0, 4], dist[0, 3, 7])
    assert torch.allclose(entropy[0, 2], -(dist[0, 1].exp() * dist[0, 1]).sum())
    with pytest.raises(ValueError, match="input_ids"):
        token_logprobs(model, ids[0])
