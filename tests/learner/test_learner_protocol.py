"""Every learner through the ``Learner`` protocol the driver uses (learner/grad/learners/protocol.py):
begin_batch, learn, finish_batch, then its own clip and optimizer step."""

import random

import pytest
import torch

from learner.config import AlgorithmConfig
from learner.grad.learners.deterministic import DeterministicLearner
from learner.checks.exactness import random_batch, scored_turns, tiny_llama
from learner.grad.learners.common import LearnerOptions, OptimizerStep
from learner.grad.objectives import token_logprobs
from learner.grad.learners.off_policy import OffPolicyLearner
from learner.grad.learners.on_policy import StreamingLearner

CLIP = 1e-3  # small enough that the tiny model's gradient is clipped


def behaved(model, trajs):
    """Behaviour log-probs from ``model`` itself (an off-policy batch at staleness 0)."""
    for t in trajs:
        with torch.no_grad():
            logp = token_logprobs(model, torch.tensor([t.input_ids]))[0][0].tolist()
        t.behavior_logprobs = [v if m else 0.0 for v, m in zip(logp, t.loss_mask)]
    return trajs


def stepped_by_hand(model, batch_gradient, clip: float) -> tuple[dict, float]:
    """The step the driver's barrier used to take for a learner: clip, AdamW, weights after."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=0.1)
    batch_gradient()
    norm = torch.nn.utils.clip_grad_norm_(params, clip)
    optimizer.step()
    return {n: p.detach().clone() for n, p in model.named_parameters()}, float(norm)


@pytest.mark.parametrize("make", [
    lambda m, opt: StreamingLearner(m, AlgorithmConfig(), options=LearnerOptions(path="micro-batched"), optimizer=opt),
    lambda m, opt: DeterministicLearner(m, AlgorithmConfig(), optimizer=opt),
    lambda m, opt: OffPolicyLearner(m, AlgorithmConfig(), optimizer=opt),
], ids=["streaming", "deterministic", "off-policy"])
def test_each_learner_takes_the_step_the_barrier_took_by_hand(make):
    trajs = random_batch(random.Random(3))
    sizes = {g: sum(t.group == g for t in trajs) for g in {t.group for t in trajs}}

    def learnt(model, learner):
        behaved(model, trajs)
        learner.begin_batch(sizes)
        learner.learn(trajs)
        return learner.finish_batch()

    model = tiny_llama(torch.float64, seed=1)
    want, want_norm = stepped_by_hand(model, lambda: learnt(model, make(model, None)), CLIP)
    model = tiny_llama(torch.float64, seed=1)
    params = [p for p in model.parameters() if p.requires_grad]
    learner = make(model, OptimizerStep(torch.optim.AdamW(params, lr=0.1), CLIP))
    learnt(model, learner)
    assert set(learner.batch_gradient()) == {n for n, p in model.named_parameters() if p.requires_grad}
    norm = learner.step()
    assert norm == want_norm and norm > CLIP
    assert all(torch.equal(p, want[n]) for n, p in model.named_parameters())
    assert all(p.grad is None for p in params)  # gradients cleared for the next batch


def test_the_off_policy_learner_trains_in_finish_batch_exactly_as_train_batch():
    trajs = random_batch(random.Random(5))
    model = tiny_llama(torch.float64, seed=2)
    behaved(model, trajs)
    one_pass = OffPolicyLearner(model, AlgorithmConfig()).train_batch(trajs)
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    learner = OffPolicyLearner(model, AlgorithmConfig())
    learner.begin_batch({t.group: 1 for t in trajs})
    assert learner.learn(trajs[:2]) == {} and not learner.idle_work()  # nothing learnt before the whole batch
    learner.learn(trajs[2:])
    stats = learner.finish_batch()
    assert {k: v for k, v in stats.items() if k != "backward_s"} == {k: v for k, v in one_pass.items() if k != "backward_s"}
    assert all(torch.equal(p.grad, want[n]) for n, p in model.named_parameters())


def test_learners_refuse_calls_out_of_order_naming_the_call():
    model = tiny_llama(torch.float32, seed=0)
    traj = random_batch(random.Random(1))[0]
    learner = OffPolicyLearner(model, AlgorithmConfig())
    with pytest.raises(RuntimeError, match="learn: call begin_batch first"):
        learner.learn([traj])
    with pytest.raises(RuntimeError, match="finish_batch: call begin_batch first"):
        learner.finish_batch()
    learner.begin_batch({traj.group: 1})
    with pytest.raises(ValueError, match="whole trajectories"):
        learner.learn(scored_turns(traj)[:1])
    with pytest.raises(RuntimeError, match="not finished"):
        learner.begin_batch({traj.group: 1})
    with pytest.raises(RuntimeError, match="without an optimizer"):
        StreamingLearner(model, AlgorithmConfig()).step()
