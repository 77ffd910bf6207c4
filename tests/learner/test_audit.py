"""Step dump → independent audit round trips."""

import json
import random
from collections import Counter

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from learner.audit import AuditError, audit_dump, write_dump
from learner.config import AdvantageConfig, AlgorithmConfig
from learner.exactness import random_batch, scored_turns
from learner.gradients import StreamingLearner

torch.set_num_threads(1)


def stock_llama(dtype: torch.dtype, seed: int) -> LlamaForCausalLM:
    """A plain HF Llama, as the trainer loads it (the audit reloads the same class from disk)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    return LlamaForCausalLM(config).to(dtype)


def stream_step(model, algo, trajs) -> dict[str, torch.Tensor]:
    """One streaming step in a shuffled arrival order, KL to the pre-step model (step 0)."""
    ref = stock_llama(model.dtype, 0)
    ref.load_state_dict(model.state_dict())
    learner = StreamingLearner(model, algo, ref)
    learner.begin_batch(dict(Counter(t.group for t in trajs)))
    rng = random.Random(9)
    if algo.objective == "grpo":
        for traj in rng.sample(trajs, len(trajs)):
            learner.on_trajectory(traj)
    else:
        turns = [turn for traj in trajs for turn in scored_turns(traj)]
        for turn in rng.sample(turns, len(turns)):
            learner.on_turn(turn)
    learner.finish_batch()
    return {n: p.grad.detach().float().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize(
    "objective,mode,dtype",
    [("grpo", "seq-mean-token-mean", torch.float32), ("opd", "token-mean", torch.float32),
     ("grpo", "token-mean", torch.float64)],
)
def test_dump_then_audit_passes(tmp_path, objective, mode, dtype):
    model = stock_llama(dtype, 1)
    algo = AlgorithmConfig(objective=objective, loss_agg_mode=mode, kl_coef=0.1, entropy_coef=0.05,
                           advantage=AdvantageConfig(std="unbiased"))
    trajs = random_batch(random.Random(4))
    grads = stream_step(model, algo, trajs)
    write_dump(tmp_path, model, None, trajs, algo, grads)
    result = audit_dump(tmp_path)
    assert result["passed"] and result["n_traj"] == len(trajs), result
    assert result["rel_error"] < 1e-6


def test_audit_fails_a_tampered_gradient(tmp_path):
    model = stock_llama(torch.float32, 2)
    algo = AlgorithmConfig()
    trajs = random_batch(random.Random(5))
    grads = stream_step(model, algo, trajs)
    # A 1% error everywhere must be seen as exactly that; the batch has offset-100 rewards,
    # whose advantages the audit must not round in float32.
    write_dump(tmp_path, model, None, trajs, algo, {n: g * 1.01 for n, g in grads.items()})
    result = audit_dump(tmp_path)
    assert not result["passed"] and result["rel_error"] == pytest.approx(0.01, rel=1e-3)


def test_audit_names_a_bad_field(tmp_path):
    model = stock_llama(torch.float32, 3)
    algo = AlgorithmConfig()
    trajs = random_batch(random.Random(6))
    write_dump(tmp_path, model, None, trajs, algo, stream_step(model, algo, trajs))
    batch = json.loads((tmp_path / "batch.json").read_text())
    batch["trajectories"][1]["loss_mask"] = batch["trajectories"][1]["loss_mask"][:-1]
    (tmp_path / "batch.json").write_text(json.dumps(batch))
    with pytest.raises(AuditError, match=r"trajectories\[1\]\.loss_mask"):
        audit_dump(tmp_path)
    (tmp_path / "grad.pt").unlink()
    with pytest.raises(AuditError, match="grad.pt"):
        audit_dump(tmp_path)
