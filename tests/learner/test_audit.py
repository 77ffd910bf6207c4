"""Step dump → independent audit round trips."""

import json
import random
from collections import Counter

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from learner.audit import AuditError, audit_dump, write_dump
from learner.config import AdvantageConfig, AlgorithmConfig
from learner.checks.exactness import INIT_STD, random_batch, scored_turns, tiny_llama
from learner.grad.learners.off_policy import OffPolicyLearner
from learner.grad.learners.on_policy import StreamingLearner
from learner.grad.objectives import token_logprobs
from learner.models.loading import widen_norms

torch.set_num_threads(1)


def stock_llama(dtype: torch.dtype, seed: int) -> LlamaForCausalLM:
    """A plain HF Llama, as the trainer loads it (the audit reloads the same class from disk)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                         attn_implementation="sdpa",  # as from_pretrained picks it
                         initializer_range=INIT_STD)  # peaked distributions, as a trained LM (exactness.py)
    return widen_norms(LlamaForCausalLM(config).to(dtype))  # as learner.models.loading.load_model


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
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}  # in the model dtype, as the trainer dumps


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


def off_policy_step(dtype: torch.dtype, objective: str, seed: int):
    """An async step >= 1 as the trainer makes it: the batch was sampled by the previous
    version (behaviour log-probs from that model), the learner trains the moved model."""
    behaviour = tiny_llama(dtype, seed)
    trajs = random_batch(random.Random(seed))
    with torch.no_grad():
        for t in trajs:
            logp = token_logprobs(behaviour, torch.tensor([t.input_ids]))[0][0]
            t.behavior_logprobs = [float(v) if m else 0.0 for v, m in zip(logp, t.loss_mask)]
            t.turn_versions = [0] * len(t.turn_spans)
    model = tiny_llama(dtype, seed)
    with torch.no_grad():  # one optimizer step later: large enough that some ratios leave [0.8, 1.2]
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p) * p.abs().mean())
    algo = AlgorithmConfig(objective=objective, loss_agg_mode="token-mean", kl_coef=0.1, entropy_coef=0.05)
    OffPolicyLearner(model, algo, behaviour).train_batch(trajs)
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    step = {"schedule": "async", "step": 1, "trained_version": 1, "group_size": 0, "off_policy": True,
            "sampling": {"temperature": 1.0, "top_p": 1.0}}
    return model, behaviour, algo, trajs, grads, step


@pytest.mark.parametrize("objective,dtype", [("grpo", torch.float32), ("opd", torch.float32),
                                             ("grpo", torch.float64), ("opd", torch.float64)])
def test_audit_recomputes_a_clipped_off_policy_step(tmp_path, objective, dtype):
    model, behaviour, algo, trajs, grads, step = off_policy_step(dtype, objective, seed=11)
    write_dump(tmp_path, model, None, trajs, algo, grads, ref_model=behaviour, step=step)
    result = audit_dump(tmp_path)
    assert result["off_policy"] and result["passed"], result
    assert result["max_abs_log_ratio"] > 0.2 and 0 < result["clip_frac"] < 1, result  # ratios != 1, some clipped
    assert result["rel_error"] <= (1e-12 if dtype == torch.float64 else 1e-5)
    dumped = torch.load(tmp_path / "grad.pt", weights_only=True)
    assert all(g.dtype == dtype for g in dumped.values())  # the model's dtype, not always float32
    batch = json.loads((tmp_path / "batch.json").read_text())
    first = batch["trajectories"][0]
    assert batch["step"] == 1 and batch["sampling"] == {"temperature": 1.0, "top_p": 1.0}
    assert first["behavior_logprobs"] == trajs[0].behavior_logprobs and first["turn_spans"] == [list(s) for s in trajs[0].turn_spans]


def test_audit_sees_a_wrong_clip_ratio(tmp_path):
    model, behaviour, algo, trajs, grads, step = off_policy_step(torch.float64, "grpo", seed=12)
    write_dump(tmp_path, model, None, trajs, algo, grads, ref_model=behaviour, step=step)
    batch = json.loads((tmp_path / "batch.json").read_text())
    batch["clip_ratio"] = 0.5  # the learner clipped at 0.2
    (tmp_path / "batch.json").write_text(json.dumps(batch))
    result = audit_dump(tmp_path)
    assert not result["passed"] and result["rel_error"] > 1e-6


def test_a_float64_on_policy_dump_audits_within_1e_12(tmp_path):
    model = tiny_llama(torch.float64, 13)
    algo = AlgorithmConfig(objective="grpo", loss_agg_mode="seq-mean-token-mean", kl_coef=0.1, entropy_coef=0.05)
    trajs = random_batch(random.Random(13))
    stream_step(model, algo, trajs)
    write_dump(tmp_path, model, None, trajs, algo, {n: p.grad.detach().clone() for n, p in model.named_parameters()})
    result = audit_dump(tmp_path)
    assert result["passed"] and result["rel_error"] <= 1e-12, result
