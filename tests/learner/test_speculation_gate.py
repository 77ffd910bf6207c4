"""Whether drafting pays (learner/driver/speculation_gate.py, docs/speculation.md, "When drafting
pays"): the decision rule on injected measurements (pays, does not pay, re-probes and turns back
on), and a whole run where verification is made to cost more than it saves: speculation stands
aside after its probe, and every step's tokens, rewards and gradients still equal speculation off."""

from __future__ import annotations

import pytest

from learner.driver import loop as driver_loop
from learner.driver import speculation_gate as sg
from learner.driver.speculation_gate import Measured, SpeculationGate
from learner.timeline import Metric
from tests.learner.test_speculation_runs import assert_equal_runs, run


def measured(kept: float, verify: float, decode: float, tokens: int = 1000) -> Measured:
    return Measured(drafted_tokens=tokens, kept_share=kept, verify_s_per_token=verify, decode_s_per_token=decode)


def test_drafts_before_any_measurement_and_while_it_pays() -> None:
    gate = SpeculationGate()
    assert gate.gain() is None and gate.decide(1)  # the probe
    assert not gate.decide(2)  # handed out before the probe's step was measured: waits for it
    gate.observe(measured(kept=0.9, verify=1e-4, decode=1e-3), 1)  # saves 1000 × (0.9e-3 − 1e-4) = 0.8 s
    assert gate.gain() == pytest.approx(0.8)
    assert all(gate.decide(b) for b in range(3, 10))
    assert gate.report(5) == {Metric.SPEC_DRAFTING: 1.0, Metric.SPEC_EST_GAIN_S: pytest.approx(0.8)}


def test_stands_aside_when_verification_costs_what_decoding_saves() -> None:
    gate = SpeculationGate()
    gate.decide(1)
    # the bench's default workload: verification about what decoding costs, 86% kept
    gate.observe(measured(kept=0.86, verify=1e-3, decode=1e-3), 1)
    assert gate.gain() < 0
    assert not gate.decide(2) and not gate.decide(3)
    assert gate.report(2)[Metric.SPEC_DRAFTING] == 0.0 and gate.report(3)[Metric.SPEC_EST_GAIN_S] < 0
    # steps not drafted still teach the decode cost; the draft estimates stay
    gate.observe(Measured(decode_s_per_token=1e-3), 1)
    assert gate.kept_share == pytest.approx(0.86)


def test_reprobes_and_turns_back_on() -> None:
    gate = SpeculationGate()
    gate.decide(1)
    gate.observe(measured(kept=0.5, verify=1e-3, decode=1e-3), 1)
    decisions = [gate.decide(b) for b in range(2, 2 + 2 * sg.REPROBE_EVERY + 1)]
    # off from batch 2; every REPROBE_EVERY-th batch after that is drafted to measure again
    assert decisions == [b > 2 and (b - 2) % sg.REPROBE_EVERY == 0 for b in range(2, 2 + 2 * sg.REPROBE_EVERY + 1)]
    # the re-probe measures a cheaper verification (e.g. the load fell): drafting pays again
    for _ in range(3):
        gate.observe(measured(kept=0.95, verify=1e-4, decode=1e-3), 1)
    assert gate.gain() > sg.MARGIN_S
    assert gate.decide(100) and gate.decide(101) and gate.off_since is None


def test_always_drafts_every_batch() -> None:
    gate = SpeculationGate("always")
    gate.observe(measured(kept=0.1, verify=1e-2, decode=1e-3), 1)
    assert gate.gain() < 0 and all(gate.decide(b) for b in range(1, 6))


def test_measure_from_trajectories_and_spans() -> None:
    from learner.trajectory import Trajectory
    drafted = Trajectory(id=0, group=0, step=1, input_ids=[1] * 12, loss_mask=[0, 0] + [1] * 10,
                         behavior_logprobs=[0.0] * 12, drafted_tokens=10, kept_tokens=8)
    direct = Trajectory(id=1, group=0, step=1, input_ids=[1] * 12, loss_mask=[0, 0] + [1] * 10,
                        behavior_logprobs=[0.0] * 12)
    spans = [{"kind": "rollout.generate", "lane": "rollout/0/slot0", "t0": 0.0, "t1": 0.6},
             {"kind": "rollout.generate", "lane": "rollout/0/slot1", "t0": 0.4, "t1": 0.6},  # overlaps: one engine
             {"kind": "rollout.draft_verify", "lane": "rollout/0/slot0", "t0": 1.0, "t1": 1.5}]
    m = sg.measure([drafted, direct], spans, 0.0, 2.0)
    assert m.drafted_tokens == 10 and m.kept_share == pytest.approx(0.8)
    assert m.verify_s_per_token == pytest.approx(0.05)
    assert m.decode_s_per_token == pytest.approx(0.6 / 12)  # 2 remainder + 10 direct tokens


@pytest.mark.slow
def test_unprofitable_drafting_stands_aside_with_identical_tokens(monkeypatch) -> None:
    """Verification made 20× what a sampled token costs: the probe (step 1) is drafted, then the
    gate stands aside (steps 2, 3 sampled directly); tokens, rewards and gradients equal speculation off."""
    real = sg.measure

    def costly(trajs, spans, t_start, t_end):
        m = real(trajs, spans, t_start, t_end)
        if m.verify_s_per_token is not None and m.decode_s_per_token is not None:
            m.verify_s_per_token = 20 * m.decode_s_per_token
        return m

    off_steps, off_grads, _ = run("sync", False, monkeypatch, steps=6)
    monkeypatch.setattr(driver_loop, "measure_gate", costly)
    on_steps, on_grads, metrics = run("sync", True, monkeypatch, steps=6, check_kept=False, gate="cost")
    assert_equal_runs(off_steps, off_grads, on_steps, on_grads, n=6)
    drafting = [m[Metric.SPEC_DRAFTING] for m in metrics]
    # step 0 has nothing before it; 1 probes; sync hands batch k+1 (and its drafts of k+2) out before step k
    # ends, so 2 and 3 are decided before the probe was measured, 4 and 5 on it: they stand aside
    assert drafting == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert metrics[1][Metric.DRAFTED_TOKENS] > 0
    assert all(m[Metric.DRAFTED_TOKENS] == 0 for m in metrics[2:])
    assert metrics[4][Metric.SPEC_EST_GAIN_S] < 0 and metrics[5][Metric.SPEC_EST_GAIN_S] < 0
