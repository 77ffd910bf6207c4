"""Per-step metrics as a pure function of a step's spans, trajectories and learner stats."""

import pytest

from learner.driver.metrics import StepRecord, step_metrics
from learner.timeline import Kind, Metric
from learner.trajectory import Trajectory


def traj(i: int, versions: list[int], reward: float, t_reward: float) -> Trajectory:
    return Trajectory(id=i, group=0, step=3, input_ids=[1, 2, 3], loss_mask=[0, 1, 1], behavior_logprobs=[0.0] * 3,
                      reward=reward, turn_versions=versions, turn_spans=[(1, 3)] * len(versions), t_reward=t_reward)


def test_step_metrics_come_from_the_spans_and_trajectories_alone():
    rec = StepRecord(step=3, t_start=10.0, trajs=[traj(0, [1, 2], 1.0, 12.0), traj(1, [2], 0.0, 13.0)],
                     trained_version=3, first_backward=12.5, learner_stats={"grad_norm": 0.5, "clip_frac": 0.25},
                     mismatch={Metric.MISMATCH_KL: 0.0})
    spans = [{"kind": Kind.GENERATE, "t0": 10.0, "t1": 13.0}, {"kind": Kind.BACKWARD, "t0": 12.5, "t1": 13.5},
             {"kind": Kind.OPTIMIZER, "t0": 13.5, "t1": 14.0}]
    values = step_metrics(rec, spans, 14.0, waits=[(11.0, 12.0)], version=4, schedule="async",
                          memory_mb={Metric.PEAK_RSS_MB: 100.0})
    assert values[Metric.STEP_S] == 4.0 and values[Metric.TAIL_S] == 1.0
    assert values[Metric.TRAINER_IDLE] == pytest.approx(2.5 / 4) and values[Metric.ROLLOUT_IDLE] == pytest.approx(0.25)
    assert values[Metric.TRAINER_WAIT] == pytest.approx(0.25)
    # staleness per trained turn: 3 - 1, 3 - 2, 3 - 2; its histogram is in the metrics too
    assert values[Metric.STALENESS_MEAN] == pytest.approx(4 / 3) and values[Metric.STALENESS_MAX] == 2.0
    assert values[f"{Metric.STALENESS_TURNS}1"] == 2.0 and values[f"{Metric.STALENESS_TURNS}2"] == 1.0
    assert values[Metric.REWARD_MEAN] == 0.5 and values[Metric.CLIP_FRAC] == 0.25 and values[Metric.VERSION] == 4.0
    assert Metric.DROPPED_GROUPS not in values  # fully-async only


def test_late_close_share_counts_the_groups_that_closed_in_the_last_tenth_of_the_rollout():
    def member(i: int, group: int, t_reward: float) -> Trajectory:
        t = traj(i, [3], 1.0, t_reward)
        t.group = group
        return t
    # the step starts at 10, the last reward at 20: the last tenth is [19, 20]; group 1 closes at
    # 19.5 (its first member at 11), group 2 at 20, groups 0 and 3 before
    trajs = [member(0, 0, 12.0), member(1, 0, 14.0), member(2, 1, 11.0), member(3, 1, 19.5),
             member(4, 2, 20.0), member(5, 3, 18.9)]
    rec = StepRecord(step=3, t_start=10.0, trajs=trajs, trained_version=3,
                     learner_stats={"early_row_share": 0.25, "early_cost_ratio": 1.4, "deferred_cost": 3})
    values = step_metrics(rec, [], 21.0, waits=[], version=4, schedule="streaming", memory_mb={})
    assert values[Metric.LATE_CLOSE_SHARE] == pytest.approx(0.5)
    assert values[Metric.EARLY_ROW_SHARE] == 0.25 and values[Metric.EARLY_COST_RATIO] == 1.4
    assert values[Metric.DEFERRED + "cost"] == 3.0
