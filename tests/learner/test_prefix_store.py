"""KV reuse across turns (``rollout.reuse_kv``, docs/architecture.md "KV reuse across turns"): what
the prefix store keeps, when it refuses to reuse, and that a weight load forgets everything."""

from __future__ import annotations

import pytest
import torch

from learner.config import ConfigError, parse_config
from learner.rollout.engine.torch_engine import TorchEngine
from learner.models.loading import load_model, load_tokenizer, resolve_model_dir
from learner.rollout.engine.prefix_store import MIN_TOKENS, PrefixStore, past_cache
from learner.rollout.engine.sampling import SamplingParams, Stream


class _Layer:
    def __init__(self, keys, values):
        self.keys, self.values = keys, values


class _Cache:
    def __init__(self, n_layers=2, rows=3, cols=6):
        g = torch.Generator().manual_seed(0)
        self.layers = [_Layer(torch.randn(rows, 2, cols, 4, generator=g), torch.randn(rows, 2, cols, 4, generator=g))
                       for _ in range(n_layers)]


def _mask(rows, cols, ones):
    attn = torch.zeros((rows, cols), dtype=torch.long)
    for r, cs in ones.items():
        attn[r, cs] = 1
    return attn


def test_keeps_rows_with_their_mask_and_gives_each_back_once_right_aligned_for_a_longer_prompt():
    cache, store = _Cache(), PrefixStore()
    # row 1 attends to columns 1, 2, 4 (a masked gap: it joined after a reused prefix); row 2 to 3-5
    attn = _mask(3, 6, {1: [1, 2, 4], 2: [3, 4, 5]})
    store.keep(["a", "b"], [[7, 8, 9], [1, 2, 3]], cache, [1, 2], attn)
    a, b = store.take("a", [7, 8, 9, 5, 6]), store.take("b", [1, 2, 3, 4])
    assert a is not None and b is not None and a.tokens == [7, 8, 9]
    layers, mask = past_cache([None, a, b])
    assert mask.tolist() == [[0] * 6, attn[1].tolist(), attn[2].tolist()]
    assert torch.equal(layers[0][0][1], cache.layers[0].keys[1]) and torch.equal(layers[1][1][2], cache.layers[1].values[2])
    assert not layers[0][0][0].any()  # a row without a kept prefix: all padding
    assert store.take("a", [7, 8, 9, 5, 6]) is None  # taken: a loop's turn uses it once
    assert (store.hits, store.misses, store.tokens_reused) == (2, 1, 6)


@pytest.mark.parametrize("prompt", [[7, 8, 1, 5], [7, 8, 9], [7, 8]])
def test_a_prompt_that_does_not_extend_the_kept_tokens_is_prefilled_in_full(prompt):
    store = PrefixStore()
    store.keep(["loop"], [[7, 8, 9]], _Cache(), [0], _mask(3, 6, {0: [3, 4, 5]}))
    assert store.take("loop", prompt) is None and len(store) == 0


def test_nothing_is_kept_when_the_mask_does_not_count_one_column_per_token():
    store = PrefixStore()
    store.keep(["loop"], [[7, 8, 9]], _Cache(), [0], _mask(3, 6, {0: [4, 5]}))
    assert len(store) == 0


def test_the_oldest_entries_go_beyond_the_bound():
    store = PrefixStore(max_entries=2)
    for k in range(3):
        store.keep([k], [[1, 2]], _Cache(), [0], _mask(3, 6, {0: [4, 5]}))
    assert len(store) == 2 and store.take(0, [1, 2, 3]) is None and store.take(2, [1, 2, 3]) is not None


def test_an_engine_forgets_kept_keys_and_values_when_its_weights_change():
    policy = resolve_model_dir("builtin:tiny")
    tok = load_tokenizer(policy)
    model = load_model(policy)
    engine = TorchEngine(model, tok.pad_token_id, continuous_batching=True, reuse_kv=True)
    prompt = tok("12+7=" * 13)["input_ids"]  # a context of >= MIN_TOKENS: kept
    out = engine.generate([prompt], SamplingParams(4, []), seeds=[1], keys=["loop"])
    assert len(engine.prefixes) == 1 and len(engine.prefixes._entries["loop"].tokens) == len(prompt) + 3
    engine.load_weights({n: p.detach().clone() for n, p in model.named_parameters()}, version=1)
    assert len(engine.prefixes) == 0
    # without keys (or with the store off: fixed batches, the learner's eval) nothing is kept
    engine.generate([prompt + out[0].token_ids], SamplingParams(4, []), seeds=[2])
    assert len(engine.prefixes) == 0
    assert TorchEngine(model, tok.pad_token_id, continuous_batching=False, reuse_kv=True).prefixes is None
    # a short context is not worth keeping
    engine.generate([prompt[:MIN_TOKENS - 4]], SamplingParams(4, []), seeds=[3], keys=["short"])
    assert len(engine.prefixes) == 0


def test_a_row_cut_mid_turn_resumes_from_its_kept_keys_and_values_and_samples_the_same_tokens():
    """A draft cut to yield the engine (``cut``) keeps its keys/values as an ending row does: its
    resume forwards only the token it sampled last, and samples what the uncut row sampled."""
    policy = resolve_model_dir("builtin:tiny")
    tok = load_tokenizer(policy)
    model = load_model(policy)
    prompts = [tok("12+7=" * 13)["input_ids"], tok("3*4=" * 17)["input_ids"]]  # >= MIN_TOKENS: kept
    params = SamplingParams(12, [], temperature=1.0)
    whole = TorchEngine(model, tok.pad_token_id, continuous_batching=True, reuse_kv=True).generate(
        prompts, params, seeds=[5, 6], keys=["a", "b"])
    engine = TorchEngine(model, tok.pad_token_id, continuous_batching=True, reuse_kv=True)
    steps = iter(range(100))
    part = engine.generate(prompts, params, seeds=[5, 6], keys=["a", "b"], cut=lambda: [0, 1] if next(steps) == 4 else [])
    assert [len(c.token_ids) for c in part] == [5, 5] and not any(c.stopped for c in part)
    assert [len(engine.prefixes._entries[k].tokens) for k in "ab"] == [len(p) + 4 for p in prompts]
    forwarded: list[int] = []
    forward = engine.model.forward

    def recording_forward(*args, **kwargs):
        forwarded.append(int(kwargs["input_ids"].shape[1]))
        return forward(*args, **kwargs)

    engine.model.forward = recording_forward
    rest = engine.generate([p + c.token_ids for p, c in zip(prompts, part)], params,
                           seeds=[Stream(5, 5), Stream(6, 5)], keys=["a", "b"])
    assert forwarded[0] == 1  # the resume's prefill: the last sampled token only, not the contexts
    assert engine.stats.extra["prefill_tokens_reused"] == sum(len(p) + 4 for p in prompts)
    for w, p, r in zip(whole, part, rest):
        assert p.token_ids + r.token_ids == w.token_ids
        assert max(abs(x - y) for x, y in zip(p.logprobs + r.logprobs, w.logprobs)) < 5e-5


def test_a_loop_that_ends_drops_its_kept_keys_and_values():
    store = PrefixStore()
    store.keep(["a", "b"], [[1, 2], [3, 4]], _Cache(rows=2), [0, 1], _mask(2, 6, {0: [4, 5], 1: [4, 5]}))
    store.drop("a")
    store.drop("missing")  # (a loop that never kept any)
    assert len(store) == 1 and store.take("b", [3, 4, 5]) is not None


@pytest.mark.parametrize("value", ["yes please", [True]])
def test_reuse_kv_is_validated_naming_the_field(value):
    with pytest.raises(ConfigError) as err:
        parse_config({"rollout": {"reuse_kv": value}})
    assert str(err.value).startswith("rollout.reuse_kv: ")
