"""thundersync simulate: the discrete-event model of the four schedules (pure Python, fast)."""

from __future__ import annotations

import argparse
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from learner.sim.workload import (
    PAPER_PRESET, BatchWork, Segment, TrajWork, Workload, at_speed, synthetic_workload, with_overrides,
)
from learner.sim.engine import run_schedule
from learner.sim.command import add_arguments, run, simulate, simulate_all, simulate_spans, workload_from_spans
from learner.chrome_trace import chrome_trace
from learner.timeline import LEARNER_KINDS, ROLLOUT_KINDS, SPAN_KINDS


def cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="thundersync simulate")
    add_arguments(parser)
    return run(parser.parse_args(argv))


def modelled(steps: int = 10, seed: int = 0, **overrides) -> Workload:
    return synthetic_workload(with_overrides(PAPER_PRESET, **overrides), steps, seed)


@pytest.fixture(scope="module")
def paper():
    return simulate_all(modelled(steps=6), steps=6, warmup=2)


# ------------------------------------------------------------------ the paper preset


def test_paper_preset_reproduces_sync_and_streaming_within_3_percent(paper):
    assert paper["sync"].step_s == pytest.approx(1296.0, rel=0.03)
    assert paper["streaming"].step_s == pytest.approx(687.7, rel=0.03)
    assert paper["streaming"].tail_s == pytest.approx(20.5, rel=0.03)
    assert paper["sync"].rollout_s == pytest.approx(650.0, rel=1e-9)
    assert paper["sync"].learner_s == pytest.approx(646.4, rel=1e-3)
    # the paper's 49.5% learner idle in sync
    assert paper["sync"].trainer_idle_ratio == pytest.approx(0.495, abs=0.02)
    assert paper["streaming"].speedup_vs_sync == pytest.approx(1.9, abs=0.05)


def test_paper_preset_holds_for_other_seeds_and_tail_shapes():
    for seed, sigma in [(1, 1.0), (7, 0.8), (3, 1.4)]:
        res = simulate_all(modelled(steps=3, seed=seed, rollout_sigma=sigma), ["streaming"], steps=3, warmup=1)
        assert res["streaming"].step_s == pytest.approx(687.7, rel=0.03), (seed, sigma)


def test_staleness_is_measured_zero_one_and_bounded(paper):
    assert paper["sync"].staleness_max == 0 and paper["streaming"].staleness_max == 0
    assert paper["async"].staleness_mean == 1.0 and paper["async"].staleness_max == 1
    for k in (0, 1, 3):
        res = simulate(modelled(steps=6, rollout_slots=64), "fully-async", steps=6, max_staleness=k)
        assert res.staleness_max <= k
    no_lag = simulate(modelled(steps=4), "fully-async", steps=4, warmup=1, max_staleness=0)
    assert no_lag.step_s == pytest.approx(paper["sync"].step_s, rel=0.01)


def test_streaming_speedup_is_about_1_when_rollout_dominates_and_about_2_when_balanced():
    rollout_heavy = modelled(rollout_makespan_s=1000.0, learner_total_s=10.0, learner_ranks=1, optimizer_s=0.1,
                             publish_s=0.1, reduce_s=0.0)
    assert simulate_all(rollout_heavy, ["streaming"], steps=3, warmup=1)["streaming"].speedup_vs_sync == pytest.approx(1.0, abs=0.02)
    balanced = modelled(prompts=64, group_size=8, rollout_makespan_s=100.0, learner_total_s=100.0, learner_ranks=1,
                        optimizer_s=0.1, publish_s=0.1, reduce_s=0.0, group_close_s=0.0)
    assert simulate_all(balanced, ["streaming"], steps=3, warmup=1)["streaming"].speedup_vs_sync == pytest.approx(2.0, abs=0.05)


def test_same_seed_same_result_other_seed_other_draws():
    a = simulate(modelled(steps=3, seed=5), "streaming", steps=3, warmup=1).as_dict()
    assert a == simulate(modelled(steps=3, seed=5), "streaming", steps=3, warmup=1).as_dict()
    assert a["per_step"] != simulate(modelled(steps=3, seed=6), "streaming", steps=3, warmup=1).as_dict()["per_step"]


# ------------------------------------------------------------------ invariants on random workloads


def random_workload(data) -> Workload:
    prompts = data.draw(st.integers(1, 4))
    batches = []
    for b in range(data.draw(st.integers(1, 3))):  # group ids differ per batch, as in a recording
        trajs = [TrajWork(i, 100 * b + i % prompts, data.draw(st.floats(0.1, 10.0)), data.draw(st.floats(0.01, 3.0)))
                 for i in range(prompts * data.draw(st.integers(1, 4)))]
        batches.append(BatchWork(trajs, {100 * b + g: data.draw(st.floats(0.0, 0.5)) for g in range(prompts)},
                                 data.draw(st.floats(0.0, 1.0)), data.draw(st.floats(0.0, 1.0))))
    return Workload(batches, data.draw(st.integers(1, 12)), data.draw(st.integers(1, 3)), data.draw(st.floats(0.0, 0.5)))


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_schedules_respect_capacity_staleness_and_streaming_beats_sync(data):
    workload = random_workload(data)
    k = data.draw(st.integers(0, 3))
    assign = data.draw(st.sampled_from(["least-loaded", "round-robin", "group-affinity"]))
    res = simulate_all(workload, steps=5, warmup=1, max_staleness=k, assign=assign)
    assert res["sync"].staleness_max == 0 and res["streaming"].staleness_max == 0
    assert res["async"].staleness_max <= 1 and res["fully-async"].staleness_max <= k
    assert res["streaming"].step_s <= res["sync"].step_s + 1e-9
    for r in res.values():
        lanes: dict[str, list] = {}
        for s in r.run.spans:
            lanes.setdefault(s.lane, []).append(s)
        for spans in lanes.values():  # a slot holds one trajectory, a rank runs one task at a time
            spans.sort(key=lambda s: (s.t0, s.t1))
            for a, b in zip(spans, spans[1:]):
                assert b.t0 >= a.t1 - 1e-9 or (a.traj is not None and a.traj == b.traj)
        # every trained trajectory's backward starts after its reward
        ends = {s.traj: s.t1 for s in r.run.spans if s.kind in ROLLOUT_KINDS}
        assert all(s.t0 >= ends[s.traj] - 1e-9 for s in r.run.spans if s.kind == "learner.backward")


# ------------------------------------------------------------------ replay of a recording


def hand_made_sync_run() -> list[dict]:
    """Two sync steps of 2 groups x 2 trajectories, 4 slots, one learner rank: 11.0 s each.

    Rewards at 3, 5, 4, 6 s; then four 1 s backward passes, two 0.1 s closes, optimizer
    0.5 s, publish 0.3 s: 6 + 4 + 0.2 + 0.5 + 0.3 = 11.0. Trajectory 1 has two turns and a
    teacher score that overlaps its tool call (the envelope counts that time once).
    """
    events = [{"type": "run", "status": "started", "config": {"train": {"schedule": "sync"}}, "t": 0.0}]
    spans = []
    for step in range(2):
        t = 11.0 * step
        base = 4 * step
        rollouts = {
            0: [("rollout.generate", 0, 2.5), ("rollout.verify", 2.5, 3)],
            1: [("rollout.generate", 0, 2), ("rollout.tool", 2, 3.5), ("teacher.score", 2, 3),
                ("rollout.generate", 3.5, 4.8), ("rollout.verify", 4.8, 5)],
            2: [("rollout.generate", 0, 4)],
            3: [("rollout.generate", 0, 6)],
        }
        for i, parts in rollouts.items():
            for turn, (kind, a, b) in enumerate(parts):
                spans.append({"step": step, "kind": kind, "t0": t + a, "t1": t + b, "lane": f"rollout/{i // 2}/{i % 2}",
                              "traj": base + i, "group": 2 * step + i // 2, "turn": turn, "policy_version": step})
        learner = [("learner.backward", 0, 6, 7), ("learner.backward", 2, 7, 8), ("learner.backward", 1, 8, 9),
                   ("learner.group_close", None, 9, 9.1), ("learner.backward", 3, 9.1, 10.1),
                   ("learner.group_close", None, 10.1, 10.2), ("learner.optimizer", None, 10.2, 10.7),
                   ("learner.publish", None, 10.7, 11.0)]
        closes = iter([2 * step, 2 * step + 1])
        for kind, i, a, b in learner:
            group = 2 * step + i // 2 if i is not None else (next(closes) if kind == "learner.group_close" else None)
            spans.append({"step": step, "kind": kind, "t0": t + a, "t1": t + b, "lane": "learner/0",
                          "traj": None if i is None else base + i, "group": group, "policy_version": step})
    events += [{"type": "span", "seq": n, "tokens": 0, **s} for n, s in enumerate(spans)]
    events += [{"type": "metrics", "step": s, "values": {"timing_s/step": 11.0}} for s in range(2)]
    return events


def test_replaying_a_recording_reproduces_its_measured_sync_step():
    events = hand_made_sync_run()
    workload = workload_from_spans(events)
    assert (workload.rollout_slots, workload.learner_ranks) == (4, 1)
    assert [t.rollout_s for t in workload.batches[0].trajs] == [3.0, 5.0, 4.0, 6.0]
    doc = simulate_spans(events, steps=4, warmup=1)
    assert doc["inputs"]["measured_step_s"] == {"0": 11.0, "1": 11.0}
    assert doc["schedules"]["sync"]["step_s"] == pytest.approx(11.0)
    # streaming: backward at 3, 4, 5 (+ close 0.1), the last reward's at 6.1, close, 0.8 s barrier
    assert doc["schedules"]["streaming"]["step_s"] == pytest.approx(8.0)
    # bare span dicts (no "type") replay the same
    assert simulate_spans([e for e in events if e["type"] == "span"], ["sync"], steps=4, warmup=1)[
        "schedules"]["sync"]["step_s"] == pytest.approx(11.0)


def test_cli_replays_a_span_file_and_writes_json_and_viewable_events(tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in hand_made_sync_run()))
    assert cli(["--spans", str(path), "--steps", "3", "--warmup", "1", "--json", str(tmp_path / "out.json"),
                "--events", str(tmp_path / "sim.jsonl"), "--schedules", "sync,streaming"]) == 0
    table = capsys.readouterr().out
    assert "measured step_s" in table and "11.0" in table
    doc = json.loads((tmp_path / "out.json").read_text())
    assert set(doc["schedules"]) == {"sync", "streaming"} and doc["inputs"]["source"] == "spans"
    events = [json.loads(line) for line in (tmp_path / "sim.streaming.jsonl").read_text().splitlines()]
    spans = [e for e in events if e["type"] == "span"]
    assert [s["seq"] for s in spans] == list(range(len(spans)))
    assert {s["kind"] for s in spans} <= set(SPAN_KINDS) and "teacher.score" in {s["kind"] for s in spans}
    assert all(s["lane"].startswith("learner/") for s in spans if s["kind"] in LEARNER_KINDS)
    assert all(s["lane"].startswith("rollout/0/") for s in spans if s["kind"] in ROLLOUT_KINDS)
    assert len([e for e in events if e["type"] == "metrics"]) == 3 and events[-1]["status"] == "finished"
    trace = chrome_trace(spans, "simulated")
    assert any(e["ph"] == "X" for e in trace["traceEvents"])


def test_cli_paper_preset_prints_reference_column(capsys):
    assert cli(["--preset", "paper", "--schedules", "sync,streaming", "--steps", "4", "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert "paper step_s" in out and "687.7" in out


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize("argv, flag", [
    (["--prompts", "0"], "--prompts"),
    (["--rollout-makespan", "-3"], "--rollout-makespan"),
    (["--schedules", "sync,turbo"], "--schedules"),
    (["--rollout-dist", "pareto"], "--rollout-dist"),
    (["--steps", "two"], "--steps"),
])
def test_bad_flag_values_exit_2_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as exc:
        cli(argv)
    assert exc.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("argv, flag", [
    (["--warmup", "5", "--steps", "5"], "--warmup"),
    (["--learner-total", "10"], "--learner-total"),
    (["--rollout-dist", "uniform", "--rollout-sigma", "2"], "--rollout-sigma"),
    (["--spans", "/nonexistent/run.jsonl"], "--spans"),
])
def test_inconsistent_flags_exit_2_naming_the_flag(argv, flag, capsys):
    assert cli(argv) == 2
    err = capsys.readouterr().err
    assert flag in err and "Traceback" not in err


def test_spans_refuses_workload_flags_and_bad_lines(tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in hand_made_sync_run()))
    assert cli(["--spans", str(path), "--prompts", "4"]) == 2
    assert "--prompts" in capsys.readouterr().err
    path.write_text('{"type": "run"}\nnot json\n')
    assert cli(["--spans", str(path)]) == 2
    assert "line 2" in capsys.readouterr().err


def test_fully_async_drops_groups_too_stale_and_keeps_its_pipeline_full():
    # one straggler per dispatch batch outlives max_staleness versions: the driver's policy
    # drops it when a step forms without it, and a dropped group's place goes to a new one
    def batch(b: int) -> BatchWork:
        trajs = [TrajWork(i, 10 * b + i, 30.0 if i == 0 else 1.0, 1.0) for i in range(4)]
        return BatchWork(trajs, {10 * b + g: 0.0 for g in range(4)}, 0.1, 0.1)

    workload = Workload([batch(b) for b in range(3)], rollout_slots=8, learner_ranks=1, reduce_s=0.0)
    run = run_schedule(workload, "fully-async", steps=12, max_staleness=1)
    assert len(run.steps) == 12 and run.dropped_groups >= 1
    assert max(max(rec.staleness) for rec in run.steps) <= 1
    assert all(len(rec.trajs) == 4 for rec in run.steps)


def test_at_speed_scales_compute_and_keeps_the_modelled_tool_waits():
    segments = (Segment("rollout.generate", 0.0, 1.0), Segment("rollout.tool", 1.2, 3.2), Segment("rollout.generate", 3.2, 4.0))
    w = Workload([BatchWork([TrajWork(0, 0, 4.1, 0.5, segments)], {0: 0.1}, 0.2, 0.3)], 1, 1, 0.05)
    slow = at_speed(w, 2.0).batches[0]
    t = slow.trajs[0]
    assert [x for s in t.segments for x in (s.t0, s.t1)] == pytest.approx([0.0, 2.0, 2.4, 4.4, 4.4, 6.0])
    assert t.rollout_s == pytest.approx(6.2) and t.backward_s == 1.0
    assert [slow.group_close_s[0], slow.optimizer_s, slow.publish_s] == pytest.approx([0.2, 0.4, 0.6])
    assert at_speed(w, 2.0).reduce_s == pytest.approx(0.1)
    with pytest.raises(ValueError, match="slower"):
        at_speed(w, 0.0)


def test_without_tool_waits_a_slower_machine_stretches_every_schedule_alike():
    w = modelled(steps=3, prompts=8, group_size=4)  # drawn rollouts: no recorded tool segments
    base = simulate_all(w, steps=3, warmup=1)
    slow = simulate_all(at_speed(w, 1.5), steps=3, warmup=1)
    for name in base:
        assert slow[name].step_s == pytest.approx(1.5 * base[name].step_s, rel=1e-9)
        assert slow[name].speedup_vs_sync == pytest.approx(base[name].speedup_vs_sync, rel=1e-9)


def test_a_draft_sampled_in_the_step_before_is_not_rollout_time_of_the_step_it_trains():
    events = hand_made_sync_run()
    draft = {"type": "span", "seq": 10_000, "tokens": 12, "step": 1, "kind": "rollout.draft", "t0": 1.0, "t1": 2.5,
             "lane": "rollout/0/0", "traj": 4, "group": 2, "turn": 0, "policy_version": 0}
    workload = workload_from_spans(events + [draft])
    assert [t.rollout_s for t in workload.batches[1].trajs] == [3.0, 5.0, 4.0, 6.0]
    assert "rollout.draft" not in {seg.kind for t in workload.batches[1].trajs for seg in t.segments}
    assert simulate_spans(events + [draft], ["sync"], steps=4, warmup=1)["schedules"]["sync"]["step_s"] == \
        pytest.approx(11.0)


def test_the_summary_without_per_step_metrics_is_the_same_summary():
    """``per_step=False`` (the run page's advisor) skips only the per-step idle passes."""
    full = simulate(modelled(steps=4, seed=2), "streaming", steps=4, warmup=1).as_dict()
    summary = simulate(modelled(steps=4, seed=2), "streaming", steps=4, warmup=1, per_step=False).as_dict()
    assert summary["per_step"] == [] and len(full["per_step"]) == 4
    assert {k: v for k, v in summary.items() if k != "per_step"} == {k: v for k, v in full.items() if k != "per_step"}
