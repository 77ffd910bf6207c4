"""The seams are registries (learner/registries): no module compares an objective, engine or
schedule name outside them, every registered name is accepted by the config and built by its
factory, and every objective keeps the contract that lets the learner stream it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from learner.config import RunConfig
from learner.grad.objectives import advantages, group_stats, opd_token_loss, pg_token_loss
from learner.registries.engines import LEARNER_ENGINES, ROLLOUT_ENGINES, process_count, rollout_engine
from learner.registries.objectives import OBJECTIVES, objective
from learner.registries.schedules import SCHEDULE_KINDS, schedule_kind
from learner.rollout.engine.factory import BUILDERS

ROOT = Path(__file__).resolve().parents[2]
NAMES = sorted({*OBJECTIVES, *ROLLOUT_ENGINES, *LEARNER_ENGINES, *SCHEDULE_KINDS})
QUOTED = "|".join(re.escape(f'"{n}"') for n in NAMES)
# a name compared (==, !=, in a literal tuple), the way a string test reads
COMPARED = re.compile(rf"(?:[=!]=\s*(?:{QUOTED}))|(?:(?:{QUOTED})\s*[=!]=)|(?:\bin\s*[(\[{{]\s*(?:{QUOTED}))")


def string_tests() -> list[str]:
    found = []
    for folder in ("learner", "controller"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "registries" in path.parts or "migrations" in path.parts:
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if COMPARED.search(line.split("#", 1)[0]):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    return found


def test_no_module_compares_an_objective_engine_or_schedule_name_outside_its_registry():
    assert string_tests() == []


def test_the_grep_finds_the_string_tests_it_is_for():
    for line in ('if cfg.algorithm.objective == "opd":', 'x = a if "vllm" != e else b', 'if s in ("sync", "streaming"):'):
        assert COMPARED.search(line), line
    assert not COMPARED.search('engine: Literal[NAMES] = "torch"')


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_every_objective_is_a_config_choice_with_its_loss_modes(name):
    obj = objective(name)
    for mode in obj.loss_agg_modes:
        RunConfig.model_validate({"algorithm": {"objective": name, "loss_agg_mode": mode}})
    assert obj.group_advantage != obj.teacher_scored


def test_a_reward_objectives_token_gradient_is_linear_in_the_advantage_so_running_sums_hold():
    # GRPO streams because ∇ℓ(A) = A ∇ℓ(1): with S = Σ g_i and T = Σ r_i g_i summed as rewards
    # arrive, (T − μS)/σ at group close equals Σ A_i g_i, the batch-synchronous gradient
    torch.manual_seed(0)
    rewards = [1.0, 0.0, 0.5, 1.0]
    w = torch.randn(5, dtype=torch.float64, requires_grad=True)
    feats = torch.randn(len(rewards), 7, 5, dtype=torch.float64)
    for obj in (o for o in OBJECTIVES.values() if o.group_advantage):
        def grad_of(i: int, adv: float) -> torch.Tensor:
            logp = torch.nn.functional.logsigmoid(feats[i] @ w)
            (g,) = torch.autograd.grad(pg_token_loss(logp, adv).sum(), w)
            return g
        g = [grad_of(i, 1.0) for i in range(len(rewards))]
        for a in (0.3, -2.0):
            assert torch.allclose(grad_of(0, a), a * g[0], rtol=0, atol=1e-12), obj.name
        mu, sigma = group_stats(rewards, "unbiased", 1e-6)
        streamed = (sum(r * gi for r, gi in zip(rewards, g)) - mu * sum(g)) / sigma  # sigma: σ + ε
        batch = sum(a * g[i] for i, a in enumerate(advantages(rewards, "unbiased", 1e-6)))
        assert torch.allclose(streamed, batch, rtol=1e-10, atol=1e-10), obj.name


def test_a_teacher_objectives_turn_gradient_needs_only_that_turns_scores():
    # OPD streams per scored turn: a turn's gradient is (log π_b − log π_T) ∇log π_θ over its own
    # tokens, so nothing of a later turn enters it (no deferral)
    torch.manual_seed(1)
    w = torch.randn(4, dtype=torch.float64, requires_grad=True)
    feats = torch.randn(6, 4, dtype=torch.float64)
    teacher = torch.randn(6, dtype=torch.float64)
    for obj in (o for o in OBJECTIVES.values() if o.teacher_scored):
        logp = torch.nn.functional.logsigmoid(feats @ w)
        (whole,) = torch.autograd.grad(opd_token_loss(logp, teacher).sum(), w)
        parts = []
        for turn in (slice(0, 2), slice(2, 6)):
            lp = torch.nn.functional.logsigmoid(feats[turn] @ w)
            parts.append(torch.autograd.grad(opd_token_loss(lp, teacher[turn]).sum(), w)[0])
        assert torch.allclose(whole, parts[0] + parts[1], rtol=0, atol=1e-12), obj.name


def test_every_rollout_engine_has_a_builder_and_counts_its_processes():
    assert set(BUILDERS) == set(ROLLOUT_ENGINES)
    for name, kind in ROLLOUT_ENGINES.items():
        field = kind.processes_field.split(".", 1)[1]
        assert process_count({"engine": name, "workers": 3, "replicas": 2}) == {"workers": 3, "replicas": 2}[field]
    with pytest.raises(KeyError, match="rollout.engine: 'sglang' is not one of torch, vllm"):
        rollout_engine("sglang")


def test_schedules_from_the_registry_agree_with_the_rules():
    from learner.driver import rules

    assert [k.name for k in SCHEDULE_KINDS.values() if k.on_policy] == list(rules.ON_POLICY) == ["sync", "streaming"]
    assert [rules.lead(n, 3) for n in SCHEDULE_KINDS] == [0, 1, 3, 0]
    assert [n for n in SCHEDULE_KINDS if schedule_kind(n).baseline] == ["sync"]
    assert rules.learns_on_arrival("streaming", "opd", True) and not rules.learns_on_arrival("streaming", "opd", False)
    assert rules.learns_on_arrival("streaming", "grpo", False) and not rules.learns_on_arrival("sync", "grpo", False)
