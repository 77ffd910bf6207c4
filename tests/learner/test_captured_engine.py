"""The static-KV-cache decode (``rollout.captured_decode``) samples the same tokens as the eager
engine on the same seeds; on CPU its step runs eagerly, on CUDA it is replayed as a CUDA graph
(that equality is checked by bench/gpu_check.py on a GPU)."""

from types import SimpleNamespace

import pytest
import torch

from learner.config import ConfigError, parse_config
from learner.rollout.engine.captured import CapturedEngine
from learner.rollout.engine.torch_engine import SamplingParams, Stream, TorchEngine
from learner.rollout.engine.factory import make_engine
from learner.rollout.processes.weights import WeightStore
from tests.learner.test_engine import tiny_model

# groups sharing a prompt (shared prefill), left padding, a row that stops early
PROMPTS = [[1, 5, 6, 7], [1, 5, 6, 7], [1, 8], [1, 9, 9, 9, 9, 9, 9], [1, 8]]


def both(model, prompts, params, seeds):
    eager = TorchEngine(model, pad_id=0, continuous_batching=False).generate(prompts, params, seeds)
    static = CapturedEngine(model, pad_id=0).generate(prompts, params, seeds)
    return eager, static


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_the_static_cache_decode_samples_the_eager_engines_tokens(temperature, top_p):
    params = SamplingParams(max_new_tokens=16, stop_token_ids=[2, 3], temperature=temperature, top_p=top_p)
    eager, static = both(tiny_model(), PROMPTS, params, [11, 12, 13, Stream(14, 5), 15])
    assert [c.token_ids for c in static] == [c.token_ids for c in eager]
    assert [c.stopped for c in static] == [c.stopped for c in eager]
    assert any(c.stopped for c in eager) and any(not c.stopped for c in eager)  # both ends are exercised
    for s, e in zip(static, eager):
        assert max(abs(a - b) for a, b in zip(s.logprobs, e.logprobs)) < 1e-5


def test_published_weights_reach_the_static_decode():
    model = tiny_model(0)
    engine = CapturedEngine(model, pad_id=0)
    params = SamplingParams(max_new_tokens=12, stop_token_ids=[])
    before = engine.generate(PROMPTS, params)
    store = WeightStore(dict(tiny_model(1).named_parameters()))
    engine.load_weights(store.tensors, 1)
    after = engine.generate(PROMPTS, params)
    assert [c.token_ids for c in after] == [c.token_ids for c in both(tiny_model(1), PROMPTS, params, None)[0]]
    assert [c.token_ids for c in after] != [c.token_ids for c in before]


def test_capture_needs_a_cuda_model():
    with pytest.raises(ValueError, match="capture: CUDA graphs need a CUDA model"):
        CapturedEngine(tiny_model(), pad_id=0, capture=True)
    assert not CapturedEngine(tiny_model(), pad_id=0).capture  # CPU: the static step runs eagerly


def test_the_config_builds_the_captured_engine_and_refuses_it_with_continuous_batching(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    cfg = parse_config({"rollout": {"captured_decode": True, "continuous_batching": False}})
    assert isinstance(make_engine(cfg, str(tmp_path), SimpleNamespace(pad_token_id=0), 0), CapturedEngine)
    with pytest.raises(ConfigError, match=r"^rollout.captured_decode: decodes a fixed batch per call"):
        parse_config({"rollout": {"captured_decode": True}})


def test_a_step_that_cannot_be_captured_runs_the_static_step_eagerly_and_says_why(monkeypatch):
    """The capture fault injected (CPU has no CUDA graphs): the call still samples the eager tokens."""
    from learner.rollout.engine import captured

    def refuse(self):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(captured.StaticDecode, "_capture", refuse)
    engine = CapturedEngine(tiny_model(), pad_id=0)
    engine.capture = True  # as on CUDA
    params = SamplingParams(max_new_tokens=8, stop_token_ids=[])
    got = engine.generate(PROMPTS, params)
    assert engine.capture_error == "RuntimeError: operation not permitted when stream is capturing"
    assert engine.stats.extra["capture_error"] == engine.capture_error
    assert [c.token_ids for c in got] == [c.token_ids for c in both(tiny_model(), PROMPTS, params, None)[0]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_on_cuda_the_replayed_graph_samples_the_eager_engines_tokens():
    model = tiny_model().cuda()
    params = SamplingParams(max_new_tokens=16, stop_token_ids=[2, 3])
    engine = CapturedEngine(model, pad_id=0)
    static = engine.generate(PROMPTS, params, [11, 12, 13, 14, 15])
    assert engine.capture and engine.capture_error is None  # the graph replayed
    eager = TorchEngine(model, pad_id=0, continuous_batching=False).generate(PROMPTS, params, [11, 12, 13, 14, 15])
    assert [c.token_ids for c in static] == [c.token_ids for c in eager]
