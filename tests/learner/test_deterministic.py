"""Streaming's deterministic learner (learner.deterministic): the same batch gives the same gradient
bit for bit whatever its arrival order, chunking and idle calls, and that gradient is exact."""

import random
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.config import ConfigError, RunConfig, AlgorithmConfig, parse_config
from learner.grad.learners.deterministic import DeterministicLearner, on_policy_learner
from learner.checks.exactness import TOLERANCE, random_batch, relative_error, scored_turns, tiny_llama
from learner.grad.fixed_point import FixedPointSum
from learner.grad.learners.common import LearnerOptions
from learner.grad.learners.on_policy import StreamingLearner
from learner.grad.reference import reference_gradient

torch.set_num_threads(1)
MODEL = tiny_llama(torch.float32, 21)
REF = tiny_llama(torch.float32, 22)


def gradient(algo, trajs, order_seed: int | None, budget: int) -> dict[str, torch.Tensor]:
    """p.grad after feeding ``trajs`` (OPD: their turns, then the trajectories) in trajectory
    order at once (``order_seed`` None) or shuffled in random drains with idle calls between."""
    learner = on_policy_learner(MODEL, algo, REF, LearnerOptions(micro_batch_tokens=budget, deterministic=True))
    learner.begin_batch(dict(Counter(t.group for t in trajs)))
    items = trajs if algo.objective == "grpo" else [x for t in trajs for x in scored_turns(t)] + trajs
    chunks = [items]
    if order_seed is not None:
        rng = random.Random(order_seed)
        shuffled = rng.sample(items, len(items)) if algo.objective == "grpo" else (
            rng.sample(items[:-len(trajs)], len(items) - len(trajs)) + rng.sample(trajs, len(trajs)))
        cuts = sorted(rng.sample(range(1, len(shuffled)), min(4, len(shuffled) - 1)))
        chunks = [shuffled[a:b] for a, b in zip([0] + cuts, cuts + [len(shuffled)])]
    for chunk in chunks:
        learner.learn(chunk)
        assert not learner.idle_work()  # nothing is ever deferred to idle time
    learner.finish_batch()
    grads = {n: p.grad.clone() for n, p in MODEL.named_parameters()}
    MODEL.zero_grad(set_to_none=True)
    return grads


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31), orders=st.lists(st.integers(0, 2**31), min_size=2, max_size=2),
       objective=st.sampled_from(["grpo", "opd"]), aux=st.booleans(), budget=st.sampled_from([16, 48, 4096]))
def test_the_same_batch_gives_the_same_bits_in_any_arrival_order(seed, orders, objective, aux, budget):
    algo = AlgorithmConfig(objective=objective, kl_coef=0.1 if aux else 0.0, entropy_coef=0.05 if aux else 0.0)
    trajs = random_batch(random.Random(seed))
    reference = gradient(algo, trajs, None, budget)
    for order in orders:
        got = gradient(algo, trajs, order, budget)
        assert all(torch.equal(got[n], reference[n]) for n in reference)
    assert relative_error(reference, reference_gradient(MODEL, trajs, algo, REF)) <= TOLERANCE[torch.float32]


def test_the_adaptive_learner_is_not_bitwise_order_independent():
    """Why the deterministic learner exists: the adaptive one's bits follow the arrival order (here
    with its early work on whenever it would idle, as the cost-aware policy may decide)."""
    algo = AlgorithmConfig()
    trajs = random_batch(random.Random(3))
    results = []
    for order in range(6):
        learner = StreamingLearner(MODEL, algo, None, LearnerOptions(path="adaptive", micro_batch_tokens=48,
                                                                    drain_policy="finished-groups-first"))
        learner.begin_batch(dict(Counter(t.group for t in trajs)))
        for traj in random.Random(order).sample(trajs, len(trajs)):
            learner.learn([traj])
            while learner.idle_work():
                pass
        learner.finish_batch()
        results.append({n: p.grad.clone() for n, p in MODEL.named_parameters()})
        MODEL.zero_grad(set_to_none=True)
    assert any(not torch.equal(r[n], results[0][n]) for r in results for n in r)


def test_learner_reports_its_path_and_memory():
    learner = DeterministicLearner(MODEL, AlgorithmConfig())
    trajs = random_batch(random.Random(4))
    learner.begin_batch(dict(Counter(t.group for t in trajs)))
    learner.learn(trajs)
    stats = learner.finish_batch()
    assert stats["learner"] == "deterministic" and stats["peak_buffers"] == 4  # two int64 limbs
    n = sum(p.numel() for p in MODEL.parameters())
    assert stats["peak_accumulator_mb"] == pytest.approx(16 * n / 2**20)
    assert stats["micro_batches"] >= len({t.group for t in trajs}) - stats["skipped_trajectories"]


# ---------------------------------------------------------------- the fixed-point sum


def test_fixed_point_sum_is_order_independent_and_close_to_the_exact_sum():
    param = torch.nn.Parameter(torch.zeros(1000))
    rng = torch.Generator().manual_seed(0)
    parts = [torch.randn(1000, generator=rng) * 10.0 ** torch.randint(-12, 6, (1000,), generator=rng)
             for _ in range(20)]
    sums = []
    for order in (range(20), reversed(range(20)), random.Random(1).sample(range(20), 20)):
        acc = FixedPointSum([param])
        for k in order:
            acc.add_direct([parts[k]])
        sums.append(acc.value(0))
    assert torch.equal(sums[0], sums[1]) and torch.equal(sums[0], sums[2])
    exact = torch.stack([p.double() for p in parts]).sum(0)
    assert float((sums[0] - exact).abs().max()) <= 20 * 2.0**-60 + 2.0**-52 * float(exact.abs().max())


def test_fixed_point_sum_refuses_what_it_cannot_hold():
    acc = FixedPointSum([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(3))])
    with pytest.raises(ValueError, match=r"parameter 1 \(3,\).*5e\+09"):
        acc.add_direct([None, torch.tensor([0.0, 5e9, 1.0])])
    with pytest.raises(ValueError, match=r"parameter 0 \(2,\).*nan"):
        acc.add_direct([torch.tensor([float("nan"), 1.0]), None])


# ---------------------------------------------------------------- the switch


def config(**learner) -> RunConfig:
    return RunConfig.model_validate({"train": {"schedule": "streaming"}, "learner": learner})


def test_null_means_on_with_checkpoints_and_only_streaming_has_it():
    assert not config().deterministic_learner()
    with_checkpoints = RunConfig.model_validate({"train": {"schedule": "streaming", "checkpoint_every": 2}})
    assert with_checkpoints.deterministic_learner()
    assert LearnerOptions.from_config(with_checkpoints).deterministic
    assert not RunConfig.model_validate({"train": {"schedule": "streaming", "checkpoint_every": 2},
                                         "learner": {"deterministic": False}}).deterministic_learner()
    sync = RunConfig.model_validate({"train": {"schedule": "sync"}, "learner": {"deterministic": True}})
    assert not sync.deterministic_learner()  # sync learns its batch in trajectory order anyway


@pytest.mark.parametrize("learner, field", [({"deterministic": True, "path": "adaptive"}, "learner.path adaptive"),
                                            ({"deterministic": True, "world_size": 2}, "data-parallel")])
def test_what_the_deterministic_learner_cannot_be_combined_with_is_one_line(learner, field):
    with pytest.raises(ConfigError) as err:
        parse_config({"train": {"schedule": "streaming"}, "learner": learner})
    assert "learner.deterministic" in str(err.value) and field in str(err.value)
    assert "\n" not in str(err.value)
