"""The learner paths: drain policy invariants, adaptive exactness under drawn arrival/queue
interleavings, bounded open groups, zero-variance skip, micro-batch padding, one-pass KL/entropy."""

import random
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.config import AdvantageConfig, AlgorithmConfig
from learner.grad.batching.cost_model import DRAIN_POLICIES
from learner.grad.batching.drain import Bucket, Close, DrainPlanner, Known
from learner.checks.exactness import random_batch, random_trajectory, relative_error, tiny_llama, zero_variance_batch
from learner.grad.learners.common import LearnerOptions
from learner.grad.learners.off_policy import OffPolicyLearner
from learner.grad.learners.on_policy import StreamingLearner
from learner.grad.reference import reference_gradient
from learner.grad.batching.microbatch import forward, grads_of, grpo_row, on_policy_pg_loss, plan_micro_batches, split_grads
from learner.grad.objectives import token_logprobs
from learner.grad.accumulator import GradAccumulator

torch.set_num_threads(1)


# ---------------------------------------------------------------- the drain policy, no tensors


@st.composite
def arrivals(draw):
    """Groups with binary-ish rewards, a shuffled arrival order cut into drains, idle calls between."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=1, max_size=5))
    trajs = []
    for g, size in enumerate(sizes):
        for _ in range(size):
            reward = draw(st.sampled_from([0.0, 1.0, 0.5]))
            trajs.append(random_trajectory(random.Random(len(trajs)), len(trajs), g, reward))
    order = draw(st.permutations(trajs))
    cuts = draw(st.lists(st.integers(1, 4), min_size=len(order), max_size=len(order)))
    idles = draw(st.lists(st.integers(0, 2), min_size=len(order), max_size=len(order)))
    return trajs, order, cuts, idles


@settings(max_examples=150, deadline=None)
@given(case=arrivals(), cap=st.sampled_from([0, 1, 2, None]), path=st.sampled_from(["per-trajectory", "adaptive"]),
       speculate=st.booleans())
def test_drain_learns_every_member_once_within_the_cap(case, cap, path, speculate):
    trajs, order, cuts, idles = case
    sizes = Counter(t.group for t in trajs)
    planner = DrainPlanner(sizes, AdvantageConfig(), cap, lazy=path == "adaptive", speculate=speculate)
    learnt: Counter = Counter()
    open_sums: set[int] = set()
    arrived: Counter = Counter()
    i = k = 0

    def execute(tasks):
        for task in tasks:
            if isinstance(task, Close):
                assert task.group in open_sums and arrived[task.group] == sizes[task.group]
                open_sums.discard(task.group)
            elif isinstance(task, Known):  # advantages are final only once the group is complete
                assert arrived[task.group] == sizes[task.group]
                learnt.update(t.id for t in task.trajs)
            else:
                assert isinstance(task, Bucket) and all(t.reward == task.reward for t in task.trajs)
                open_sums.add(task.group)
                learnt.update(t.id for t in task.trajs)
            assert cap is None or len(open_sums) <= cap

    while i < len(order):
        chunk = order[i:i + cuts[k]]
        arrived.update(t.group for t in chunk)
        execute(planner.drain(chunk))
        for _ in range(idles[k]):
            execute(planner.idle())
        i, k = i + len(chunk), k + 1
    assert not open_sums and all(group.closed and group.arrived for group in planner.groups.values())
    assert learnt == Counter(t.id for t in trajs)  # each member exactly once


def test_zero_variance_candidates_wait_for_a_second_reward_or_the_close_unless_speculating():
    trajs = [random_trajectory(random.Random(i), i, 0, 1.0) for i in range(3)]
    planner = DrainPlanner({0: 3}, AdvantageConfig(), None, lazy=True)
    assert planner.drain(trajs[:2]) == []  # an open group: nothing is learnt while work arrives
    assert planner.idle() == []  # all equal so far: not even in idle time
    tasks = planner.drain(trajs[2:])
    assert [type(t) for t in tasks] == [Known] and tasks[0].advantages == [0.0, 0.0, 0.0]
    differs = DrainPlanner({0: 4}, AdvantageConfig(), None, lazy=True)
    differs.drain(trajs[:2] + [random_trajectory(random.Random(9), 9, 0, 0.0)])
    buckets = differs.idle()  # a second reward: the two 1.0 members are one bucket, not speculative
    assert [(len(b.trajs), b.speculative) for b in buckets] == [(2, False)]
    idle = DrainPlanner({0: 3}, AdvantageConfig(), None, lazy=True, speculate=True)
    idle.drain(trajs[:2])
    speculative = idle.idle()  # the earlier rule: nothing else to do, learn them anyway
    assert [t.speculative for t in speculative] == [True] and len(speculative[0].trajs) == 2


def test_idle_learns_the_largest_bucket_and_zero_variance_candidates_last():
    rewards = {0: [1.0, 1.0, 1.0], 1: [1.0, 0.0, 1.0, 1.0], 2: [0.0, 1.0]}
    trajs = [random_trajectory(random.Random(len(rewards) * g + i), 10 * g + i, g, r)
             for g, rs in rewards.items() for i, r in enumerate(rs)]
    planner = DrainPlanner({0: 4, 1: 5, 2: 3}, AdvantageConfig(), 2, lazy=True)
    assert planner.drain(trajs) == []
    first, second = planner.idle(), planner.idle()
    assert (first[0].group, first[0].reward, len(first[0].trajs)) == (1, 1.0, 3)  # largest, two rewards seen
    assert second[0].group == 1 and len(second[0].trajs) == 1
    third = planner.idle()  # group 2 takes the second of K = 2 sums; group 0 (all 1.0 so far) waits
    assert third[0].group == 2 and not third[0].speculative
    planner.idle()
    assert planner.idle() == []  # K = 2 groups hold sums: group 0 waits for its close


# ---------------------------------------------------------------- exactness with real backward passes


@st.composite
def interleaving(draw):
    return (draw(st.lists(st.integers(1, 6), min_size=30, max_size=30)),
            draw(st.lists(st.booleans(), min_size=30, max_size=30)))


@settings(max_examples=10, deadline=None)
@given(seed=st.integers(0, 2**31), feed=interleaving(), cap=st.sampled_from([0, 1, 2, None]),
       acc=st.sampled_from(["device", "host"]), kl=st.sampled_from([0.0, 0.3]),
       budget=st.sampled_from([16, 40, 4096]), speculate=st.booleans(), drain=st.sampled_from(DRAIN_POLICIES))
def test_adaptive_is_exact_under_drawn_arrival_and_queue_interleavings(seed, feed, cap, acc, kl, budget, speculate,
                                                                      drain):
    rng = random.Random(seed)
    model, ref = tiny_llama(torch.float64, rng.randrange(2**31)), tiny_llama(torch.float64, rng.randrange(2**31))
    algo = AlgorithmConfig(kl_coef=kl, entropy_coef=kl / 3)
    trajs = rng.choice((random_batch, zero_variance_batch))(rng)
    learner = StreamingLearner(model, algo, ref, LearnerOptions("adaptive", budget, cap, acc, speculate_zero_variance=speculate,
                                                                drain_policy=drain))
    learner.begin_batch(dict(Counter(t.group for t in trajs)))
    order, (cuts, idles), i = rng.sample(trajs, len(trajs)), feed, 0
    for cut, idle in zip(cuts, idles):
        learner.learn(order[i:i + cut])
        i += cut
        if idle:
            learner.idle_work()
        assert cap is None or len(learner.acc.open_groups) <= cap
    stats = learner.finish_batch()
    assert cap is None or stats["peak_buffers"] <= 1 + 2 * cap
    got = {n: p.grad for n, p in model.named_parameters()}
    assert relative_error(got, reference_gradient(model, trajs, algo, ref)) < 1e-12


@pytest.mark.parametrize("kl", [0.0, 0.2])
@pytest.mark.parametrize("path", ["micro-batched", "adaptive"])
def test_zero_variance_groups_skip_their_backward_exactly(path, kl):
    model, ref = tiny_llama(torch.float64, 1), tiny_llama(torch.float64, 2)
    algo = AlgorithmConfig(kl_coef=kl, entropy_coef=kl)
    trajs = zero_variance_batch(random.Random(4))
    learner = StreamingLearner(model, algo, ref, LearnerOptions(path))
    learner.begin_batch(dict(Counter(t.group for t in trajs)))
    for traj in trajs if path == "adaptive" else [trajs]:  # adaptive: one at a time, never idle
        learner.learn([traj] if path == "adaptive" else traj)
    stats = learner.finish_batch()
    equal = sum(t.group != 0 for t in trajs)
    # with a KL/entropy term every member still takes its (reward-independent) backward
    assert stats["skipped_trajectories"] == (equal if kl == 0 else 0)
    assert stats["rows"] == len(trajs) - stats["skipped_trajectories"]
    got = {n: p.grad for n, p in model.named_parameters()}
    assert relative_error(got, reference_gradient(model, trajs, algo, ref)) < 1e-12


# ---------------------------------------------------------------- micro-batches and accumulators


def test_padded_micro_batch_gives_each_row_its_own_log_probs():
    model = tiny_llama(torch.float64, 3)
    trajs = random_batch(random.Random(9))
    rows = [grpo_row(t, 1.0) for t in trajs]
    fwd = forward(model, None, AlgorithmConfig(), rows)
    for b, t in enumerate(trajs):
        alone = token_logprobs(model, torch.tensor([t.input_ids]))[0][0]
        assert torch.allclose(fwd.logp[b, :len(t.input_ids)], alone, rtol=0, atol=1e-12)
        assert float(fwd.w[b, len(t.input_ids):].abs().sum()) == 0.0  # padding has no weight


def test_micro_batches_respect_the_token_budget():
    trajs = random_batch(random.Random(2)) + random_batch(random.Random(3))
    rows = [grpo_row(t, 1.0) for t in trajs]
    for budget in (1, 20, 64, 10_000):
        batches = plan_micro_batches(rows, budget)
        assert sorted(r.traj for b in batches for r in b) == sorted(r.traj for r in rows)
        for b in batches:
            assert len(b) == 1 or len(b) * max(len(r.ids) for r in b) <= budget
    assert len(plan_micro_batches(rows, 10_000)) == 1 and len(plan_micro_batches(rows, 1)) == len(rows)


def test_one_pass_split_equals_two_backward_passes():
    model, ref = tiny_llama(torch.float64, 5), tiny_llama(torch.float64, 6)
    algo = AlgorithmConfig(kl_coef=0.3, entropy_coef=0.1)
    rows = [grpo_row(t, 1.0) for t in random_batch(random.Random(5))[:3]]
    params = list(model.parameters())
    results = []
    for one_pass in (True, False):
        fwd = forward(model, ref, algo, rows)
        results.append(split_grads(on_policy_pg_loss(fwd, "grpo"), (fwd.w * fwd.aux).sum(), params, one_pass))
    for (a_pg, a_aux), (b_pg, b_aux) in [results]:
        for x, y in zip(a_pg + a_aux, b_pg + b_aux):
            assert (x is None) == (y is None) and (x is None or torch.allclose(x, y, rtol=1e-12, atol=1e-15))
    fwd = forward(model, ref, algo, rows)
    total = grads_of(on_policy_pg_loss(fwd, "grpo") + (fwd.w * fwd.aux).sum(), params)
    for t, pg, aux in zip(total, *results[0]):
        assert torch.allclose(t, pg + aux, rtol=1e-10, atol=1e-14)


def test_host_accumulator_keeps_group_sums_in_host_memory():
    p = torch.nn.Parameter(torch.zeros(3))
    acc = GradAccumulator([p], group_device="cpu")
    acc.open_group(0)
    acc.add_to_group(0, 1.0, [torch.ones(3)])
    acc.add_to_group(0, 0.0, [2 * torch.ones(3)])
    acc.close_group(0, 0.5, 2.0)
    acc.finalize(1.0)
    assert torch.equal(p.grad, torch.full((3,), (0.5 * 1 - 0.5 * 2) / 2.0))
    assert acc.group_device.type == "cpu" and not acc._pin  # page-locked only beside a GPU model


@pytest.mark.parametrize("objective", ["grpo", "opd"])
def test_off_policy_micro_batches_equal_per_trajectory(objective):
    model = tiny_llama(torch.float64, 7)
    algo = AlgorithmConfig(objective=objective, entropy_coef=0.05)
    trajs = random_batch(random.Random(7))
    for t in trajs:  # stale behavior log-probs: the clip is active on some tokens
        t.behavior_logprobs = [-1.0 if m else 0.0 for m in t.loss_mask]
    grads, stats = [], []
    for path, budget in (("per-trajectory", 4096), ("micro-batched", 64)):
        stats.append(OffPolicyLearner(model, algo, options=LearnerOptions(path, budget)).train_batch(trajs))
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    assert stats[0]["micro_batches"] == len(trajs) > stats[1]["micro_batches"]
    assert stats[0]["clip_frac"] == stats[1]["clip_frac"] > 0
    assert relative_error(grads[1], grads[0]) < 1e-12


# ---------------------------------------------------------------- config


def test_learner_path_auto_picks_the_best_learner_per_schedule_and_rejects_misfits():
    from learner.config import ConfigError, parse_config

    picked = {s: parse_config({"train": {"schedule": s}}).learner_path()
              for s in ("sync", "async", "fully-async", "streaming")}
    assert picked == {"sync": "micro-batched", "async": "micro-batched", "fully-async": "micro-batched",
                      "streaming": "adaptive"}
    cfg = parse_config({"train": {"schedule": "sync", "micro_batch_tokens": 512},
                        "learner": {"path": "per-trajectory", "max_open_groups": 2, "accumulator_device": "host"}})
    assert LearnerOptions.from_config(cfg) == LearnerOptions("per-trajectory", 512, 2, "host")
    with pytest.raises(ConfigError, match="learner.path: adaptive"):
        parse_config({"train": {"schedule": "sync"}, "learner": {"path": "adaptive"}})
    with pytest.raises(ConfigError, match="learner.path: streaming"):
        parse_config({"train": {"schedule": "streaming"}, "learner": {"path": "micro-batched"}})
    with pytest.raises(ConfigError, match="learner.max_open_groups"):
        parse_config({"learner": {"max_open_groups": -1}})


# ---------------------------------------------------------------- the trainer under each path


@pytest.mark.slow
@pytest.mark.parametrize("schedule,learner", [
    ("sync", {}), ("sync", {"path": "per-trajectory"}), ("async", {}),
    ("streaming", {"max_open_groups": 2, "accumulator_device": "host"}),
    ("streaming", {}), ("streaming", {"drain_policy": "finished-groups-first", "pack_rows": False}),
    ("streaming", {"drain_policy": "closed-groups"}), ("sync", {"pack_rows": False}),
])
def test_a_dumped_step_of_each_learner_path_passes_the_audit(tmp_path, schedule, learner):
    import yaml

    from learner.audit import audit_dump
    from learner.cli import main

    cfg = yaml.safe_load(open("configs/quickstart.yaml"))
    cfg["train"] |= {"schedule": schedule, "prompts_per_step": 3, "micro_batch_tokens": 256}
    cfg["learner"] = learner
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    events = tmp_path / "events.jsonl"
    assert main(["train", "--config", str(tmp_path / "run.yaml"), "--steps", "1", "--dump-step",
                 str(tmp_path / "dump"), "--events", str(events), "--quiet"]) == 0
    result = audit_dump(tmp_path / "dump")
    assert result["passed"], result
    import json

    values = next(json.loads(line)["values"] for line in events.read_text().splitlines()
                  if json.loads(line)["type"] == "metrics")
    if "max_open_groups" in learner:
        assert values["actor/peak_buffers"] <= 1 + 2 * 2
    assert values["learner/micro_batches"] >= 1


@pytest.mark.parametrize("algorithm, explicit, expected", [
    ({}, None, False),  # no aux term: a zero-variance candidate may need no backward at all
    ({"kl_coef": 0.04}, None, True),  # its KL backward is needed anyway
    ({"entropy_coef": 0.01}, None, True),
    ({"kl_coef": 0.04}, False, False),  # an explicit setting wins
    ({}, True, True),
])
def test_zero_variance_speculation_defaults_to_on_exactly_with_a_kl_or_entropy_term(algorithm, explicit, expected):
    from learner.config import parse_config

    cfg = parse_config({"algorithm": algorithm, "learner": {"speculate_zero_variance": explicit}})
    assert cfg.speculate_zero_variance() is expected
    assert LearnerOptions.from_config(cfg).speculate_zero_variance is expected


def test_a_step_that_learnt_open_and_known_rows_reports_what_an_open_row_cost():
    # group 0 gets two distinct rewards and is learnt open in idle time; group 1 closes at once
    model = tiny_llama(torch.float32, 0)
    ref = tiny_llama(torch.float32, 0)
    rng = random.Random(0)
    algo = AlgorithmConfig(kl_coef=0.05)
    trajs = [random_trajectory(rng, i, 0, reward) for i, reward in enumerate([1.0, 0.0, 1.0])]
    trajs += [random_trajectory(rng, 3 + i, 1, reward) for i, reward in enumerate([1.0, 0.0])]
    learner = StreamingLearner(model, algo, ref, LearnerOptions("adaptive", drain_policy="finished-groups-first"))
    learner.begin_batch({0: 4, 1: 2})
    learner.learn(trajs[:2])
    while learner.idle_work():
        pass  # group 0's two buckets, into its running sums
    learner.learn(trajs[2:])  # group 1 closes: its rows are known; group 0's third member waits
    learner.learn([random_trajectory(rng, 5, 0, 0.0)])  # group 0 closes
    stats = learner.finish_batch()
    assert stats["open_row_cost"] > 0
    sync = StreamingLearner(model, algo, ref, LearnerOptions("micro-batched"))
    sync.begin_batch({0: 1})
    sync.learn([random_trajectory(rng, 0, 0, 1.0)])
    assert "open_row_cost" not in sync.finish_batch()  # nothing was learnt open
