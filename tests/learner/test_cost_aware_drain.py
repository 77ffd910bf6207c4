"""The adaptive learner's ``cost-aware`` drain policy: its cost fit, when early work pays, and
that the learner stays exact whichever way it decides (learner/grad/batching/cost_model.py)."""

import random
from collections import Counter

import pytest
import torch

from learner.config import AlgorithmConfig
from learner.grad.batching.cost_model import DEFER_REASONS, GROUPED_PRIOR_RATIO, BackwardCosts, DrainPolicy, EarlyWorkBudget
from learner.checks.exactness import early_work_everywhere, random_batch, relative_error, tiny_llama
from learner.grad.learners.common import LearnerOptions
from learner.grad.learners.on_policy import StreamingLearner
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
    stats, rel = _learn(drain, early_work_everywhere(), share=10.0)
    assert rel < 1e-12
    assert stats["cpu_s"] > 0 and stats["token_slots"] >= stats["rows"] > 0  # what the step's work was
    if drain == "closed-groups":
        assert stats["peak_buffers"] == 1  # no open group ever held sums
        assert stats["open_rows"] == stats["open_micro_batches"] == 0
    else:
        assert stats["peak_buffers"] > 1
        assert stats["open_rows"] >= stats["open_micro_batches"] > 0


def test_cost_aware_with_nothing_measured_learns_like_closed_groups():
    stats, rel = _learn("cost-aware", None)
    assert rel < 1e-12 and stats["peak_buffers"] == 1


def test_unfilled_known_rows_run_early_only_in_place_of_syncs_own_unfilled_micro_batch():
    policy = DrainPolicy("cost-aware", 0.05, micro_batch_tokens=4096)
    policy.costs = fitted(0.01, 1e-4)
    budget = policy.begin(expected_rows=256)
    budget.arrivals(128, 128 * 30, now=0.0)  # 256 rows of 30 tokens: sync's plan is 4096 + 3584 slots
    assert budget.sync_micro_batches() == 2
    assert policy.chunk_slots(budget) == pytest.approx(7680 / 4)
    assert not policy.partial_pays(budget, 1500)  # 1500 + 6180 left: three micro-batches, and under a chunk
    assert policy.partial_pays(budget, 3584)  # it takes the place of sync's unfilled one
    assert budget.spent_s == 0.0  # at no cost beyond sync's plan
    budget.ran(4096)  # a full one ran
    assert not policy.partial_pays(budget, 1500)  # 4096 + 1500 + 2084: three again
    assert policy.partial_pays(budget, 3584)
    assert not DrainPolicy("closed-groups", 0.05).partial_pays(budget, 3584)
    assert DrainPolicy("finished-groups-first", 0.05).partial_pays(budget, 100)


def test_a_chunk_of_known_rows_runs_early_for_one_backwards_fixed_cost_out_of_the_allowance():
    policy = DrainPolicy("cost-aware", 0.05, micro_batch_tokens=4096)
    policy.costs = fitted(0.01, 1e-4)
    budget = policy.begin(expected_rows=256)
    budget.arrivals(128, 128 * 30, now=0.0)  # sync's plan: 7680 slots, a chunk a quarter of it
    assert not budget.keeps_count(2048)  # a third micro-batch ...
    assert policy.partial_pays(budget, 2048)  # ... whose fixed cost (0.01 s) fits 5% of 0.78 s
    assert budget.spent_s == pytest.approx(0.01)
    budget.spend(0.025)
    assert not policy.partial_pays(budget, 2048)  # the allowance is spent: it waits
    assert budget.reason == "count"


def test_an_unfilled_micro_batch_under_half_the_budget_waits_even_where_the_count_allows():
    policy = DrainPolicy("cost-aware", 0.05, micro_batch_tokens=4096)
    budget = policy.begin(expected_rows=100)
    budget.arrivals(100, 100 * 41, now=0.0)  # 4100 slots: two micro-batches, the second of 4
    assert budget.sync_micro_batches() == 2
    assert budget.keeps_count(1000) and not policy.partial_pays(budget, 1000)


def test_the_predicted_plan_leaves_out_what_the_closed_groups_skipped_and_counts_padding():
    budget = EarlyWorkBudget(BackwardCosts(), expected_rows=256, share=0.05)
    budget.arrivals(128, 128 * 30, now=0.0)
    budget.closed(tokens=600, learnt_tokens=300)  # half of the closed members' tokens skipped (A = 0)
    assert budget.expected_slots() == pytest.approx(3840)
    budget.costs.observe(1200, 40, 0.1, open_group=False, tokens=1000)  # 20% padding in known micro-batches
    assert budget.expected_slots() == pytest.approx(3840 * 1.2)


def _open_ratio(ratio: float) -> BackwardCosts:
    costs = fitted(0.0, 1e-3)  # 50 slots a row: 0.05 s per known row
    costs.observe(50, 1, ratio * costs.known_row_s, open_group=True)
    return costs


def test_an_open_bucket_runs_only_if_it_saves_as_much_tail_as_it_costs_and_ends_before_the_last_arrival():
    policy = DrainPolicy("cost-aware", 10.0)
    policy.costs = _open_ratio(1.5)
    budget = policy.begin(expected_rows=100)
    budget.arrivals(10, 1000, now=0.0)
    budget.arrivals(10, 1000, now=1.0)  # 80 rows more at 20 a second: the last one in 4 s
    assert policy.open_pays(budget, 40, waiting_slots=5000, now=1.0)  # 3 s of bucket, 5 s waiting
    assert not policy.open_pays(budget, 60, waiting_slots=5000, now=1.0)  # 4.5 s: it would run into the tail
    assert not policy.open_pays(budget, 4, waiting_slots=3000, now=1.0)  # what waits fits before the end
    policy.costs = _open_ratio(2.5)  # a premium above the tail it saves: never
    assert not policy.open_pays(budget, 4, waiting_slots=5000, now=1.0)


def test_an_open_bucket_pays_its_measured_premium_out_of_the_allowance():
    policy = DrainPolicy("cost-aware", 0.05)
    policy.costs = _open_ratio(1.5)
    budget = policy.begin(expected_rows=100)
    policy.charge_open(budget, rows=2, seconds=0.3)  # 2 rows at 0.05 s known: 0.2 s beyond
    assert budget.spent_s == pytest.approx(0.2)


def test_each_refusal_is_counted_by_its_reason_once_per_idle_moment():
    policy = DrainPolicy("cost-aware", 0.05, micro_batch_tokens=4096)
    budget = policy.begin(expected_rows=100)
    budget.arrivals(10, 1000, now=0.0)
    assert not policy.open_pays(budget, 4, waiting_slots=5000, now=1.0)  # nothing measured: the prior 2.0
    budget.idle_ended(learnt=False)
    policy.costs = _open_ratio(2.5)
    assert not policy.open_pays(budget, 4, waiting_slots=5000, now=1.0)
    budget.idle_ended(learnt=False)
    policy.costs = fitted(0.01, 1e-4)
    assert not policy.partial_pays(budget, 1000)  # under half a micro-batch
    budget.idle_ended(learnt=False)
    budget.refuse("count")  # an idle moment that refused once and then learnt something counts nothing
    budget.idle_ended(learnt=True)
    assert budget.deferred == Counter({"unmeasured": 1, "cost": 1, "count": 1})
    closed = DrainPolicy("closed-groups", 0.05)
    shut = closed.begin(expected_rows=4)
    assert not closed.partial_pays(shut, 4096)
    shut.idle_ended(learnt=False)
    assert shut.deferred == Counter({"policy": 1})


def test_a_streaming_batch_reports_why_it_deferred_and_how_much_it_learnt_early():
    """Real backwards: cold, the cost-aware learner defers every idle moment as unmeasured and learns
    nothing before the last arrival; with the drain forced everywhere it learns early and says so."""
    stats, rel = _learn("cost-aware", None)
    assert rel < 1e-12
    assert stats["early_row_share"] == 0.0 and stats["deferred_unmeasured"] > 0
    assert set(k for k in stats if k.startswith("deferred_")) == {f"deferred_{r}" for r in DEFER_REASONS}
    assert stats["early_cost_ratio"] == pytest.approx(GROUPED_PRIOR_RATIO)  # the grouped backward is on
    stats, rel = _learn("finished-groups-first", None)
    assert rel < 1e-12 and 0.0 < stats["early_row_share"] <= 1.0
    assert sum(stats[f"deferred_{r}"] for r in DEFER_REASONS) == 0  # it never refuses
