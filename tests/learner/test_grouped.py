"""The grouped backward (learner/grad/batching/grouped.py): per-destination gradients reduced inside one
backward against one autograd backward per destination, its coverage check, the learner's use of
it in mixed micro-batches, and its fallback when a forward refuses it."""

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from learner.config import AlgorithmConfig
from learner.grad.batching.cost_model import BackwardCosts, DrainPolicy, EarlyWorkBudget
from learner.checks.exactness import CaseSpec, random_batch, relative_error, run_case, streamed_gradient, tiny_llama
from learner.grad.batching.grouped import GroupedGradients, NotReducible, destinations
from learner.grad.learners.common import LearnerOptions
from learner.grad.batching.packing import layout
from learner.grad.reference import reference_gradient
from learner.checks.tiny_models import tiny_lora_llama
from learner.models.loading import widen_norms


def llama(seed: int, **extra) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                         initializer_range=0.1, attn_implementation="sdpa", **extra)
    return widen_norms(LlamaForCausalLM(config).double().eval())


def per_destination_check(model, ids, token_dest, count, **forward_kw):
    """The hooks' per-destination gradients vs autograd of each destination's loss alone."""
    params = [p for p in model.parameters() if p.requires_grad]
    grouped = GroupedGradients.for_model(model, params)
    assert grouped is not None
    weights = torch.rand(ids.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def loss(selected):
        logp = torch.log_softmax(model(input_ids=ids, use_cache=False, **forward_kw).logits.double(), -1)
        return (weights * selected * logp.gather(-1, ids[..., None]).squeeze(-1)).sum()

    with grouped.capture(token_dest, count):
        per = grouped.backward(loss((token_dest >= 0).double()))  # −1: padding, in no loss
    worst = 0.0
    for d in range(count):
        ref = torch.autograd.grad(loss((token_dest == d).double()), params, allow_unused=True)
        for got, want in zip(per[d], ref):
            want = torch.zeros_like(got) if want is None else want
            worst = max(worst, float((got - want).abs().max()) / max(float(want.abs().max()), 1e-300))
    return worst


@pytest.mark.parametrize("extra", [{}, {"tie_word_embeddings": True}, {"attention_bias": True, "mlp_bias": True},
                                   {"pad_token_id": 3}], ids=["plain", "tied", "biases", "padding-idx"])
def test_each_destination_gets_exactly_its_own_rows_gradient(extra):
    rows = torch.tensor([0, 2, 1, 0, 2])
    ids = torch.randint(0, 32, (5, 7), generator=torch.Generator().manual_seed(0))
    ids[:, 2] = 3  # the padding id occurs
    assert per_destination_check(llama(0, **extra), ids, rows[:, None].expand(5, 7), 3) < 1e-12


def test_lora_adapters_are_reduced_and_base_weights_left_alone():
    model = tiny_lora_llama(torch.float64, 0, ("q_proj", "v_proj", "down_proj"))
    ids = torch.randint(0, 32, (4, 6), generator=torch.Generator().manual_seed(2))
    rows = torch.tensor([1, 0, 1, 0])
    assert per_destination_check(model, ids, rows[:, None].expand(4, 6), 2) < 1e-12


def test_packed_lines_hold_rows_of_different_destinations():
    """Two rows per line, positions restarting: per-TOKEN destinations, a free slot at −1."""
    grid = layout([4, 3, 4, 2], line_width=7)  # lines: [4 + 3], [4 + 2 + free]
    ids = grid.place([[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15], [16, 17]], torch.long, torch.device("cpu"))
    token_dest = grid.place([[1] * 4, [2] * 3, [2] * 4, [1] * 2], torch.long, torch.device("cpu")) - 1
    assert int((token_dest == -1).sum()) == 1
    worst = per_destination_check(llama(1), ids, token_dest, 2, position_ids=grid.positions(torch.device("cpu")))
    assert worst < 1e-12


def test_a_trainable_parameter_outside_the_reducible_modules_means_no_grouped_backward():
    model = llama(0)
    model.model.extra = torch.nn.Conv1d(2, 2, 1)  # not a Linear / Embedding / RMSNorm
    assert GroupedGradients.for_model(model, list(model.parameters())) is None
    assert GroupedGradients.for_model(model, [p for n, p in model.named_parameters() if "extra" not in n])


def test_a_module_called_on_other_tokens_refuses_in_the_forward():
    model = llama(0)
    grouped = GroupedGradients.for_model(model, list(model.parameters()))
    with grouped.capture(torch.zeros(2, 5, dtype=torch.long), 1), pytest.raises(NotReducible, match="tokens"):
        model(input_ids=torch.zeros(2, 4, dtype=torch.long))


def test_destinations_number_buckets_in_order_and_known_rows_only_when_they_go_to_g():
    keys = [None, (3, 1.0), (3, 0.0), None, (3, 1.0)]
    assert destinations(keys, known_in_g=True) == ([0, 1, 2, 0, 1], [None, (3, 1.0), (3, 0.0)])
    assert destinations(keys, known_in_g=False) == ([-1, 0, 1, -1, 0], [(3, 1.0), (3, 0.0)])


@pytest.mark.slow
@pytest.mark.parametrize("aux", ["off", "on"])
def test_the_adaptive_learner_mixes_buckets_of_open_groups_exactly(aux):
    """Float64, every arrival followed by idle work: micro-batches mixing open groups' buckets and
    known rows ran, and the gradient is the reference's within 1e-12."""
    ran = []
    for seed, pack in enumerate((False, True)):
        case = run_case(CaseSpec("grpo", "token-mean", "unbiased", torch.float64, "adaptive", None, aux=aux, idle=1.0,
                                 pack=pack), random.Random(f"grouped-{seed}-{aux}"))
        assert case["passed"], case
        ran.append(case["grouped_micro_batches"])
    assert sum(ran) > 0


def test_a_forward_that_refuses_falls_back_to_the_per_bucket_path(monkeypatch):
    """Fault injected: the first grouped forward raises NotReducible; nothing was added, the micro-batch
    is learnt per bucket, the learner stays on that path, and the gradient is still the reference's."""
    calls = []

    def refuse(self, token_dest, count):
        calls.append(count)
        raise NotReducible("injected")

    monkeypatch.setattr(GroupedGradients, "capture", refuse)
    rng = random.Random("fallback")
    model, ref = tiny_llama(torch.float64, 0), tiny_llama(torch.float64, 1)
    algo = AlgorithmConfig(objective="grpo", kl_coef=0.0)
    trajs = random_batch(rng)
    options = LearnerOptions("adaptive", drain_policy="finished-groups-first", speculate_zero_variance=True)
    got, stats = streamed_gradient(model, ref, algo, trajs, rng, options, idle=1.0)
    assert len(calls) == 1 and stats["grouped_micro_batches"] == 0 and stats["open_rows"] > 0
    assert relative_error(got, reference_gradient(model, trajs, algo, ref)) < 1e-12


def test_cost_aware_runs_open_rows_in_a_grouped_micro_batch_only_where_what_waits_outlasts_the_rollout():
    policy = DrainPolicy("cost-aware", 0.05)
    budget = EarlyWorkBudget(policy.costs, expected_rows=256, share=0.05)
    budget.arrivals(20, 600, now=0.0)
    budget.arrivals(20, 600, now=1.0)  # 216 more rows take 5.4 s
    assert not policy.grouped_pays(budget, 4096, 130, open_rows=100, full=True, waiting_slots=5000, now=1.0)
    assert budget.reason == "unmeasured"  # nothing measured yet: the micro-batched way
    for slots in (500, 1000, 4000):
        policy.costs.observe(slots, slots // 30, 0.001 + 1e-3 * slots, open_group=False)
    # known rows only: a full micro-batch runs as sync's would
    assert policy.grouped_pays(budget, 4096, 130, open_rows=0, full=True, waiting_slots=5000, now=1.0)
    # open rows at the prior 1.3: 2000 waiting slots are 2.6 s of work, the rollout has 5.4 s left: they wait
    # (their groups may close before the end and be learnt as known rows, at no premium)
    assert not policy.grouped_pays(budget, 2000, 60, open_rows=40, full=False, waiting_slots=2000, now=1.0)
    assert budget.reason == "not_near_end"
    # 5000 waiting slots are 6.5 s: more than the rollout has left, so what runs now comes off the tail
    assert policy.grouped_pays(budget, 4096, 130, open_rows=100, full=True, waiting_slots=5000, now=1.0)
    policy.costs.grouped_s, policy.costs.grouped_known_s = 2.5, 1.0  # measured 2.5x: never
    assert not policy.grouped_pays(budget, 4096, 130, open_rows=100, full=True, waiting_slots=5000, now=1.0)
    assert budget.reason == "cost"
    assert DrainPolicy("finished-groups-first", 0.05).grouped_pays(budget, 10, 1, 1, False, 10)
    assert not DrainPolicy("closed-groups", 0.05).grouped_pays(budget, 4096, 99, 1, True, 10)
    assert BackwardCosts().grouped_ratio > 1.0  # the prior until measured


def test_the_gpu_checks_grouped_learner_step_learns_the_batch_in_grouped_micro_batches():
    from bench import gpu_check

    rng = random.Random("gpu-check-grouped")
    model = tiny_llama(torch.float32, 0)
    first, second = random_batch(rng), random_batch(random.Random("more"))
    for traj in second:  # two batches' groups and ids made distinct
        traj.id, traj.group = traj.id + len(first), traj.group + 100
    trajs = first + second
    out = gpu_check.grouped_learner_step(model, trajs, AlgorithmConfig(objective="grpo"), rng, chunk=3)
    assert out["grouped_ms_per_traj"] > 0 and out["grouped_micro_batches"] >= 1
    assert out["grouped_backwards"] <= out["grouped_micro_batches"]


def test_destinations_in_contiguous_slices_are_reduced_without_gathering_and_agree():
    """Rows ordered by destination (what the learner lays out): each destination one slice of the
    grid, padding inside it; packed lines of one destination each (``segmented_layout``)."""
    from learner.grad.batching.grouped import Destinations
    from learner.grad.batching.packing import segmented_layout

    rows = torch.tensor([0, 0, 1, 2, 2])
    token_dest = rows[:, None].expand(5, 7).clone()
    token_dest[0, 5:] = -1  # a padded row end inside destination 0's slice
    assert Destinations(token_dest, 3).slices == [(0, 14), (14, 21), (21, 35)]
    assert Destinations(torch.tensor([[0, 1, 0]]), 2).slices is None  # interleaved: gathered instead
    ids = torch.randint(0, 32, (5, 7), generator=torch.Generator().manual_seed(4))
    assert per_destination_check(llama(2), ids, token_dest, 3) < 1e-12
    grid = segmented_layout([4, 3, 2, 4], [0, 0, 1, 1], width=7)
    assert grid.lines == 2 and [line for line, _ in grid.places] == [0, 0, 1, 1]
