"""Torch engine: KV-cache sampling matches a full forward; per-trajectory seeds; weight store."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from learner.rollout.engine.torch_engine import SamplingParams, TorchEngine
from learner.rollout.processes.weights import WeightStore


def tiny_model(seed=0):
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=4, intermediate_size=64, max_position_embeddings=128)
    return LlamaForCausalLM(cfg).eval()


PROMPTS = [[1, 5, 6, 7], [1, 8], [1, 9, 9, 9, 9, 9, 9]]
PARAMS = SamplingParams(max_new_tokens=12, stop_token_ids=[2, 3])


def test_behavior_logprobs_match_a_full_forward_despite_left_padding():
    engine = TorchEngine(tiny_model(), pad_id=0)
    outs = engine.generate(PROMPTS, PARAMS, seeds=[1, 2, 3])
    for prompt, out in zip(PROMPTS, outs):
        assert len(out.token_ids) == len(out.logprobs) > 0
        full = engine.score([prompt + out.token_ids])[0][len(prompt):]
        assert max(abs(a - b) for a, b in zip(full, out.logprobs)) < 1e-5
        assert out.stopped == (out.token_ids[-1] in PARAMS.stop_token_ids)


def test_a_trajectory_samples_the_same_tokens_whatever_batch_it_is_in():
    engine = TorchEngine(tiny_model(), pad_id=0)
    alone = engine.generate([PROMPTS[0]], PARAMS, seeds=[42])[0].token_ids
    batched = engine.generate(PROMPTS[::-1], PARAMS, seeds=[7, 8, 42])[2].token_ids
    assert alone == batched
    other_seed = [engine.generate([PROMPTS[0]], PARAMS, seeds=[s])[0].token_ids for s in range(5)]
    assert len({tuple(t) for t in other_seed}) > 1  # the seed, not the batch, decides


def test_each_row_is_reported_once_the_moment_it_stops():
    engine = TorchEngine(tiny_model(), pad_id=0)
    prompts, seeds = PROMPTS * 4, list(range(12))
    seen: list[tuple[int, int, list[int]]] = []  # (row, engine decode steps so far, its tokens)
    steps = {"n": 0}
    forward = engine.model.forward

    def counting_forward(*args, **kwargs):
        steps["n"] += 1
        return forward(*args, **kwargs)

    engine.model.forward = counting_forward
    outs = engine.generate(prompts, PARAMS, seeds=seeds,
                           on_done=lambda i, c: seen.append((i, steps["n"], list(c.token_ids))))
    assert sorted(i for i, _, _ in seen) == list(range(len(prompts)))  # each row exactly once
    for i, at_step, tokens in seen:
        assert tokens == outs[i].token_ids  # what the callback got is the final completion
        if outs[i].stopped:  # reported after the forward that sampled its stop token, not at the end
            assert at_step == len(tokens)
    stopped_early = [at for i, at, _ in seen if outs[i].stopped and len(outs[i].token_ids) < max(len(o.token_ids) for o in outs)]
    assert stopped_early and min(stopped_early) < steps["n"]


def test_rows_sharing_a_prompt_share_its_prefill_and_sample_as_if_alone():
    engine = TorchEngine(tiny_model(), pad_id=0)
    a, b = PROMPTS[0], PROMPTS[2]
    outs = engine.generate([a, b, a, a], PARAMS, seeds=[5, 6, 7, 8])
    assert engine.stats.extra["prefill_rows_shared"] == 2  # a is forwarded once for three rows
    for prompt, seed, out in zip([a, b, a, a], [5, 6, 7, 8], outs):
        alone = TorchEngine(engine.model, pad_id=0).generate([prompt], PARAMS, seeds=[seed])[0]
        assert out.token_ids == alone.token_ids
        assert max(abs(x - y) for x, y in zip(out.logprobs, alone.logprobs)) < 1e-5


def test_top_p_keeps_only_the_nucleus():
    engine = TorchEngine(tiny_model(), pad_id=0)
    params = SamplingParams(max_new_tokens=1, stop_token_ids=[], top_p=1e-6)
    first = {engine.generate([PROMPTS[1]], params, seeds=[s])[0].token_ids[0] for s in range(8)}
    logits = engine.model(input_ids=torch.tensor([PROMPTS[1]])).logits[0, -1]
    assert first == {int(logits.argmax())}


def test_published_weights_reach_the_engine_and_change_its_logprobs():
    learner, engine = tiny_model(0), TorchEngine(tiny_model(1), pad_id=0)
    store = WeightStore(dict(learner.named_parameters()))
    assert store.read_into(engine.load_weights, want=0) == 0
    seq = [1, 5, 6, 7, 8, 9]
    expected = TorchEngine(learner, pad_id=0).score([seq])[0]
    assert max(abs(a - b) for a, b in zip(engine.score([seq])[0], expected)) < 1e-6
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(0.05 * torch.randn_like(p))
    store.publish(dict(learner.named_parameters()), 1)
    assert store.read_into(engine.load_weights, want=1) == 1 and engine.version == 1
    after = TorchEngine(learner, pad_id=0).score([seq])[0]
    got = engine.score([seq])[0]
    assert max(abs(a - b) for a, b in zip(got, after)) < 1e-6
    assert max(abs(a - b) for a, b in zip(got, expected)) > 1e-3


def test_the_store_is_its_own_shared_fp32_host_copy_of_the_weights():
    learner = tiny_model(0).to(torch.bfloat16)
    store = WeightStore(dict(learner.named_parameters()))
    assert all(t.is_shared() and t.device.type == "cpu" and t.dtype == torch.float32 for t in store.tensors.values())
    name, param = next(iter(learner.named_parameters()))
    before = store.tensors[name].clone()
    with torch.no_grad():
        param.add_(1.0)  # the learner's next update reaches readers only through publish
    assert torch.equal(store.tensors[name], before)
    store.publish(dict(learner.named_parameters()), 1)
    assert torch.equal(store.tensors[name], param.detach().float())


# ---------------------------------------------------------------- continuous batching


def test_rows_admitted_mid_call_sample_as_if_generated_alone():
    """Rows joined to a running call between decode steps (and rows leaving it as they stop)
    get the same tokens and behavior log-probs as when each is generated alone."""
    model = tiny_model()
    params = SamplingParams(max_new_tokens=20, stop_token_ids=[2])
    alone = {s: TorchEngine(model, pad_id=0, continuous_batching=False).generate([PROMPTS[s % 3]], params, seeds=[s])[0]
             for s in range(9)}
    waiting = [[(PROMPTS[s % 3], s)] for s in (3, 4)] + [[(PROMPTS[5 % 3], 5), (PROMPTS[6 % 3], 6)]] + [[(PROMPTS[s % 3], s)] for s in (7, 8)]
    engine, calls, batch_sizes = TorchEngine(model, pad_id=0), {"n": 0}, []
    forward = engine.model.forward

    def recording_forward(*args, **kwargs):
        if kwargs["input_ids"].shape[1] == 1:  # a decode step (prompts here are longer): (rows, live rows)
            batch_sizes.append((kwargs["input_ids"].shape[0], int(kwargs["attention_mask"][:, -1].sum())))
        return forward(*args, **kwargs)

    def admit(min_rows):
        calls["n"] += 1
        ready = waiting[0] if calls["n"] % 3 == 0 and waiting else []  # every third step, one or two rows
        return waiting.pop(0) if ready and len(ready) >= min_rows else []

    engine.model.forward = recording_forward
    done: dict[int, int] = {}
    outs = engine.generate([PROMPTS[0], PROMPTS[1], PROMPTS[2]], params, seeds=[0, 1, 2], admit=admit,
                           on_done=lambda i, c: done.setdefault(i, len(c.token_ids)))
    assert len(outs) == 9 and sorted(done) == list(range(9))  # admitted rows are rows 3.. in admission order
    assert engine.stats.extra["rows_admitted"] == 6
    for seed, out in enumerate(outs):
        assert out.token_ids == alone[seed].token_ids and out.stopped == alone[seed].stopped
        assert max(abs(x - y) for x, y in zip(out.logprobs, alone[seed].logprobs)) < 1e-5
        assert done[seed] == len(out.token_ids)  # reported with its final tokens
    # a live row is decoded once per token but its last; rows that ended leave the batch once a
    # quarter of it has ended (leaving copies the whole cache), so padding stays under a quarter
    assert sum(live for _, live in batch_sizes) == sum(len(o.token_ids) - 1 for o in outs)
    assert all((rows - live) * 4 < rows for rows, live in batch_sizes)


def test_a_fixed_batch_engine_refuses_rows_mid_call():
    engine = TorchEngine(tiny_model(), pad_id=0, continuous_batching=False)
    with pytest.raises(ValueError, match="admit: .*continuous_batching off"):
        engine.generate([PROMPTS[0]], PARAMS, seeds=[1], admit=lambda min_rows: [])


def test_both_batching_modes_sample_the_same_tokens():
    model = tiny_model()
    fixed = TorchEngine(model, pad_id=0, continuous_batching=False).generate(PROMPTS * 3, PARAMS, seeds=list(range(9)))
    cont = TorchEngine(model, pad_id=0).generate(PROMPTS * 3, PARAMS, seeds=list(range(9)))
    for a, b in zip(fixed, cont, strict=True):
        assert a.token_ids == b.token_ids and a.stopped == b.stopped
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5
