"""The adaptive learner's ``cost-aware`` drain policy: its cost fit, when early work pays, and
that the learner stays exact whichever way it decides (learner/grad/cost_model.py)."""

import random
from collections import Counter

import pytest
import torch

from learner.config import AlgorithmConfig
from learner.grad.cost_model import BackwardCosts, DrainPolicy, EarlyWorkBudget
from learner.grad.exactness import random_batch, relative_error, tiny_llama
from learner.grad.learner_common import LearnerOptions
from learner.grad.on_policy import StreamingLearner
from learner.grad.reference import reference_gradient


def fitted(a: float, b: float) -> BackwardCosts:
    costs = BackwardCosts()
    for slots in (100, 400, 1000, 4000, 250):
        costs.observe(slots, slots // 50, a + b * slots, open_group=False)
    return costs


def test_the_known_fit_recovers_the_fixed_and_per_slot_cost_and_the_open_ratio():
    costs = fitted(0.01, 1e-4)
    assert costs.fixed_s == pytest.approx(0.01)
    assert costs.known_s(2000) == pytest.approx(0.21)
    costs.observe(120, 1, 2.5 * costs.known_row_s, open_group=True)  # one open row, 2.5 known rows' time
    assert costs.open_ratio == pytest.approx(2.5)


def test_one_size_seen_puts_every_second_on_the_slots():
    costs = BackwardCosts()
    costs.observe(1000, 20, 0.5, open_group=False)
    assert costs.fixed_s == 0.0 and costs.known_s(2000) == pytest.approx(1.0)


def test_early_work_pays_only_near_the_rollouts_end_and_within_the_share():
    budget = EarlyWorkBudget(fitted(0.0, 1e-3), expected_rows=100, share=0.05)
    assert not budget.pays(0.0, 10.0, now=0.0)  # nothing arrived: no rate, no allowance
    budget.arrivals(10, 1000, now=0.0)
    budget.arrivals(10, 1000, now=1.0)  # 20 rows in 1 s: 80 more take 4 s; allowance 0.05·10 s
    assert budget.remaining_rollout_s(now=1.0) == pytest.approx(4.0)
    assert not budget.pays(0.1, waiting_s=3.0, now=1.0)  # what waits fits before the end: waiting is free
    assert budget.pays(0.1, waiting_s=5.0, now=1.0)
    assert not budget.pays(0.6, waiting_s=5.0, now=1.0)  # beyond 5% of the batch's 10 s
    budget.spend(0.45)
    assert not budget.pays(0.1, waiting_s=5.0, now=1.0)


def test_nothing_measured_means_no_early_work():
    budget = EarlyWorkBudget(BackwardCosts(), expected_rows=4, share=1.0)
    budget.arrivals(3, 300, now=0.0)
    assert not budget.pays(0.0, float("inf"), now=1.0)


def test_an_unknown_policy_is_refused_by_name():
    with pytest.raises(ValueError, match="learner.drain_policy"):
        DrainPolicy("greedy", 0.05)


def _learn(drain: str, seeded: BackwardCosts | None, share: float = 0.05):
    rng = random.Random(3)
    model, ref = tiny_llama(torch.float64, 1), tiny_llama(torch.float64, 2)
    algo = AlgorithmConfig(kl_coef=0.1)
    trajs = random_batch(rng)
    learner = StreamingLearner(model, algo, ref, LearnerOptions("adaptive", drain_policy=drain, early_work_share=share))
    if seeded is not None:
        learner.policy.costs = seeded
    learner.begin_batch(dict(Counter(t.group for t in trajs)))
    for traj in rng.sample(trajs, len(trajs)):
        learner.learn([traj])
        while learner.idle_work():
            pass
    stats = learner.finish_batch()
    got = {n: p.grad for n, p in model.named_parameters()}
    return stats, relative_error(got, reference_gradient(model, trajs, algo, ref))


@pytest.mark.parametrize("drain", ["closed-groups", "finished-groups-first", "cost-aware"])
def test_each_decision_gives_the_batch_gradient(drain):
    # seeded at 1 s per slot: any waiting row "spills past" the rollout's end, so cost-aware's
    # early work runs wherever the share allows it (share 10: everywhere)
    stats, rel = _learn(drain, fitted(0.0, 1.0), share=10.0)
    assert rel < 1e-12
    if drain == "closed-groups":
        assert stats["peak_buffers"] == 1  # no open group ever held sums
    else:
        assert stats["peak_buffers"] > 1


def test_cost_aware_with_nothing_measured_learns_like_closed_groups():
    stats, rel = _learn("cost-aware", None)
    assert rel < 1e-12 and stats["peak_buffers"] == 1


def test_unfilled_known_rows_run_early_only_from_half_a_micro_batch_and_within_the_share():
    policy = DrainPolicy("cost-aware", 0.05, micro_batch_tokens=4096)
    policy.costs = fitted(0.01, 1e-4)  # one more backward: 10 ms
    budget = policy.begin(expected_rows=1000)
    budget.arrivals(100, 4000, now=0.0)  # allowance 0.05 · (0.01 + 1e-4 · 40000) s
    assert not policy.partial_pays(budget, 1000)  # under half a micro-batch
    assert policy.partial_pays(budget, 2048)  # 10 ms ≤ 5% of its 0.21 s
    assert budget.spent_s == pytest.approx(0.01)
    assert not DrainPolicy("closed-groups", 0.05).partial_pays(budget, 4000)
