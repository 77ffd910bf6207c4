"""Shared-prompt backward under LoRA (``model.lora`` with ``learner.shared_prompt_backward``): the
adapters' gradient with each group's prompt forwarded and back-propagated once equals the one
without, whichever layers' keys/values depend on an adapter, and a short real run with it equals
one without and passes the audit."""

import json
import random
import subprocess
import sys

import pytest
import torch
import yaml

from learner.config import LOSS_AGG_MODES, AlgorithmConfig
from learner.checks.exactness import (
    LORA_TARGETS, TOLERANCE, random_batch, relative_error, run_case, shared_prompt_specs, streamed_gradient,
    tiny_llama, tiny_lora_llama,
)
from learner.grad.learners.common import LearnerOptions
from learner.grad.batching.shared_prompt import PromptKV

torch.set_num_threads(1)


def on_and_off(learner: str, cap: int | None, targets: tuple[str, ...], dtype: torch.dtype):
    """The adapters' gradient of one seeded batch (groups sharing prompts), shared prompt off and on."""
    rng = random.Random(f"lora/{learner}/{cap}/{targets}/{dtype}")
    model = tiny_lora_llama(dtype, rng.randrange(2**31), targets)
    ref_model = tiny_llama(dtype, rng.randrange(2**31))
    algo = AlgorithmConfig(loss_agg_mode=rng.choice(LOSS_AGG_MODES), kl_coef=0.1, entropy_coef=0.05)
    trajs = random_batch(rng, shared_prompt=True)
    grads, stats = {}, {}
    for shared in (False, True):
        options = LearnerOptions(path=learner, micro_batch_tokens=48, max_open_groups=cap,
                                 shared_prompt_backward=shared)
        grads[shared], stats[shared] = streamed_gradient(model, ref_model, algo, trajs, random.Random(7), options)
    return model, grads, stats[True]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("targets", LORA_TARGETS)
@pytest.mark.parametrize("learner,cap", [("micro-batched", None), ("per-trajectory", None), ("adaptive", 2)])
def test_the_adapters_gradient_is_the_same_with_the_shared_prompt_on_and_off(learner, cap, targets, dtype):
    model, grads, stats = on_and_off(learner, cap, targets, dtype)
    assert stats["shared_prompt_rows"] > 0
    assert set(grads[True]) == {n for n, p in model.named_parameters() if p.requires_grad}
    assert all(".lora_A." in n or ".lora_B." in n for n in grads[True])  # gradients into the adapters only
    assert all(p.grad is None for p in model.parameters() if not p.requires_grad)
    assert sum(float(g.square().sum()) for g in grads[False].values()) > 0
    assert relative_error(grads[True], grads[False]) <= TOLERANCE[dtype]


def test_the_prompts_backward_reaches_the_adapters(monkeypatch):
    # k_proj and v_proj adapted: every layer's prompt keys/values depend on an adapter
    monkeypatch.setattr(PromptKV, "cotangent", lambda self: None)  # the prompt's backward dropped
    _, grads, _ = on_and_off("adaptive", 2, LORA_TARGETS[0], torch.float64)
    assert relative_error(grads[True], grads[False]) > 1e-3


@pytest.mark.parametrize("spec", [s for dtype in (torch.float32, torch.float64) for s in shared_prompt_specs(dtype)
                                  if s.lora], ids=str)
def test_lora_shared_prompt_specs_match_the_reference(spec):
    case = run_case(spec, random.Random(spec.seed_key(7, 0)))
    assert case["passed"] and case["shared_prompt_rows"] > 0, case


@pytest.mark.slow
def test_a_lora_run_with_the_shared_prompt_equals_one_without_and_both_dumps_pass_the_audit(tmp_path):
    # float64 (round-off ~1e-16); KL and entropy on, so every member has a backward; dumped at
    # step 1, after an update: the adapters' B is no longer 0, so A's gradient is not 0 either
    cfg = yaml.safe_load(open("configs/quickstart.yaml"))
    cfg["model"].update(dtype="float64", lora={"rank": 4, "alpha": 8,
                                               "target_modules": ["q_proj", "k_proj", "v_proj", "down_proj"]})
    cfg["algorithm"].update(kl_coef=0.04, entropy_coef=0.01)
    cli = [sys.executable, "-m", "learner.cli"]
    runs = {}
    for shared in (False, True):
        cfg["learner"] = {"shared_prompt_backward": shared}
        arm = tmp_path / ("on" if shared else "off")
        arm.mkdir()
        (arm / "c.yaml").write_text(yaml.safe_dump(cfg))
        r = subprocess.run(cli + ["train", "--config", str(arm / "c.yaml"), "--steps", "2", "--quiet", "--dump-step",
                                  str(arm / "dump"), "--dump-at", "1", "--events", str(arm / "ev.jsonl")],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
        audit = subprocess.run(cli + ["audit", str(arm / "dump")], capture_output=True, text=True, timeout=600)
        assert audit.returncode == 0 and json.loads(audit.stdout)["passed"], audit.stdout + audit.stderr[-2000:]
        steps = [json.loads(line)["values"] for line in (arm / "ev.jsonl").read_text().splitlines()
                 if '"metrics"' in line]
        runs[shared] = (steps, torch.load(arm / "dump" / "grad.pt", weights_only=True),
                        json.loads((arm / "dump" / "batch.json").read_text())["trajectories"])
    (steps_off, g_off, batch_off), (steps_on, g_on, batch_on) = runs[False], runs[True]
    same = {t["id"]: t["input_ids"] for t in batch_on} == {t["id"]: t["input_ids"] for t in batch_off}
    assert same  # the same step-1 batch (dumped in arrival order, which the tool latencies vary)
    assert [s["learner/shared_prompt_rows"] for s in steps_on] == [16.0, 16.0]  # every member, both steps
    assert all("learner/shared_prompt_rows" not in s for s in steps_off)
    assert set(g_on) == set(g_off) and all("lora_" in n for n in g_on)
    assert all(float(g.abs().max()) > 0 for n, g in g_off.items() if "lora_A" in n)
    num = sum(float((g_on[n] - g_off[n]).square().sum()) for n in g_off) ** 0.5
    den = sum(float(g_off[n].square().sum()) for n in g_off) ** 0.5
    assert num <= 1e-12 * den, num / den
