"""The keyed Gumbel-max sampler (learner/rollout/engine/sampling.py, docs/math.md "Sampling"): its
draws follow softmax(logits / T) within the top-p nucleus, a row's tokens do not depend on the
batch it lands in or on when it joined a running call, a turn continued from a later stream
position samples what the whole turn would have, and the sample at a position is recomputed
from a prefill forward's logits."""

from __future__ import annotations

import math

import pytest
import torch

from learner.rollout.engine.torch_engine import TorchEngine
from learner.models.loading import load_model, load_tokenizer, resolve_model_dir
from learner.rollout.engine.sampling import SamplingParams, Stream, keyed_sample, row_keys


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper 0.001 quantile of chi-square (Wilson-Hilferty; z the normal's 0.999 quantile)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 1.0), (1.3, 0.8)])
def test_draws_follow_the_tempered_nucleus(temperature: float, top_p: float) -> None:
    logits = torch.tensor([2.0, 1.5, 0.3, 0.0, -0.5, -1.0, -3.0])
    n = 40_000
    keys = row_keys([Stream(seed) for seed in range(n)], [3] * n, "cpu")
    tokens = keyed_sample(logits.expand(n, -1), temperature, top_p, keys)
    p = torch.softmax(logits.double() / temperature, -1)
    sorted_p, idx = p.sort(descending=True)
    inside = idx[(sorted_p.cumsum(0) - sorted_p) < top_p]
    counts = torch.bincount(tokens, minlength=len(logits)).double()
    assert counts[[i for i in range(len(logits)) if i not in inside.tolist()]].sum() == 0  # outside the nucleus: never
    expected = p[inside] / p[inside].sum() * n
    stat = float(((counts[inside] - expected) ** 2 / expected).sum())
    assert stat < chi2_critical(len(inside) - 1), (stat, counts[inside].tolist(), expected.tolist())


def test_positions_and_streams_draw_independently() -> None:
    """Neighbouring positions of one stream, and one position of neighbouring streams, are not the same draw."""
    logits = torch.zeros(4000, 50)
    along = keyed_sample(logits, 1.0, 1.0, row_keys([Stream(7)] * 4000, list(range(4000)), "cpu"))
    across = keyed_sample(logits, 1.0, 1.0, row_keys([Stream(s) for s in range(4000)], [0] * 4000, "cpu"))
    for drawn in (along, across):
        assert (drawn[1:] == drawn[:-1]).double().mean() < 0.05  # 1/50 expected
        assert len(set(drawn.tolist())) == 50


def test_greedy_at_temperature_zero() -> None:
    logits = torch.randn(5, 9)
    assert torch.equal(keyed_sample(logits, 0.0, 1.0, row_keys([Stream(1)] * 5, [0] * 5, "cpu")), logits.argmax(-1))


@pytest.fixture(scope="module")
def tiny():
    policy = resolve_model_dir("builtin:tiny")
    tok = load_tokenizer(policy)
    return load_model(policy), tok


def prompts(tok) -> list[list[int]]:
    texts = ["Q: 3+4=?", "Q: 12*3-1=?", "Q: 7", "Q: (2+2)*9=? think"]
    return [tok.encode(t, add_special_tokens=False) for t in texts]


@pytest.mark.parametrize("continuous", [False, True])
def test_a_row_samples_the_same_tokens_in_any_batch(tiny, continuous: bool) -> None:
    model, tok = tiny
    engine = TorchEngine(model, tok.pad_token_id, continuous_batching=continuous)
    params = SamplingParams(20, [], temperature=1.0, top_p=0.95)
    ps = prompts(tok)
    together = engine.generate(ps, params, seeds=[5, 6, 7, 8])
    alone = [engine.generate([p], params, seeds=[s])[0] for p, s in zip(ps, [5, 6, 7, 8])]
    shuffled = engine.generate(ps[::-1], params, seeds=[8, 7, 6, 5])[::-1]
    for a, b, c in zip(together, alone, shuffled):
        assert a.token_ids == b.token_ids == c.token_ids


def test_a_row_that_joins_late_samples_the_same_tokens(tiny) -> None:
    model, tok = tiny
    engine = TorchEngine(model, tok.pad_token_id, continuous_batching=True)
    params = SamplingParams(20, [], temperature=1.0)
    ps = prompts(tok)
    waiting = [(ps[2], 7), (ps[3], 8)]
    calls = []

    def admit(min_rows: int) -> list[tuple]:
        calls.append(min_rows)
        return [waiting.pop(0)] if len(calls) in (3, 9) and waiting else []

    joined = engine.generate(ps[:2], params, seeds=[5, 6], admit=admit)
    direct = engine.generate(ps, params, seeds=[5, 6, 7, 8])
    assert [c.token_ids for c in joined] == [c.token_ids for c in direct]


@pytest.mark.parametrize("continuous", [False, True])
def test_a_turn_continued_from_a_later_position_samples_its_rest(tiny, continuous: bool) -> None:
    model, tok = tiny
    engine = TorchEngine(model, tok.pad_token_id, continuous_batching=continuous)
    params = SamplingParams(16, [], temperature=1.0)
    p = prompts(tok)[1]
    whole = engine.generate([p], params, seeds=[42])[0].token_ids
    rest = engine.generate([p + whole[:5]], params, seeds=[Stream(42, 5)])[0].token_ids
    assert whole[:5] + rest == whole


def test_the_sample_is_recomputed_from_a_prefill_forward(tiny) -> None:
    model, tok = tiny
    engine = TorchEngine(model, tok.pad_token_id)
    params = SamplingParams(20, [], temperature=1.0)
    ps = prompts(tok)
    outs = engine.generate(ps, params, seeds=[1, 2, 3, 4])
    for p, seed, out in zip(ps, [1, 2, 3, 4], outs):
        seq = torch.tensor([p + out.token_ids])
        with torch.no_grad():
            logits = model(input_ids=seq).logits[0, len(p) - 1:-1].float()
        n = len(out.token_ids)
        again = keyed_sample(logits, 1.0, 1.0, row_keys([Stream(seed)] * n, list(range(n)), "cpu"))
        assert again.tolist() == out.token_ids
