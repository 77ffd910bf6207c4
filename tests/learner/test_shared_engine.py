"""The simulator's shared-engine model (learner/sim/shared_engine.py) and where it is used."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from learner.bench.engine_cost import line, main as engine_cost_main, measure_in_subprocess
from learner.sim.results import equal_work_step, simulate
from learner.bench.measure import drain_steps
from learner.rollout.engine import continuous
from learner.sim import shared_engine
from learner.sim.shared_engine import (
    EngineCost, Fleet, Phase, phases, replay_alone, replay_error, with_shared_engine,
)
from learner.sim.workload import BatchWork, Segment, TrajWork, Workload, workload_from_spans
from learner.timeline import Kind


def gen(tokens: int) -> tuple[Phase, ...]:
    return (Phase(tokens, 0.0, Kind.GENERATE, 0),)


def test_rows_share_each_decode_step_and_a_step_slows_with_its_rows():
    # a step costs 10 ms + 1 ms per row: two rows at 12 ms a token, then the survivor at 11 ms
    ends = replay_alone([gen(10), gen(20)], slots=2, cost=EngineCost(0.010, 0.001))
    assert ends == pytest.approx([10 * 0.012, 10 * 0.012 + 10 * 0.011])


def test_a_join_stalls_every_row_for_its_prefill():
    ends = replay_alone([gen(10), gen(20)], slots=2, cost=EngineCost(0.010, 0.001, join_s=0.005))
    assert ends == pytest.approx([0.010 + 0.120, 0.010 + 0.230])


def test_fixed_phases_keep_their_time_and_slots_queue_fifo():
    tool = (Phase(5, 0.0, Kind.GENERATE, 0), Phase(0, 0.3, Kind.TOOL, 0), Phase(5, 0.0, Kind.GENERATE, 1))
    ends = replay_alone([tool, gen(5)], slots=1, cost=EngineCost(0.01, 0.0))
    # one slot: the second trajectory starts when the first ended (0.05 + 0.3 + 0.05)
    assert ends == pytest.approx([0.4, 0.45])


def test_after_a_publish_fully_async_engines_drain_before_anyone_joins():
    fleet = Fleet(EngineCost(0.01, 0.0))
    fleet.start(0.0, "old", gen(10))
    assert fleet.next_time() == pytest.approx(0.1)  # (it joined: a new call)
    fleet.drain()  # a new version at t=0: the running row finishes first
    fleet.start(0.06, "new", gen(5))  # ready at 0.06, joins at 0.1 when the engine is empty
    t = fleet.next_time()
    assert t == pytest.approx(0.1) and fleet.advance(t) == ["old"]
    t = fleet.next_time()
    assert t == pytest.approx(0.15) and fleet.advance(t) == ["new"]
    # its turn is drawn from its join, as the worker records a generate span
    assert fleet.drawn["new"][0][1:3] == pytest.approx((0.1, 0.15))


def traj(tokens: list[int], gaps: float = 0.0, dur: float = 1.0) -> TrajWork:
    segments, t = [], 0.0
    for turn, k in enumerate(tokens):
        segments.append(Segment(Kind.GENERATE, t, t + 0.1, turn, k))
        t += 0.1
        if turn < len(tokens) - 1:
            segments.append(Segment(Kind.TOOL, t, t + gaps, turn))
            t += gaps
    return TrajWork(0, 0, max(dur, t), 0.01, tuple(segments))


def test_phases_keep_recorded_waits_and_gaps_and_fall_back_to_one_wait():
    plan = phases(traj([4, 6], gaps=0.2, dur=0.5))
    assert [(p.tokens, round(p.seconds, 6), p.kind) for p in plan] == [
        (4, 0.0, Kind.GENERATE), (0, 0.2, Kind.TOOL), (6, 0.0, Kind.GENERATE), (0, 0.1, None)]
    assert phases(TrajWork(0, 0, 2.5, 0.1)) == (Phase(0, 2.5, Kind.GENERATE),)


def recorded_under(cost: EngineCost, token_counts: list[list[int]]) -> list[BatchWork]:
    """Batches whose recorded durations are exactly what ``cost`` makes of them (one generate turn each)."""
    batches = []
    for counts in token_counts:
        plans = [gen(k) for k in counts]
        ends = replay_alone(plans, len(plans), cost)
        trajs = [TrajWork(i, i // 2, e, 0.01, (Segment(Kind.GENERATE, 0.0, e, 0, k),))
                 for i, (e, k) in enumerate(zip(ends, counts))]
        batches.append(BatchWork(trajs, {g: 0.0 for g in range(len(counts) // 2)}, 0.01, 0.01))
    return batches


def test_the_replay_error_says_how_well_the_model_replays_a_recording():
    timed = EngineCost(0.002, 0.00005, join_s=0.0001)
    batches = recorded_under(timed, [[3, 5, 8, 13, 4, 6, 7, 9], [16, 2, 5, 5, 9, 11, 3, 1]])
    assert replay_error(batches, 8, timed) == pytest.approx(0.0, abs=1e-9)
    assert replay_error(batches, 8, timed.scaled(2.0)) == pytest.approx(1.0, rel=0.01)
    # drawn workloads carry no tokens: no model
    assert replay_error([BatchWork([TrajWork(0, 0, 1.0, 0.1)], {0: 0.0}, 0.0, 0.0)], 1, timed) is None


def test_the_batching_rule_is_the_torch_engines():
    assert (shared_engine.ADMIT_WAIT_STEPS, shared_engine.ADMIT_SHARE) == (
        continuous.ADMIT_WAIT_STEPS, continuous.ADMIT_SHARE)


def test_rows_ready_mid_call_join_together_and_each_join_copies_the_batch():
    # 16 rows decode; one more is ready at once but waits for 4 decode steps (16 // 8 = 2 would be
    # needed to join sooner), then joins with a copy of the 16 rows' cache
    cost = EngineCost(0.01, 0.0, join_s=0.0, copy_s=0.001)
    fleet = Fleet(cost)
    for i in range(16):
        fleet.start(0.0, i, gen(10))
    assert fleet.next_time() == pytest.approx(0.1)  # the 16 joined together: one call
    fleet.start(0.0, "late", gen(1))  # ready just after the call began
    assert fleet.next_time() == pytest.approx(0.04)  # the waiting row's time to join
    fleet.advance(0.04)
    t = fleet.next_time()  # its one token after the 16-row copy: 0.04 + 0.016 + 0.01
    assert t == pytest.approx(0.066) and fleet.advance(t) == ["late"]


def compute_bound(slots: int = 16) -> Workload:
    """4 groups x 4 trajectories of two 8-token turns, recorded on an engine whose step grows with its rows."""
    cost = EngineCost(0.001, 0.002)
    batches = recorded_under(cost, [[8] * 16] * 3)
    for b in batches:
        for i, t in enumerate(b.trajs):
            b.trajs[i] = replace(t, group=i // 4)
        b.group_close_s = {g: 0.0 for g in range(4)}
    return Workload(batches, slots, 1, 0.0, inputs={"rollout_workers": 1})


def test_fully_async_on_the_engine_model_pays_for_the_rows_it_keeps_in_flight():
    # the engine's step costs about what its rows do (b * n >> a): its throughput is fixed, ~16
    # trajectories per 0.264 s, however many batches fully-async keeps in flight
    recorded = compute_bound()
    modelled = with_shared_engine(recorded, EngineCost(0.001, 0.002))
    assert modelled.inputs["engine_model"]["sync_replay_median_error"] == pytest.approx(0.0, abs=1e-9)
    latency_only = replace(recorded, rollout_slots=modelled.rollout_slots)  # the same rows in flight

    def equal_work(workload):  # over steps 2..9, the run going on past them as the bench's do
        run = simulate(workload, "fully-async", steps=10 + drain_steps("fully-async", 2), warmup=2).run
        return equal_work_step(run, 2, end=10)

    # with fixed durations three batches in flight triple the throughput: the learner bounds it
    assert equal_work(latency_only) < 0.8 * 0.264
    assert equal_work(modelled) == pytest.approx(0.264, rel=0.15)
    # sync loads the engine as the recording did: it replays the recorded durations either way
    assert simulate(modelled, "sync", steps=4, warmup=1).step_s == pytest.approx(
        simulate(recorded, "sync", steps=4, warmup=1).step_s)


def test_equal_work_step_of_a_steady_schedule_is_its_mean_step():
    result = simulate(compute_bound(), "sync", steps=6, warmup=1)
    steps = [r.t_end - r.t_start for r in result.run.steps[1:]]
    # every step trains the batch it produced, except the window's first, produced before it began
    assert result.step_equal_work_s == pytest.approx(equal_work_step(result.run, 1))
    assert min(steps) <= result.step_equal_work_s <= max(steps) * 1.25


def test_a_recorded_step_keeps_the_rollouts_of_groups_with_no_backward():
    # step 0: group 0 trained, group 1 tied (no backward spans): both groups' rollouts are the step's work
    spans = []
    for i in range(4):
        spans.append({"type": "span", "step": 0, "kind": "rollout.generate", "t0": 0.0, "t1": 1.0 + i,
                      "lane": f"rollout/0/{i}", "traj": i, "group": i // 2, "turn": 0, "tokens": 3})
    for i in range(2):
        spans.append({"type": "span", "step": 0, "kind": "learner.backward", "t0": 5.0 + i, "t1": 6.0 + i,
                      "lane": "learner/0", "traj": i, "group": 0})
    spans.append({"type": "span", "step": 0, "kind": "learner.optimizer", "t0": 7.0, "t1": 7.5, "lane": "learner/0"})
    batch = workload_from_spans(spans).batches[0]
    assert sorted((t.traj, t.backward_s) for t in batch.trajs) == [(0, 1.0), (1, 1.0), (2, 0.0), (3, 0.0)]
    assert batch.n_groups == 2
    # sync waits for the tied group's last reward (t=4) before it trains
    result = simulate(workload_from_spans(spans), "sync", steps=2, warmup=0)
    assert result.run.steps[0].last_reward == pytest.approx(4.0)
    assert not [s for s in result.run.spans if s.kind == Kind.BACKWARD and s.traj in (2, 3)]
    # streaming learns the trained group early, but its gradient is not complete before the tied
    # group's last reward says that group adds nothing
    streaming = simulate(workload_from_spans(spans), "streaming", steps=2, warmup=0).run.steps[0]
    assert streaming.grad_ready >= 4.0


def test_engine_cost_fits_lines_and_refuses_bad_rows(capsys):
    assert line([1, 2, 3], [3.0, 5.0, 7.0]) == pytest.approx((1.0, 2.0))
    assert line([1, 2, 3], [7.0, 5.0, 3.0]) == pytest.approx((5.0, 0.0))  # a cost never falls with rows
    with pytest.raises(SystemExit) as err:
        engine_cost_main(["--config", "configs/bench.yaml", "--rows", "32"])
    assert err.value.code == 2 and "--rows" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        engine_cost_main(["--config", "configs/bench.yaml", "--rows", "a,b"])


@pytest.mark.slow
def test_engine_cost_times_the_real_engine_in_a_process_of_its_own():
    import os

    before = os.sched_getaffinity(0)
    doc = measure_in_subprocess("configs/bench.yaml", rows=(8, 32))
    assert os.sched_getaffinity(0) == before  # its pinning stayed in its own process
    assert doc["engine"] == "torch" and doc["b_col_s"] >= 0 and doc["join_s"] > 0
    # decode steps timed at the prompts' width and two turns (2 x 16 tokens) further on, each at 8 and 32 rows
    narrow = doc["prompt_width"]
    assert set(doc["decode_step_s"]) == {str(narrow), str(narrow + 32)}
    assert all(set(at) == {"8", "32"} for at in doc["decode_step_s"].values()) and doc["prefill_s"]["32"] > 0


def test_engine_cost_failure_is_one_line_naming_it(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout: {engine: nope}\n")
    with pytest.raises(RuntimeError, match="engine cost: exited"):
        measure_in_subprocess(str(bad), rows=(8, 32))


def simulate_cli(argv: list[str]) -> int:
    import argparse

    from learner.sim.command import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return run(parser.parse_args(argv))


def test_simulate_takes_measured_engine_costs_for_a_recording(tmp_path, capsys):
    spans = tmp_path / "run.jsonl"
    lines = []
    for i in range(8):  # one step: 2 groups x 4 trajectories, one 8-token turn each
        lines.append({"type": "span", "step": 0, "kind": "rollout.generate", "t0": 0.0, "t1": 0.1 + 0.01 * i,
                      "lane": f"rollout/0/{i}", "traj": i, "group": i // 4, "turn": 0, "tokens": 8})
        lines.append({"type": "span", "step": 0, "kind": "learner.backward", "t0": 0.2 + 0.01 * i,
                      "t1": 0.21 + 0.01 * i, "lane": "learner/0", "traj": i, "group": i // 4})
    spans.write_text("\n".join(json.dumps(e) for e in lines) + "\n")
    cost = tmp_path / "cost.json"
    cost.write_text(json.dumps({"a_s": 0.001, "b_s": 0.001, "join_s": 0.0}))
    out = tmp_path / "sim.json"
    assert simulate_cli(["--spans", str(spans), "--engine-cost", str(cost), "--steps", "6", "--warmup", "1",
                         "--json", str(out)]) == 0
    inputs = json.loads(out.read_text())["inputs"]
    assert inputs["engine_model"]["b_s"] == 0.001 and inputs["engine_model"]["schedules"] == ["fully-async"]


@pytest.mark.parametrize("content, reason", [("{", "is not JSON"), ('{"a_s": 0.1}', "needs 'b_s'"),
                                             ('{"a_s": 0.1, "b_s": -1, "join_s": 0}', "needs 'b_s'")])
def test_bad_engine_costs_exit_2_naming_the_flag(tmp_path, capsys, content, reason):
    cost = tmp_path / "cost.json"
    cost.write_text(content)
    spans = tmp_path / "run.jsonl"
    spans.write_text(json.dumps({"type": "span", "step": 0, "kind": "learner.backward", "t0": 0, "t1": 1,
                                 "lane": "learner/0", "traj": 0, "group": 0}) + "\n")
    assert simulate_cli(["--spans", str(spans), "--engine-cost", str(cost)]) == 2
    err = capsys.readouterr().err
    assert "--engine-cost" in err and reason in err and "Traceback" not in err
    assert simulate_cli(["--engine-cost", str(cost)]) == 2
    assert "--engine-cost: needs --spans" in capsys.readouterr().err


def test_a_running_call_widens_a_column_a_step_and_each_step_costs_more():
    # one row, 10 tokens: the k-th step attends over 10 + k columns at 1 ms a column
    cost = EngineCost(0.0, 0.0, b_col_s=0.001, prompt_width=10)
    (end,) = replay_alone([gen(10)], slots=1, cost=cost)
    assert end == pytest.approx(sum(0.001 * (10 + k) for k in range(10)), rel=0.05)
    # a second call starts as narrow as its prompts again
    fleet = Fleet(cost)
    fleet.start(0.0, "a", gen(10))
    t = fleet.next_time()
    assert fleet.advance(t) == ["a"]
    fleet.start(t, "b", gen(10))
    assert fleet.next_time() - t == pytest.approx(end)
