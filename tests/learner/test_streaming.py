"""GradAccumulator invariants and the StreamingLearner / OffPolicyLearner contracts."""

import random

import pytest
import torch

from learner.config import AdvantageConfig, AlgorithmConfig
from learner.checks.exactness import random_batch, relative_error, scored_turns, tiny_llama
from learner.grad.learners.common import LearnerOptions
from learner.grad.learners.off_policy import OffPolicyLearner
from learner.grad.learners.on_policy import StreamingLearner
from learner.grad.reference import reference_gradient
from learner.grad.objectives import advantages, group_stats, token_logprobs
from learner.grad.accumulator import GradAccumulator, OpenGroupError

torch.set_num_threads(1)


def chosen(grad: torch.Tensor) -> list[torch.Tensor]:
    """A one-parameter gradient list chosen by the test (stands in for torch.autograd.grad)."""
    return [grad.clone()]


def test_buffer_count_is_one_plus_two_per_open_group():
    p = torch.nn.Parameter(torch.zeros(3))
    acc = GradAccumulator([p])
    assert acc.buffer_count() == 1
    for k, group in enumerate(("a", "b", "c"), start=1):
        acc.open_group(group)
        assert acc.buffer_count() == 1 + 2 * k
    for group in ("a", "b", "c"):
        acc.add_to_group(group, 1.0, chosen(torch.ones(3)))
    acc.close_group("b", *group_stats([1.0], "unbiased", 1e-6))
    assert acc.buffer_count() == 1 + 2 * 2 and acc.open_groups == ["a", "c"]


def test_finalize_with_an_open_group_raises_naming_it():
    p = torch.nn.Parameter(torch.zeros(2))
    acc = GradAccumulator([p])
    acc.open_group(7)
    acc.add_to_group(7, 0.0, chosen(torch.ones(2)))
    with pytest.raises(OpenGroupError, match="7"):
        acc.finalize(1.0)


def test_group_close_equals_sum_of_advantage_weighted_gradients():
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    acc = GradAccumulator([p])
    gen = torch.Generator().manual_seed(0)
    rewards = [0.3, 1.2, -0.7, 0.3]
    hs = [torch.randn(4, generator=gen, dtype=torch.float64) for _ in rewards]
    acc.open_group("g")
    for r, h in zip(rewards, hs):
        acc.add_to_group("g", r, chosen(h))
    acc.add_direct(chosen(torch.full((4,), 2.0, dtype=torch.float64)), scale=0.5)
    acc.close_group("g", *group_stats(rewards, "population", 1e-6))
    acc.finalize(0.25)
    expected = 0.25 * (sum(a * h for a, h in zip(advantages(rewards, "population", 1e-6), hs)) + 1.0)
    assert torch.allclose(p.grad, expected, rtol=1e-14, atol=0)


def test_all_equal_group_adds_exactly_zero():
    p = torch.nn.Parameter(torch.zeros(3))
    acc = GradAccumulator([p])
    acc.open_group(0)
    for h in (torch.randn(3), torch.randn(3), torch.randn(3)):
        acc.add_to_group(0, 0.1, chosen(h))
    acc.close_group(0, *group_stats([0.1] * 3, "unbiased", 1e-6))
    acc.finalize(1.0)
    assert torch.equal(p.grad, torch.zeros(3))


def test_shifted_sum_survives_a_large_reward_offset_in_float32():
    """Rewards 1000 + noise: T_k − μ S_k unshifted would cancel ~7 digits of float32."""
    p = torch.nn.Parameter(torch.zeros(64))
    acc = GradAccumulator([p])
    gen = torch.Generator().manual_seed(1)
    rewards = (1000.0 + 0.01 * torch.randn(8, generator=gen, dtype=torch.float64)).tolist()
    hs = [torch.randn(64, generator=gen, dtype=torch.float64) for _ in rewards]
    acc.open_group(0)
    for r, h in zip(rewards, hs):
        acc.add_to_group(0, r, chosen(h))
    acc.close_group(0, *group_stats(rewards, "unbiased", 1e-6))
    acc.finalize(1.0)
    exact = sum(a * h for a, h in zip(advantages(rewards, "unbiased", 1e-6), hs))
    assert float((p.grad.double() - exact).norm() / exact.norm()) < 1e-6


def test_accumulators_are_fp32_for_bf16_and_fp64_for_fp64():
    assert GradAccumulator([torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))]).dtype == torch.float32
    assert GradAccumulator([torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))]).dtype == torch.float64
    p = torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))
    acc = GradAccumulator([p])
    acc.add_direct(chosen(torch.ones(2)))
    acc.finalize(0.5)
    assert p.grad.dtype == torch.bfloat16 and torch.equal(p.grad.float(), torch.full((2,), 0.5))


def small_batch(seed: int):
    return random_batch(random.Random(seed))


def test_streaming_learner_reports_phases_and_refuses_an_incomplete_batch():
    model = tiny_llama(torch.float32, seed=0)
    trajs = small_batch(0)
    learner = StreamingLearner(model, AlgorithmConfig(), options=LearnerOptions(path="per-trajectory"))
    sizes = {g: sum(t.group == g for t in trajs) for g in {t.group for t in trajs}}
    learner.begin_batch(sizes)
    phases = []
    stats = learner.on_trajectory(trajs[0], on_phase=lambda *a: phases.append(a))
    assert phases[0][0] == "learner.backward" and phases[0][3:] == (trajs[0].id, trajs[0].group)
    assert phases[0][1] <= phases[0][2] and stats["n_tokens"] == trajs[0].n_scored and not stats["groups_closed"]
    with pytest.raises(ValueError, match="already fed"):
        learner.on_trajectory(trajs[0])
    with pytest.raises(OpenGroupError, match=f"{trajs[0].group} \\(1/"):
        learner.finish_batch()
    for traj in trajs[1:]:
        stats = learner.on_trajectory(traj, on_phase=lambda *a: phases.append(a))
    assert stats["groups_closed"] == 1 and "learner.group_close" in [p[0] for p in phases[-2:]]
    result = learner.finish_batch()
    assert result["n_traj"] == len(trajs) and result["n_tokens"] == sum(t.n_scored for t in trajs)
    assert all(p.grad is not None for p in model.parameters())


def test_streaming_learner_rejects_bad_calls():
    model = tiny_llama(torch.float32, seed=0)
    with pytest.raises(ValueError, match="ref_model"):
        StreamingLearner(model, AlgorithmConfig(kl_coef=0.1))
    learner = StreamingLearner(model, AlgorithmConfig())
    traj = small_batch(1)[0]
    with pytest.raises(RuntimeError, match="begin_batch"):
        learner.on_trajectory(traj)
    learner.begin_batch({traj.group + 100: 2})
    with pytest.raises(ValueError, match="not in this batch"):
        learner.on_trajectory(traj)
    with pytest.raises(RuntimeError, match="not finished"):
        learner.begin_batch({traj.group: 1})
    with pytest.raises(ValueError, match="group_sizes"):
        StreamingLearner(model, AlgorithmConfig()).begin_batch({0: 0})


def test_opd_trajectory_end_checks_all_its_turns_arrived():
    model = tiny_llama(torch.float32, seed=0)
    traj = next(t for t in small_batch(2) if len(t.turn_spans) > 1)
    learner = StreamingLearner(model, AlgorithmConfig(objective="opd"))
    learner.begin_batch({traj.group: 1})
    learner.on_turn(scored_turns(traj)[0])
    with pytest.raises(ValueError, match="scored tokens arrived"):
        learner.on_trajectory(traj)


@pytest.mark.parametrize("objective", ["grpo", "opd"])
def test_off_policy_learner_equals_reference_at_zero_staleness(objective):
    """Behavior log-probs = the current policy's: ρ = 1, clipping inactive, same gradient as sync."""
    model = tiny_llama(torch.float64, seed=4)
    algo = AlgorithmConfig(objective=objective, advantage=AdvantageConfig(std="population"), entropy_coef=0.05)
    trajs = small_batch(4)
    for t in trajs:
        with torch.no_grad():
            t.behavior_logprobs = [
                v if m else 0.0 for v, m in zip(token_logprobs(model, torch.tensor([t.input_ids]))[0][0].tolist(), t.loss_mask)
            ]
    stats = OffPolicyLearner(model, algo).train_batch(trajs)
    got = {n: p.grad for n, p in model.named_parameters()}
    assert stats["clip_frac"] == 0.0
    assert relative_error(got, reference_gradient(model, trajs, algo)) < 1e-12
