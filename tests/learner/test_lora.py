"""LoRA (``model.lora``): only adapters train, their streamed gradient is exact, the engines
sample from the merged policy, and the final policy is saved (adapter + merged)."""

from __future__ import annotations

import random

import pytest
import torch
from peft import PeftModel

from learner.audit import audit_dump
from learner.config import AlgorithmConfig, LoraSettings, RunConfig
from learner.checks.exactness import TOLERANCE, random_batch, relative_error, tiny_llama
from learner.grad.learners.on_policy import StreamingLearner
from learner.grad.reference import reference_gradient
from learner.lora import grad_buffer_mb, publish_view, with_lora
from learner.rollout.engine.torch_engine import TorchEngine
from learner.models.loading import load_model, resolve_model_dir
from learner.timeline import MemorySink

torch.set_num_threads(1)
SETTINGS = LoraSettings(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])


def lora_model(dtype=torch.float64, seed=0) -> torch.nn.Module:
    model = with_lora(tiny_llama(dtype, seed), SETTINGS)
    with torch.no_grad():  # B starts at 0 (the adapter is a no-op): give both factors a value
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.1)
    return model


def test_only_adapter_parameters_are_trainable_and_the_buffers_shrink():
    model = lora_model(torch.float32)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    full = list(tiny_llama(torch.float32, 0).parameters())
    adapters = [p for p in model.parameters() if p.requires_grad]
    assert grad_buffer_mb(adapters, 3) < 0.2 * grad_buffer_mb(full, 3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streamed_adapter_gradient_matches_the_reference(seed):
    rng = random.Random(seed)
    model = lora_model(seed=seed)
    algo = AlgorithmConfig(objective="grpo", loss_agg_mode=rng.choice(["token-mean", "seq-mean-token-sum"]))
    trajs = random_batch(rng)
    learner = StreamingLearner(model, algo)
    learner.begin_batch({g: sum(t.group == g for t in trajs) for g in {t.group for t in trajs}})
    for traj in rng.sample(trajs, len(trajs)):
        learner.on_trajectory(traj)
    learner.finish_batch()
    streamed = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)  # base: no gradient at all
    model.zero_grad(set_to_none=True)
    reference = reference_gradient(model, trajs, algo)
    assert set(streamed) == set(reference)
    assert sum(float(g.square().sum()) for g in reference.values()) > 0
    assert relative_error(streamed, reference) <= TOLERANCE[torch.float64]


def test_the_engine_samples_from_the_merged_adapter_policy():
    model = lora_model(torch.float32, seed=3)
    view = publish_view(model)
    plain = tiny_llama(torch.float32, 3)
    assert set(view) == {n for n, _ in plain.named_parameters()}  # every weight, plain names (vLLM reloads all)
    merged = {n for n, p in plain.named_parameters() if not torch.equal(view[n], p)}
    assert merged == {f"model.layers.{i}.{m}.weight" for i in range(2)
                      for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")}
    engine = TorchEngine(tiny_llama(torch.float32, 3), pad_id=0)
    before = engine.score([[1, 5, 9, 2, 7, 3]])[0]
    engine.load_weights(view, version=1)
    after = engine.score([[1, 5, 9, 2, 7, 3]])[0]
    with torch.no_grad():
        ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
        logits = model(input_ids=ids).logits[0, :-1]
        learner = [0.0] + torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None]).squeeze(-1).tolist()
    assert max(abs(a - b) for a, b in zip(after, learner)) < 1e-5  # round-off
    assert max(abs(a - b) for a, b in zip(before, learner)) > 1e-3  # the adapter does change the policy


def test_a_target_module_the_model_lacks_is_named():
    with pytest.raises(ValueError, match=r"^model.lora.target_modules: "):
        with_lora(tiny_llama(torch.float32, 0), LoraSettings(target_modules=["c_attn"]))


@pytest.mark.slow
def test_a_lora_run_trains_adapters_only_and_saves_them(tmp_path):
    from learner.driver.loop import train

    cfg = RunConfig.model_validate({
        "model": {"lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}},
        "task": {"tool_latency": {"distribution": "none"}},
        "train": {"steps": 2, "prompts_per_step": 4, "group_size": 4, "lr": 0.02, "output_dir": str(tmp_path / "out")},
    })
    sink = MemorySink()
    trainer, summary = train(cfg, sink, dump_dir=tmp_path / "dump")
    audit = audit_dump(tmp_path / "dump")  # the dump is the adapter on its base: audited on the adapter
    base = load_model(resolve_model_dir("builtin:tiny"))
    trained = dict(trainer.model.named_parameters())
    for name, p in base.named_parameters():  # every base weight, bit for bit
        key = f"base_model.model.{name}"
        key = key if key in trained else key.replace(".weight", ".base_layer.weight")
        assert torch.equal(trained[key], p), name
    assert any(float(p.detach().abs().max()) > 0 for n, p in trained.items() if "lora_B" in n)  # the adapters moved
    steps = [e["values"] for e in sink.events if e.get("type") == "metrics"]
    assert steps[1]["mismatch/max_abs"] < 1e-4  # the engine sampled step 1 with the updated adapters
    assert steps[0]["memory/grad_buffers_mb"] < 0.05 * grad_buffer_mb(list(base.parameters()), steps[0]["actor/peak_buffers"])
    dumped = torch.load(tmp_path / "dump" / "grad.pt", weights_only=True)
    assert audit["passed"] and all("lora_" in n for n in dumped), audit
    assert sum(float(g.square().sum()) for g in dumped.values()) > 0
    reloaded = PeftModel.from_pretrained(load_model(resolve_model_dir("builtin:tiny")), str(tmp_path / "out"))
    merged = load_model(tmp_path / "out" / "merged")
    ids = torch.tensor([[1, 12, 13, 14]])
    with torch.no_grad():
        assert torch.allclose(reloaded(input_ids=ids).logits, trainer.model(input_ids=ids).logits, atol=1e-5)
        assert torch.allclose(merged(input_ids=ids).logits, trainer.model(input_ids=ids).logits, atol=1e-4)
