"""Property tests: streaming equals the batch-synchronous reference gradient (docs/math.md tolerance)."""

import json
import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import learner.exactness as exactness
from learner.config import LOSS_AGG_MODES, STD_MODES, AdvantageConfig, AlgorithmConfig
from learner.exactness import random_batch, relative_error, run_case, streamed_gradient, tiny_llama
from learner.gradients import reference_gradient
from learner.objectives import OPD_LOSS_AGG_MODES

torch.set_num_threads(1)

grpo_case = st.tuples(st.just("grpo"), st.sampled_from(LOSS_AGG_MODES), st.sampled_from(STD_MODES))
opd_case = st.tuples(st.just("opd"), st.sampled_from(OPD_LOSS_AGG_MODES), st.just("n/a"))


@settings(max_examples=8, deadline=None)
@given(
    combo=st.one_of(grpo_case, opd_case),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 2**32 - 1),
)
def test_streaming_matches_reference_on_random_batches(combo, dtype, seed):
    objective, mode, std = combo
    case = run_case(objective, mode, std, dtype, random.Random(seed))
    assert case["passed"], case


def test_opd_turn_order_does_not_change_the_gradient():
    model, ref = tiny_llama(torch.float64, 5), tiny_llama(torch.float64, 6)
    algo = AlgorithmConfig(objective="opd", kl_coef=0.2, entropy_coef=0.1)
    trajs = random_batch(random.Random(5))
    first, _ = streamed_gradient(model, ref, algo, trajs, random.Random(1))
    second, _ = streamed_gradient(model, ref, algo, trajs, random.Random(2))
    assert relative_error(first, second) < 1e-13


def test_streaming_keeps_several_groups_open_and_matches_sync_order():
    model = tiny_llama(torch.float64, 7)
    algo = AlgorithmConfig(advantage=AdvantageConfig(std="unbiased"))
    trajs = random_batch(random.Random(11))
    interleaved, max_open = streamed_gradient(model, None, algo, trajs, random.Random(3))
    assert max_open >= 2
    assert relative_error(interleaved, reference_gradient(model, trajs, algo)) < 1e-12


def test_the_check_detects_a_wrong_advantage_convention():
    """Streaming with population std against an unbiased reference must fail by far."""
    model = tiny_llama(torch.float64, 8)
    trajs = random_batch(random.Random(12))
    streamed, _ = streamed_gradient(
        model, None, AlgorithmConfig(advantage=AdvantageConfig(std="population")), trajs, random.Random(0)
    )
    ref = reference_gradient(model, trajs, AlgorithmConfig(advantage=AdvantageConfig(std="unbiased")))
    assert relative_error(streamed, ref) > 1e-3


def test_run_cases_covers_every_combination_and_main_prints_json(monkeypatch, capsys):
    cases = exactness.run_cases(seed=3, cases_per_combo=1)
    combos = {(c["objective"], c["loss_agg_mode"], c["std"], c["dtype"]) for c in cases}
    assert len(combos) == len(cases) == 2 * (len(LOSS_AGG_MODES) * len(STD_MODES) + len(OPD_LOSS_AGG_MODES))
    assert all(c["passed"] for c in cases), [c for c in cases if not c["passed"]]
    monkeypatch.setattr(exactness, "run_cases", lambda: cases)
    assert exactness.main(json_out=True) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["cases"][0].keys() >= {"objective", "loss_agg_mode", "std", "dtype", "rel_error", "tol", "passed"}
