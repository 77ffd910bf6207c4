"""learner.speed_probe: a fixed learner computation that measures the machine, not the run."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from learner.speed_probe import speed_probe_ms


def test_the_probe_times_a_backward_and_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=4, intermediate_size=64, max_position_embeddings=128))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    rng_before = torch.get_rng_state()
    assert speed_probe_ms(model, passes=3) > 0
    assert all(p.grad is None for p in model.parameters())  # nothing leaks into the next batch's gradient
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert torch.equal(torch.get_rng_state(), rng_before)  # training's random draws are not shifted
