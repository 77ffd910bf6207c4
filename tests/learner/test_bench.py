"""thundersync bench: a real (tiny) bench run's JSON/HTML, the measurement maths, bad flags."""

from __future__ import annotations

import json

import pytest
from plotly.offline import get_plotlyjs_version

from learner.bench.measure import Calibration, calibrate, compare, drain_steps, summarize
from learner.cli import main

FIELDS = ("learner_s", "step_s", "rollout_s", "learner_s", "bound_s", "efficiency", "speedup_vs_sync", "trainer_idle_ratio",
          "rollouter_idle_ratio", "staleness_mean", "staleness_max", "tail_s", "peak_rss_mb", "engine_busy_s",
          "learner_work_s", "step_mean_s", "trained_tokens_per_s", "trained_trajectories_per_s", "response_length_mean")

TINY = """\
name: tiny-bench
seed: 3
model: {policy: "builtin:tiny"}
task: {name: arith-tool, min_ops: 1, max_ops: 2, tool_latency: {distribution: lognormal, median_s: 0.02, sigma: 0.5}}
rollout: {workers: 1, max_new_tokens: 16}
# the entropy term gives every trajectory a backward whatever its rewards: each measured step
# trains by construction, not because a seed happened to draw a group with mixed rewards
algorithm: {objective: grpo, entropy_coef: 0.01}
train: {steps: 2, prompts_per_step: 2, group_size: 2}
"""


# ------------------------------------------------------------------ a real bench run


@pytest.fixture(scope="module")
def tiny_bench(tmp_path_factory):
    d = tmp_path_factory.mktemp("bench")
    (d / "tiny.yaml").write_text(TINY)
    rc = main(["bench", "--config", str(d / "tiny.yaml"), "--schedules", "streaming,async,fully-async", "--steps", "2",
               "--balance", "20", "--rounds", "1", "--no-speculation", "--json", str(d / "out.json"), "--html", str(d / "out.html"),
               "--events-dir", str(d / "ev")])
    assert rc == 0
    return json.loads((d / "out.json").read_text()), (d / "out.html").read_text(), d / "ev"


@pytest.mark.slow
def test_it_writes_every_field_for_sync_and_each_schedule(tiny_bench):
    doc, _, _ = tiny_bench
    assert list(doc["schedules"]) == ["sync", "sync-per-trajectory", "streaming", "async", "fully-async"]
    # every schedule with its best learner; the earlier per-trajectory learner as a reference row
    assert {n: r["learner"] for n, r in doc["schedules"].items()} == {
        "sync": "micro-batched", "sync-per-trajectory": "per-trajectory", "streaming": "adaptive",
        "async": "micro-batched", "fully-async": "micro-batched"}
    sync, ref = doc["schedules"]["sync"], doc["schedules"]["sync-per-trajectory"]
    assert sync["learner_s"] == sync["learner_phase_s"] == doc["workload"]["learner_s"]
    assert ref["learner_s"] == ref["learner_phase_s"]  # held against its own learner's L
    assert doc["schedules"]["streaming"]["learner_s"] == sync["learner_s"]  # against the best sync's L
    for name, r in doc["schedules"].items():
        for field in FIELDS:
            assert isinstance(r[field], (int, float)), (name, field)
        assert r["steps_measured"] == 1 and r["runs"] == 1  # one round (test_rounds_pool_their_steps_... checks how rounds pool)
        # definitions, not timings (one 4-trajectory step is all noise on a shared machine)
        assert r["efficiency"] == pytest.approx(r["bound_s"] / r["step_mean_s"])
        # on these recorded runs, as on every one: the bound is work some row did, so no row beats it
        assert 0 < r["efficiency"] <= 1.0
        assert max(r["engine_busy_s"], r["learner_work_s"]) <= r["step_mean_s"] + 1e-9
        assert r["speedup_vs_sync"] == pytest.approx(doc["schedules"]["sync"]["step_s"] / r["step_s"])
        assert 0.0 <= r["trainer_idle_ratio"] <= 1.0 and 0.0 <= r["rollouter_idle_ratio"] <= 1.0
        assert r["step_s_min"] <= r["step_s"] <= r["step_s_max"]
        # each row against its own work, under its schedule's rule (learner/bench/efficiency.py)
        assert (r["bound_engine_s"], r["bound_learner_s"]) == (r["engine_busy_s"], r["learner_work_s"])
        assert 0 < r["bound_barrier_s"] <= r["learner_work_s"]  # every step has an optimizer and a publish
        assert r["bound_s"] > 0 and r["peak_rss_mb"] > 50
    assert sync["bound_rule"] == "serial" and sync["bound_s"] == pytest.approx(sync["engine_busy_s"] + sync["learner_work_s"])
    streaming = doc["schedules"]["streaming"]
    assert streaming["bound_rule"] == "barrier" and streaming["bound_s"] == pytest.approx(
        max(streaming["engine_busy_s"] + streaming["bound_barrier_s"], streaming["learner_work_s"]))
    assert {doc["schedules"][n]["bound_rule"] for n in ("async", "fully-async")} == {"overlapped"}
    assert doc["workload"]["trajectory_time"]["trajectories"] == 4  # the measured step of the sync run
    assert doc["speculation"]["overlap_factor"] == pytest.approx(sync["step_s"] / doc["schedules"]["streaming"]["step_s"])
    assert doc["schedules"]["sync"]["speedup_vs_sync"] == 1.0
    # what the sync runs' arrival times leave the streaming learner (bench/arrival_bound.py's replay)
    streaming = doc["schedules"]["streaming"]
    assert streaming["arrival_bound_s"] > 0 and 0 < streaming["efficiency_ceiling"] <= 1.0
    assert streaming["efficiency_ceiling"] == pytest.approx(min(1.0, streaming["bound_s"] / streaming["arrival_bound_s"]))
    assert streaming["open_row_cost"] is None or streaming["open_row_cost"] > 0
    assert "efficiency_ceiling" not in doc["schedules"]["async"]
    assert doc["workload"]["trajectories_per_step"] == 4 and doc["workload"]["tool_latency"]["scale"] > 0
    # the on-policy rows train what their own window produced: no backlog, the equal-work step is the window's
    for name in ("sync", "streaming"):
        r = doc["schedules"][name]
        assert r["backlog_per_step"] == 0 and r["produced_per_step"] == 4
        assert r["step_equal_work_s"] == pytest.approx(r["step_mean_s"])
    assert doc["machine"]["cpus"] >= 1 and len(doc["machine"]["load_avg_start"]) == 3


@pytest.mark.slow
def test_staleness_is_zero_on_policy_and_one_for_async(tiny_bench):
    s = tiny_bench[0]["schedules"]
    assert s["sync"]["staleness_max"] == 0 and s["streaming"]["staleness_max"] == 0
    assert s["async"]["staleness_mean"] == 1.0 and s["async"]["staleness_max"] == 1


@pytest.mark.slow
def test_sync_learns_after_the_last_reward_and_the_async_drain_step_is_run_and_dropped(tiny_bench):
    doc, _, events_dir = tiny_bench
    sync = doc["schedules"]["sync"]
    assert sync["first_backward_s"] >= sync["rollout_s"]  # the learner waits for the whole batch
    async_steps = [json.loads(line)["step"] for line in (events_dir / "main-async.jsonl").read_text().splitlines()
                   if json.loads(line)["type"] == "metrics"]
    assert async_steps == [0, 1, 2]  # 2 steps + the drain step, which is not measured


@pytest.mark.slow
def test_the_simulator_replays_the_sync_run_beside_the_measurement(tiny_bench):
    doc, _, _ = tiny_bench
    schedules = {n: r for n, r in doc["schedules"].items() if n != "sync-per-trajectory"}  # not a schedule
    assert "speed_factor" not in doc["schedules"]["sync-per-trajectory"]
    for name, r in schedules.items():
        assert r["simulated_step_s"] > 0
        assert r["simulated_error"] == pytest.approx(r["simulated_step_s"] / r["step_s"] - 1)
        # each schedule with sync's learner is simulated at the machine speed its runs met, read
        # off its backward passes; the adaptive learner's spans are other work: no speed factor
        if r["learner"] == "micro-batched":
            assert r["speed_factor"] == pytest.approx(r["backward_ms"] / doc["schedules"]["sync"]["backward_ms"])
        else:
            assert r["speed_factor"] is None and r["speedup_same_speed"] is None
    sync = doc["schedules"]["sync"]
    assert sync["speed_factor"] == 1.0 and sync["speedup_same_speed"] == pytest.approx(1 + sync["simulated_error"])
    assert doc["simulated"]["sync"]["staleness_max"] == 0
    # fully-async is simulated on the engine's costs, timed once a round; every row's equal-work
    # step is simulated over its own window, and each row says what it trained of sync's slowest decile
    engine = doc["simulated"]["engine_model"]
    assert engine["schedules"] == ["fully-async"] and len(engine["measured"]["timings"]) == 1
    assert engine["b_s"] == engine["measured"]["b_s"] >= 0 and engine["sync_replay_median_error"] >= 0
    for r in schedules.values():
        assert r["simulated_step_equal_work_s"] > 0
        if r["step_equal_work_s"]:  # (none where the window's rewards all came before it: 2 steps of 4 trajectories)
            assert r["simulated_error_equal_work"] == pytest.approx(
                r["simulated_step_equal_work_s"] / r["step_equal_work_s"] - 1)
    for r in doc["schedules"].values():
        assert 0 <= r["slowest_decile_share"] <= 1 and r["slowest_decile_tokens"] > 0


@pytest.mark.slow
def test_the_html_report_embeds_plotly_and_needs_no_network(tiny_bench):
    _, page, _ = tiny_bench
    assert "<script src" not in page and "<link" not in page  # plotly.js is inline, nothing fetched
    assert f"v{get_plotlyjs_version()}" in page and "Plotly.newPlot" in page and page.count("plotly-graph-div") >= 3
    assert "streaming" in page and "bound: the least step this row's own work allows" in page


@pytest.mark.slow
def test_balance_is_calibrated_in_two_sync_runs_and_the_measured_ratio_is_reported(tiny_bench):
    doc, _, events_dir = tiny_bench  # the shared tiny bench runs at --balance 20
    w = doc["workload"]
    runs = sorted(p.name for p in events_dir.glob("*.jsonl"))
    assert runs == ["calibration-2.jsonl", "calibration.jsonl", "main-async.jsonl", "main-fully-async.jsonl",
                    "main-streaming.jsonl", "main-sync-per-trajectory.jsonl", "main-sync.jsonl"]
    # the refined estimate is read from the second run, made at the first estimate
    assert w["calibration"]["scale_run"] > 0 and w["calibration"]["scale_run"] != 1.0
    assert w["balance_target"] == 20.0 and w["balance_measured"] == pytest.approx(w["rollout_s"] / w["learner_s"])
    # the scale used solves R(scale) = 20 L on the refined model
    assert w["rollout_s_predicted"] == pytest.approx(20.0 * w["calibration"]["learner_s"], rel=1e-6)


def test_quick_calibrates_on_three_steps_unless_steps_are_given():
    from argparse import Namespace

    from learner.bench.run import QUICK_STEPS, calibration_steps

    assert calibration_steps(Namespace(quick=True, steps=None, warmup=1), QUICK_STEPS) == 3
    assert calibration_steps(Namespace(quick=True, steps=None, warmup=3), QUICK_STEPS) == 5  # two measured steps
    assert calibration_steps(Namespace(quick=True, steps=8, warmup=1), 8) == 8
    assert calibration_steps(Namespace(quick=False, steps=None, warmup=1), 10) == 10


def test_the_refining_calibration_run_measures_the_main_runs_batches_when_it_is_cheap():
    from learner.bench.plan import QUICK_BUDGET_S, QUICK_REFINE_SHARE, refine_run_steps

    assert refine_run_steps(3, 6, fixed_s=5.0, sync_step_s=1.3) == 6  # a VM with 1.3 s sync steps: 13 s
    assert refine_run_steps(3, 6, fixed_s=12.0, sync_step_s=6.3) == 3  # the 4x slower one: 50 s
    limit = QUICK_REFINE_SHARE * QUICK_BUDGET_S
    assert refine_run_steps(3, 6, fixed_s=limit - 6.0, sync_step_s=1.0) == 6  # at the limit
    assert refine_run_steps(10, 10, fixed_s=1e6, sync_step_s=1.0) == 10  # without --quick: the same length


def test_quick_plans_the_most_steps_that_fit_the_budget():
    from learner.bench.plan import RunCost, plan_steps, step_estimates

    # a 3-step sync calibration run: 5 s warm-up, 4 s steps, 30 s in all: 18 s fixed per run
    cost = RunCost(wall_s=30.0, step_s=[5.0, 4.0, 4.0])
    assert cost.fixed_s == 18.0
    est = step_estimates(["sync", "async", "streaming"], sync_step_s=4.0, rollout_s=1.5, learner_s=1.7)
    assert est["sync"] == 4.0 and est["async"] == est["streaming"] == pytest.approx(2.0)  # 1.7 / 0.85
    drains = {"async": 1}
    # 2 rounds x (3 runs x 18 s fixed + (3n + 1) x ... ): n = 6 costs 2 * (54 + 24 + 14 + 12) = 208 s
    assert plan_steps(210.0, cost.fixed_s, est, drains, rounds=2, most=6, least=3) == (6, pytest.approx(208.0))
    # less left: the most that fits (n = 4: 2 * (54 + 16 + 10 + 8) = 176 s)
    assert plan_steps(180.0, cost.fixed_s, est, drains, rounds=2, most=6, least=3) == (4, pytest.approx(176.0))
    # nothing fits: the least that still measures two steps after the warm-up
    assert plan_steps(10.0, cost.fixed_s, est, drains, rounds=2, most=6, least=3)[0] == 3


# ------------------------------------------------------------------ measurement maths


def _metrics(step, t_start, step_s, learner_s, last_reward, staleness=0.0):
    return {"type": "metrics", "step": step, "values": {
        "timing_s/step": step_s, "timing_s/learner": learner_s, "timing_s/gen": last_reward,
        "timing_s/tail": step_s - last_reward, "step/t_start": t_start, "step/t_end": t_start + step_s,
        "step/last_reward_t": t_start + last_reward, "step/first_backward_t": t_start + last_reward,
        "trainer/idle_ratio": 1 - learner_s / step_s, "rollouter/idle_ratio": 1 - last_reward / step_s,
        "staleness/mean": staleness, "staleness/max": staleness, "reward/mean": 0.5, "memory/peak_rss_mb": 300.0 + step}}


def test_summary_drops_warmup_and_drain_and_takes_idle_from_all_spans_of_the_window():
    events = [_metrics(0, 0, 9.0, 1.0, 8.0), _span(1, None, "learner.backward", 9.5, 10.5),
              _metrics(1, 9, 2.0, 1.0, 1.0), _span(2, None, "learner.backward", 11.0, 12.0),
              _metrics(2, 11, 4.0, 1.0, 3.0), _metrics(3, 15, 0.5, 0.5, 0.0),
              # a rollout span of the measured window that reached the driver only after it
              _span(3, 7, "rollout.generate", 12.0, 15.0)]
    s = summarize([events], warmup=1, end=3)
    assert s["steps_measured"] == 2 and s["step_s_all"] == [2.0, 4.0] and s["step_s"] == 3.0
    assert s["trainer_idle_ratio"] == pytest.approx(1 - 2.0 / 6.0)  # 2 s busy in the 6 s window 9..15
    assert s["rollouter_idle_ratio"] == pytest.approx(1 - 3.0 / 6.0)
    assert s["peak_rss_mb"] == 302.0 and s["last_reward_s"] == 2.0
    assert s["backward_ms"] == pytest.approx(1000.0)  # the measured steps' backward spans only


def test_backward_ms_pools_the_runs_backward_spans():
    first = [_metrics(0, 0, 9.0, 1.0, 8.0), _span(0, None, "learner.backward", 1.0, 9.0),
             _metrics(1, 9, 2.0, 1.0, 1.0), _span(1, None, "learner.backward", 9.0, 9.01)]
    second = [_metrics(0, 0, 9.0, 1.0, 8.0), _metrics(1, 9, 2.0, 1.0, 1.0),
              _span(1, None, "learner.backward", 9.0, 9.02), _span(1, None, "learner.backward", 9.02, 9.05)]
    assert summarize([first, second], warmup=1)["backward_ms"] == pytest.approx(20.0)  # median of 10, 20, 30 ms


def test_rounds_pool_their_steps_and_weight_idle_by_window_length():
    first = [_metrics(0, 0, 9.0, 1.0, 8.0), _metrics(1, 9, 2.0, 1.0, 1.0), _span(1, None, "learner.backward", 9.0, 10.0)]
    second = [_metrics(0, 0, 9.0, 1.0, 8.0), _metrics(1, 9, 6.0, 1.0, 1.0), _span(1, None, "learner.backward", 9.0, 15.0)]
    s = summarize([first, second], warmup=1)
    assert s["runs"] == 2 and s["steps_measured"] == 2 and s["step_s_all"] == [2.0, 6.0] and s["step_s"] == 4.0
    assert s["trainer_idle_ratio"] == pytest.approx(1 - (1.0 + 6.0) / (2.0 + 6.0))


def _run(step_s, last_reward, engine, learner, wait=(), lanes=1, barrier=()):
    """One measured step (step 1 from t = 0): ``engine`` / ``learner`` / ``wait`` / ``barrier``:
    the (t0, t1) of generate, backward, modelled tool-wait and optimizer spans; every engine span
    on each of ``lanes`` rollout workers, the k-th worker's spans shortened to 1/(k+1) of their length."""
    events = [_metrics(0, -9.0, 9.0, 1.0, 8.0), _metrics(1, 0.0, step_s, 1.0, last_reward)]
    for w in range(lanes):
        events += [_span(1, 0, "rollout.generate", a, a + (b - a) / (w + 1), f"rollout/{w}/0") for a, b in engine]
    events += [_span(1, 0, "rollout.tool_wait", a, b, "rollout/0/0") for a, b in wait]
    events += [_span(1, None, "learner.backward", a, b, "learner/0") for a, b in learner]
    events += [_span(1, None, "learner.optimizer", a, b, "learner/0") for a, b in barrier]
    return summarize([events], warmup=1)


def test_each_row_is_held_against_its_own_bound_and_none_exceeds_efficiency_1():
    # sync: generates 0-2.0, its last tool wait ends at 2.5, then learns 2.5-5.8 (the last 0.3 s:
    # optimizer and publish); 6.0 s a step
    sync = _run(6.0, 2.5, engine=[(0.0, 2.0)], wait=[(2.0, 2.5)], learner=[(2.5, 5.5)],
                barrier=[(5.5, 5.8)])
    streaming = _run(3.8, 3.1, engine=[(0.0, 2.2)], learner=[(0.3, 3.1)], barrier=[(3.1, 3.7)])
    # overlapping two batches' tool waits, a step shorter than sync's rollout makespan R: the
    # makespan bound max(R, L) = 3.5 s would give it efficiency 1.75
    overlapped = _run(2.0, 1.5, engine=[(0.0, 0.6), (0.8, 1.4)], wait=[(0.6, 2.0)], learner=[(0.05, 1.95)])
    out = compare({"sync": sync, "streaming": streaming, "fully-async": overlapped})
    assert sync["engine_busy_s"] == pytest.approx(2.0) and sync["learner_work_s"] == pytest.approx(3.3)
    assert sync["barrier_s"] == pytest.approx(0.3) and streaming["barrier_s"] == pytest.approx(0.6)
    assert overlapped["engine_busy_s"] == pytest.approx(1.2)  # the modelled waits are no engine work
    for r in out.values():
        assert r["rollout_s"] == 2.5 and r["learner_s"] == 3.5  # R and L: the sync run's phases
    assert out["sync"]["bound_s"] == pytest.approx(2.0 + 3.3)  # serial: engine, then learner
    assert out["streaming"]["bound_s"] == pytest.approx(max(2.2 + 0.6, 3.4))  # barrier: learner-bound here
    assert out["fully-async"]["bound_s"] == pytest.approx(1.9)  # overlapped: max(1.2, 1.9)
    assert out["sync"]["efficiency"] == pytest.approx(5.3 / 6.0)
    assert out["streaming"]["efficiency"] == pytest.approx(3.4 / 3.8)
    assert out["fully-async"]["efficiency"] == pytest.approx(1.9 / 2.0)
    assert out["streaming"]["speedup_vs_sync"] == pytest.approx(6.0 / 3.8)
    # the same rows, compared without the others: the same efficiencies
    alone = compare({"sync": sync, "streaming": streaming})
    assert alone["sync"]["efficiency"] == out["sync"]["efficiency"]
    assert alone["streaming"]["efficiency"] == out["streaming"]["efficiency"]
    assert compare({"sync": sync, "sync+spec": streaming})["sync+spec"]["bound_rule"] == "overlapped"


def test_engine_work_is_the_mean_over_rollout_workers_of_each_ones_busy_time():
    two = _run(4.0, 2.0, engine=[(0.0, 2.0)], learner=[(2.0, 3.0)], lanes=2)  # busy 2.0 s and 1.0 s
    assert two["engine_busy_s"] == pytest.approx(1.5) and two["step_mean_s"] == pytest.approx(4.0)


def test_the_per_trajectory_reference_row_is_held_against_its_own_learner():
    sync = _run(6.0, 2.5, engine=[(0.0, 2.5)], learner=[(2.5, 6.0)])  # micro-batched: L = 3.5 s
    slow = _run(9.5, 2.5, engine=[(0.0, 2.5)], learner=[(2.5, 9.5)])  # per-trajectory: L = 7.0 s
    out = compare({"sync": sync, "sync-per-trajectory": slow}, alone={"sync-per-trajectory"})
    ref = out["sync-per-trajectory"]
    assert ref["learner_s"] == 7.0 and ref["bound_s"] == pytest.approx(2.5 + 7.0) and ref["efficiency"] == pytest.approx(1.0)
    assert ref["speedup_vs_sync"] == pytest.approx(6.0 / 9.5) and out["sync"]["learner_s"] == 3.5
    assert out["sync"]["bound_s"] == pytest.approx(2.5 + 3.5)  # the reference row's work is not the workload's


def test_only_the_pipelined_schedules_have_drain_steps():
    assert [drain_steps(s, 2) for s in ("sync", "streaming", "async", "fully-async")] == [0, 0, 1, 2]


def _span(step, traj, kind, t0, t1, lane="rollout/0/0"):
    return {"type": "span", "step": step, "traj": traj, "kind": kind, "t0": t0, "t1": t1, "lane": lane}


def test_calibration_scales_only_the_tool_latency_part_of_each_trajectory():
    # step 1 starts at 10 s: trajectory 0 = 0.5 s generation + 1.0 s tool; trajectory 1 = 1.2 s generation
    events = [_metrics(0, 0, 10.0, 2.0, 5.0), _metrics(1, 10.0, 3.5, 2.0, 1.5),
              _span(1, 0, "rollout.generate", 10.0, 10.3), _span(1, 0, "rollout.tool", 10.3, 11.3),
              _span(1, 0, "rollout.generate", 11.3, 11.5), _span(1, 0, "rollout.verify", 11.5, 11.5),
              _span(1, 1, "rollout.generate", 10.0, 11.2), _span(1, 1, "rollout.verify", 11.2, 11.2)]
    cal = calibrate(events, warmup=1, scale_run=1.0)
    assert cal.learner_s == 2.0
    assert cal.rollout_at(1.0) == pytest.approx(1.5) and cal.rollout_at(0.0) == pytest.approx(1.2)
    assert cal.rollout_at(3.0) == pytest.approx(3.5)
    scale = cal.scale_for(1.0, 1000.0)  # R = L = 2.0 -> 0.5 + 1.0 s = 2.0 -> s = 1.5
    assert scale == pytest.approx(1.5, rel=1e-6) and cal.rollout_at(scale) == pytest.approx(2.0)
    assert cal.scale_for(0.5, 1000.0) == 0.0  # generation alone already takes 1.2 s > 0.5 * L


def test_calibration_caps_the_scale_at_the_config_limit():
    cal = Calibration(learner_s=1.0, scale_run=1.0, steps=[[(0.1, 0.001)]])
    assert cal.scale_for(4.0, 1000.0) == 1000.0


# ------------------------------------------------------------------ bad flags


@pytest.mark.parametrize("argv, flag", [
    (["--balance", "-1"], "--balance"),
    (["--balance", "0"], "--balance"),
    (["--schedules", "sync,warp"], "--schedules"),
    (["--steps", "1"], "--steps"),
    (["--warmup", "x"], "--warmup"),
    (["--scale", "2", "--balance", "1"], "--balance"),
    (["--sweep", "1,-2"], "--sweep"),
])
def test_it_rejects_bad_flags_with_exit_2_naming_the_flag(capsys, argv, flag):
    with pytest.raises(SystemExit) as exc:
        main(["bench", *argv])
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["--steps", "3", "--warmup", "3"], "--steps"),
    (["--sweep", "--scale", "1"], "--sweep"),
    (["--json", "/nonexistent-dir/out.json"], "--json"),
])
def test_it_rejects_inconsistent_flags_before_running_anything(capsys, argv, flag):
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert f"error: {flag}" in err and "Traceback" not in err
