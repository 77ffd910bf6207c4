"""thundersync bench's rows and workloads: the speculation rows' plumbing, the gains reported
apart, the long-tail workload and its trajectory-time tail, which knob sets the scale."""

from __future__ import annotations

from argparse import Namespace

import pytest

from learner.bench import rows
from learner.bench.run import resolve_knob
from learner.bench.workloads import WORKLOADS, tail_summary, trajectory_seconds
from learner.config import load_config


def test_speculation_rows_follow_their_schedule_and_only_when_asked():
    assert rows.bench_rows(["async", "streaming"], reference=True, speculation=True) == [
        "sync", "sync-per-trajectory", "async", "streaming", "sync+spec", "streaming+spec"]
    assert rows.bench_rows(["async"], reference=False, speculation=True) == ["sync", "async", "sync+spec"]
    assert rows.bench_rows(["streaming"], reference=False, speculation=False) == ["sync", "streaming"]


def test_a_row_config_is_the_workload_with_the_rows_schedule_learner_and_speculation():
    base = load_config(WORKLOADS["default"].config)
    ref = rows.row_config(base, "sync-per-trajectory")
    assert (ref.train.schedule, ref.learner.path) == ("sync", "per-trajectory")
    spec = rows.row_config(base, "streaming+spec")
    assert (spec.train.schedule, spec.learner.path) == ("streaming", "auto")
    assert rows.row_of("streaming+spec").speculation and not rows.row_of("streaming").speculation
    assert spec.rollout.speculation.enabled and not rows.row_config(base, "streaming").rollout.speculation.enabled
    assert base.train.schedule == "sync" and base.learner.path == "auto"  # the workload itself is untouched


def test_speculation_metrics_are_medians_of_the_steps_that_record_them():
    steps = [{"speculation/kept_token_share": k, "speculation/whole_draft_share": w, "rollouter/busy_share": 0.5}
             for k, w in ((0.9, 0.6), (0.95, 0.7), (0.99, 0.8))]
    assert rows.speculation_metrics(steps) == {"kept_token_share": 0.95, "whole_draft_share": 0.7, "busy_share": 0.5}
    assert rows.speculation_metrics([{"timing_s/step": 1.0}]) == {}  # a trainer without speculation


def test_the_overlap_factor_and_what_speculation_adds_are_reported_apart():
    results = {"sync": {"step_s": 4.0}, "streaming": {"step_s": 2.5}, "sync+spec": {"step_s": 2.0},
               "streaming+spec": {"step_s": 1.25}}
    assert rows.speculation_factors(results) == {
        "overlap_factor": pytest.approx(1.6), "speculation_factor_sync": pytest.approx(2.0),
        "speculation_factor_streaming": pytest.approx(2.0)}
    assert rows.speculation_factors({"sync": {"step_s": 4.0}}) == {}


def _span(step, traj, t0, t1, kind="rollout.generate"):
    return {"type": "span", "step": step, "traj": traj, "kind": kind, "t0": t0, "t1": t1, "lane": f"rollout/0/{traj}"}


def test_trajectory_time_is_the_envelope_of_its_rollout_spans_in_the_measured_steps():
    events = [{"type": "metrics", "step": s, "values": {"step/t_start": 10.0 * s, "step/t_end": 10.0 * s + 9}}
              for s in range(2)]
    events += [_span(0, 0, 0.0, 5.0)]  # the warm-up step: left out
    events += [_span(1, 1, 10.0, 10.1), _span(1, 1, 10.1, 10.4, "rollout.tool_wait"), _span(1, 1, 10.4, 10.5)]
    events += [_span(1, 2 + t, 10.0, 10.2) for t in range(98)] + [_span(1, 100, 10.0, 18.0)]
    assert sorted(trajectory_seconds(events, warmup=1))[-2:] == [pytest.approx(0.5), pytest.approx(8.0)]
    tail = tail_summary([events], warmup=1)
    assert tail["trajectories"] == 100 and tail["p50_s"] == pytest.approx(0.2) and tail["max_s"] == pytest.approx(8.0)
    assert tail["p99_over_p50"] == pytest.approx(tail["p99_s"] / 0.2) and tail["p99_s"] > 0.5


def test_the_long_tail_workload_is_a_labelled_heavy_tailed_model_with_varied_turns():
    cfg = load_config(WORKLOADS["longtail"].config)
    lat = cfg.task.tool_latency
    assert lat.distribution == "pareto" and lat.alpha < 1.5 and lat.max_s is not None
    assert cfg.task.max_ops - cfg.task.min_ops >= 3 and cfg.task.max_turns > cfg.task.max_ops + 1
    assert "model" in WORKLOADS["longtail"].config.read_text()  # says what it models


@pytest.mark.parametrize("given, workload, config, sweep, expected", [
    ({}, "default", None, None, (1.0, None)),
    ({}, "longtail", None, None, (None, 1.0)),  # its latency model at the config's own scale
    ({"balance": 3.0}, "longtail", None, None, (3.0, None)),
    ({}, "longtail", None, [1.0, 2.0], (1.0, None)),  # a sweep calibrates
    ({"scale": 2.0}, "default", None, None, (None, 2.0)),
    ({}, "default", "mine.yaml", None, (1.0, None)),
])
def test_the_scale_comes_from_the_flag_the_balance_or_the_long_tail_config(given, workload, config, sweep, expected):
    args = Namespace(balance=given.get("balance"), scale=given.get("scale"), workload=workload, config=config, sweep=sweep)
    resolve_knob(args, load_config(WORKLOADS[workload].config))
    assert (args.balance, args.scale) == expected
