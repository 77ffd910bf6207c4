"""The RL curves: the learner's policy loss, entropy and KL tallied from its own forwards equal
the formulas computed directly; a tiny real run emits every curve and the processes' CPU / RSS."""

import random

import pytest
import torch

from learner.config import AlgorithmConfig, load_config
from learner.driver.curves import percentile, trajectory_curves
from learner.driver.loop import train
from learner.checks.exactness import VOCAB, random_batch, tiny_llama
from learner.grad.learners.common import LearnerOptions, batch_advantages
from learner.grad import objectives
from learner.grad.objectives import k3_kl, token_logprobs
from learner.grad.learners.off_policy import OffPolicyLearner
from learner.grad.learners.on_policy import StreamingLearner
from learner.timeline import MemorySink, Metric

torch.set_num_threads(1)


def direct(model, ref, trajs, algo, forwarded):
    """Policy loss −(1/N) Σ A_i |o_i| (token-mean, ρ ≡ 1 in value), and the entropy and k3 KL means
    over the scored tokens of the trajectories ``forwarded``, each from its own full forward."""
    adv = batch_advantages(trajs, algo.advantage)
    n = sum(t.n_scored for t in trajs)
    pg = -sum(adv[t.id] * t.n_scored for t in trajs) / n
    h_sum = kl_sum = tokens = 0.0
    with torch.no_grad():
        for t in trajs:
            if t.id not in forwarded:
                continue
            ids, mask = torch.tensor([t.input_ids]), torch.tensor(t.loss_mask, dtype=torch.float32)
            logp, h = token_logprobs(model, ids, with_entropy=True)
            h_sum += float((mask * h[0]).sum())
            tokens += t.n_scored
            if ref is not None:
                kl_sum += float((mask * k3_kl(logp[0], token_logprobs(ref, ids)[0][0])).sum())
    return pg, h_sum / tokens, (kl_sum / tokens if ref is not None else None)


def trained(learner_cls, path, algo, ref, trajs, order):
    model = tiny_llama(torch.float32, seed=0)
    learner = learner_cls(model, algo, ref_model=ref, options=LearnerOptions(path=path,
                                                                              drain_policy="finished-groups-first"))
    learner.begin_batch({g: sum(t.group == g for t in trajs) for g in {t.group for t in trajs}})
    for traj in order:
        learner.learn([traj])
    return model, learner.finish_batch()


@pytest.mark.parametrize("path", ["per-trajectory", "micro-batched", "adaptive"])
@pytest.mark.parametrize("aux", ["none", "kl", "entropy"])
def test_on_policy_loss_entropy_and_kl_equal_the_formulas(path, aux):
    rng = random.Random(3)
    trajs = random_batch(rng)
    order = rng.sample(trajs, len(trajs))  # arrival order: per-trajectory keeps groups open (running sums)
    kl = aux == "kl"
    ref = tiny_llama(torch.float32, seed=1) if kl else None
    algo = AlgorithmConfig(kl_coef=0.1 if kl else 0.0, entropy_coef=0.01 if aux == "entropy" else 0.0)
    model0 = tiny_llama(torch.float32, seed=0)
    adv = batch_advantages(trajs, algo.advantage)
    # without a KL or entropy term a zero-advantage trajectory has no forward: not in the entropy mean
    forwarded = {t.id for t in trajs if aux != "none" or adv[t.id] != 0.0}
    pg, entropy, kl_ref = direct(model0, ref, trajs, algo, forwarded)
    _, stats = trained(StreamingLearner, path, algo, ref, trajs, order)
    assert stats["pg_loss"] == pytest.approx(pg, rel=1e-5, abs=1e-7)
    assert stats["entropy"] == pytest.approx(entropy, rel=1e-5)
    if kl:
        assert stats["kl_ref"] == pytest.approx(kl_ref, rel=1e-4) and stats["kl_ref"] > 0
    else:
        assert "kl_ref" not in stats


def test_off_policy_loss_at_its_own_behaviour_log_probs_is_the_on_policy_value():
    trajs = random_batch(random.Random(5))
    model0 = tiny_llama(torch.float32, seed=0)
    with torch.no_grad():  # behaviour = the policy itself: ρ = 1, the clipped loss is −A per token
        for t in trajs:
            logp = token_logprobs(model0, torch.tensor([t.input_ids]))[0][0].tolist()
            t.behavior_logprobs = [v if m else 0.0 for v, m in zip(logp, t.loss_mask)]
    algo = AlgorithmConfig()
    adv = batch_advantages(trajs, algo.advantage)
    pg, entropy, _ = direct(model0, None, trajs, algo, {t.id for t in trajs if adv[t.id] != 0.0})
    _, stats = trained(OffPolicyLearner, "micro-batched", algo, None, trajs, trajs)
    assert stats["pg_loss"] == pytest.approx(pg, rel=1e-5, abs=1e-7)
    assert stats["entropy"] == pytest.approx(entropy, rel=1e-5)


def test_reward_spread_and_response_lengths_of_a_step():
    trajs = random_batch(random.Random(7))
    values = trajectory_curves(trajs)
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float64)
    lengths = torch.tensor(sorted(t.n_scored for t in trajs), dtype=torch.float64)
    assert values[Metric.REWARD_STD] == pytest.approx(float(rewards.std(unbiased=False)))
    assert (values[Metric.REWARD_MIN], values[Metric.REWARD_MAX]) == (float(rewards.min()), float(rewards.max()))
    assert values["response_length/p90"] == pytest.approx(float(torch.quantile(lengths, 0.9)))
    assert values["response_length/p50"] == pytest.approx(float(torch.quantile(lengths, 0.5)))
    assert values["response_length/max"] == float(lengths.max()) and percentile([1.0, 3.0], 0.5) == 2.0


@pytest.mark.slow
def test_a_tiny_run_emits_every_curve_and_the_processes_cpu_and_memory():
    cfg = load_config("configs/quickstart.yaml", {"train.steps": 2, "algorithm.kl_coef": 0.05})
    sink = MemorySink()
    train(cfg, sink)
    steps = [e["values"] for e in sink.events if e.get("type") == "metrics"]
    assert len(steps) == 2
    for values in steps:
        for name in (Metric.PG_LOSS, Metric.ENTROPY, Metric.KL_REF, Metric.REWARD_STD, Metric.REWARD_MIN,
                     Metric.REWARD_MAX, "response_length/mean", "response_length/p90", Metric.GRAD_NORM):
            assert name in values, name
        assert values[Metric.LR] == cfg.train.lr
        assert values[Metric.REWARD_MIN] <= values[Metric.REWARD_MEAN] <= values[Metric.REWARD_MAX]
        assert 0 < values[Metric.ENTROPY] and values[Metric.KL_REF] >= 0
        # the step's scored tokens, as the rollout spans counted what each turn generated
        assert values["response_length/mean"] * cfg.train.prompts_per_step * cfg.train.group_size == \
            values[Metric.TOKENS]
        for proc in ("driver", "rollout_0"):
            assert values[f"system/{proc}/rss_mb"] > 10
            assert values[f"system/{proc}/cpu_percent"] >= 0
    assert sum(v["system/driver/cpu_percent"] for v in steps) > 0  # the learner did work in its steps


@pytest.mark.slow
def test_every_trajectory_is_recorded_with_its_decoded_text_after_its_step():
    cfg = load_config("configs/quickstart.yaml", {"train.steps": 2})
    sink = MemorySink()
    trainer, _ = train(cfg, sink)
    types = [e["type"] for e in sink.events]
    records = [e for e in sink.events if e["type"] == "trajectory"]
    per_step = cfg.train.prompts_per_step * cfg.train.group_size
    assert sorted(e["step"] for e in records) == [0] * per_step + [1] * per_step
    assert len({e["traj"] for e in records}) == 2 * per_step
    assert max(i for i, t in enumerate(types) if t == "trajectory") < types.index("run", 1)  # before "finished"
    backward = {e["traj"] for e in sink.events if e["type"] == "span" and e["kind"] == "learner.backward"}
    tok = trainer.parts.tokenizer
    for e in records:
        roles = [s["role"] for s in e["segments"]]
        assert roles[0] == "prompt" and roles.count("turn") == e["turns"] >= 1
        assert sum(s["tokens"] for s in e["segments"] if s["role"] == "turn") == e["tokens"]
        # the segments are the trajectory's tokens in order: their texts decode the whole of it
        spans = [s for s in sink.events if s["type"] == "span" and s.get("traj") == e["traj"]
                 and s["kind"] == "rollout.generate"]
        assert sum(s["tokens"] for s in spans) == e["tokens"]
        tool_calls = [s for s in e["segments"] if s.get("tool_call")]
        assert len(tool_calls) == roles.count("observation")
        # learnt, or skipped because its gradient is exactly zero (A = 0, no KL/entropy term)
        assert (e["traj"] in backward) == (not e["zero_gradient"]), e
        assert e["zero_gradient"] == (e["advantage"] == 0.0)
    text = "".join(s["text"] for s in records[0]["segments"])
    assert len(text) > 10 and tok.decode(tok.encode(text, add_special_tokens=False)) == text


def test_entropy_past_its_cap_is_taken_at_evenly_strided_scored_positions(monkeypatch):
    model = tiny_llama(torch.float32, seed=0)
    ids = torch.tensor([[(7 * k) % VOCAB for k in range(40)]] * 2)
    at = torch.zeros(2, 40, dtype=torch.long)
    at[:, 10:] = 1  # 60 scored positions
    with torch.no_grad():
        full = token_logprobs(model, ids, with_entropy=True)[1]
        exact = token_logprobs(model, ids, entropy_at=at)[1]
        monkeypatch.setattr(objectives, "ENTROPY_POSITIONS", 8)
        strided = token_logprobs(model, ids, entropy_at=at)[1]
    taken = ~exact.isnan()
    assert torch.equal(taken, at.bool()) and torch.allclose(exact[taken], full[taken], rtol=1e-5)
    some = ~strided.isnan()
    assert 6 <= int(some.sum()) <= 8 and bool((at.bool() | ~some).all())  # only scored positions
    assert torch.allclose(strided[some], full[some], rtol=1e-5)


def test_data_parallel_ranks_shares_combine_into_the_single_learners_curves():
    """Two learners each fed half of the groups, normalised by the whole batch (as data-parallel
    ranks are), give the curves of one learner fed everything."""
    from learner.driver.curves import learner_curves

    trajs = random_batch(random.Random(11))
    groups = sorted({t.group for t in trajs})
    algo = AlgorithmConfig(kl_coef=0.1)
    ref = tiny_llama(torch.float32, seed=1)
    _, whole = trained(StreamingLearner, "adaptive", algo, ref, trajs, trajs)
    totals = (sum(t.n_scored for t in trajs), len(trajs))
    shares = []
    for half in (groups[::2], groups[1::2]):
        mine = [t for t in trajs if t.group in half]
        learner = StreamingLearner(tiny_llama(torch.float32, seed=0), algo, ref_model=ref, options=LearnerOptions())
        learner.begin_batch({g: sum(t.group == g for t in mine) for g in half})
        learner.learn(mine)
        shares.append(learner.finish_batch(totals=totals))
    single, combined = learner_curves([whole], None), learner_curves(shares, None)
    assert combined.keys() == single.keys() == {Metric.PG_LOSS, Metric.ENTROPY, Metric.KL_REF}
    for name in single:
        assert combined[name] == pytest.approx(single[name], rel=1e-5, abs=1e-7), name
