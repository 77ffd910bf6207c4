"""Property tests: every learner path equals the batch-synchronous reference gradient (docs/learner.md)."""

import json
import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import learner.checks.exactness as exactness
from learner.config import LOSS_AGG_MODES, STD_MODES, AdvantageConfig, AlgorithmConfig
from learner.checks.exactness import CaseSpec, random_batch, relative_error, run_case, streamed_gradient, tiny_llama
from learner.grad.learners.common import LEARNER_PATHS
from learner.grad.reference import reference_gradient
from learner.grad.objectives import OPD_LOSS_AGG_MODES

torch.set_num_threads(1)

grpo_case = st.tuples(st.just("grpo"), st.sampled_from(LOSS_AGG_MODES), st.sampled_from(STD_MODES))
opd_case = st.tuples(st.just("opd"), st.sampled_from(OPD_LOSS_AGG_MODES), st.just("n/a"))


@settings(max_examples=8, deadline=None)
@given(
    combo=st.one_of(grpo_case, opd_case),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    learner=st.sampled_from(LEARNER_PATHS),
    cap=st.sampled_from([0, 1, 2, None]),
    deterministic=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_learner_path_matches_reference_on_random_batches(combo, dtype, learner, cap, deterministic, seed):
    objective, mode, std = combo
    spec = CaseSpec(objective, mode, std, dtype, learner, cap, deterministic=deterministic)
    case = run_case(spec, random.Random(seed))
    assert case["passed"], case
    assert case["learner"] == ("deterministic" if deterministic else learner)


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
    interleaved, stats = streamed_gradient(model, None, algo, trajs, random.Random(3))
    assert stats["max_open_groups"] >= 2
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


def test_case_specs_cover_every_combination_path_cap_and_zero_variance():
    specs = exactness.case_specs()
    conventions = {(s.objective, s.mode, s.std, s.dtype, s.learner) for s in specs}
    n_combos = len(LOSS_AGG_MODES) * len(STD_MODES) + len(OPD_LOSS_AGG_MODES)
    assert len(conventions) >= 2 * n_combos * len(LEARNER_PATHS)
    caps = {(s.objective, s.learner, s.open_group_cap, s.accumulator, s.dtype) for s in specs}
    for objective, learner in (("grpo", "per-trajectory"), ("grpo", "adaptive"), ("opd", "adaptive")):
        for cap in (0, 1, 2, None):
            for acc in ("device", "host"):
                assert {(objective, learner, cap, acc, d) for d in (torch.float32, torch.float64)} <= caps
    zero = {(s.learner, s.aux) for s in specs if s.zero_variance and not s.deterministic}
    assert zero == {(learner, aux) for learner in LEARNER_PATHS for aux in ("off", "on")}
    deterministic = {(s.objective, s.mode, s.std, s.dtype) for s in specs if s.deterministic and not s.zero_variance}
    assert len(deterministic) == 2 * n_combos  # streaming's deterministic learner: every convention
    assert {s.aux for s in specs if s.deterministic and s.zero_variance} == {"off", "on"}


def test_main_prints_json_naming_learner_and_cap(monkeypatch, capsys):
    specs = [CaseSpec("grpo", "token-mean", "unbiased", torch.float64, "adaptive", 1, "host"),
             CaseSpec("grpo", "token-mean", "unbiased", torch.float32, "micro-batched", None, "device", "off", True),
             CaseSpec("opd", "token-mean", "n/a", torch.float32, "per-trajectory")]
    cases = exactness.run_cases(seed=3, specs=specs)
    assert all(c["passed"] for c in cases), [c for c in cases if not c["passed"]]
    assert cases[1]["skipped_trajectories"] > 0  # zero-variance members: no backward at all
    monkeypatch.setattr(exactness, "run_cases", lambda: cases)
    assert exactness.main(json_out=True) == 0
    printed = json.loads(capsys.readouterr().out)["cases"]
    assert [(c["learner"], c["open_group_cap"], c["accumulator_device"]) for c in printed] == [
        ("adaptive", 1, "host"), ("micro-batched", 0, "device"), ("per-trajectory", None, "device")]
    assert printed[0].keys() >= {"objective", "loss_agg_mode", "std", "dtype", "rel_error", "tol", "passed"}


def test_cost_aware_cases_from_a_fit_take_each_kind_of_early_work_and_stay_exact():
    specs = [s for s in exactness.case_specs() if s.early]
    assert {(s.open_group_cap, s.aux, s.pack) for s in specs} == {
        (cap, aux, pack) for cap in (0, 2, None) for aux in ("off", "on") for pack in (False, True)}
    cases = exactness.run_cases(seed=0, specs=specs)
    assert all(c["passed"] for c in cases), [c for c in cases if not c["passed"]]
    assert any(c["open_rows"] for c in cases) and any(c["early_micro_batches"] for c in cases)
