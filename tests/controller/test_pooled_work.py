"""The compare page's pooled rows hold each schedule's equal-work step and its share of sync's
slowest decile, from the stored spans and metrics (controller/comparisons/trained_work.py, controller/comparisons/pooled.py)."""

import pytest

from controller.models import Schedule, Span, StepMetric
from controller.comparisons.pooled import pooled_summary
from controller.comparisons.trained_work import trained_tokens, window_counts

from .conftest import make_run


def store(run, steps: int, finished_per_step: int, dropped_groups: int, tokens: list[int]) -> list[dict]:
    """Steps of 1 s from t=10; ``finished_per_step`` rewards inside each; one generate span per
    trained trajectory with ``tokens[i]`` tokens (trained in step i % steps)."""
    rows, seq = [], 0
    for step in range(steps):
        values = {"timing_s/step": 1.0, "step/t_start": 10.0 + step, "step/t_end": 11.0 + step,
                  "rollout/dropped_groups": float(dropped_groups if step == 0 else 0)}
        StepMetric.objects.create(run=run, step=step, values=values)
        rows.append({"step": step, **values})
        for k in range(finished_per_step):
            Span.objects.create(run=run, seq=seq, step=step, kind="rollout.verify", t0=10.5 + step, t1=10.5 + step,
                                lane=f"rollout/0/{k}", traj=100 * step + k, group=0)
            seq += 1
    for i, n in enumerate(tokens):
        Span.objects.create(run=run, seq=seq, step=i % steps, kind="rollout.generate", t0=0.0, t1=0.1,
                            lane="rollout/0/0", traj=1000 + i, group=i // 2, tokens=n)
        seq += 1
    # a rollout not trained (step -1: fully-async's before a step takes it) is not counted
    Span.objects.create(run=run, seq=seq, step=-1, kind="rollout.generate", t0=0.0, t1=0.1, lane="rollout/0/0",
                        traj=9999, group=99, tokens=500)
    return rows


@pytest.fixture
def fully_async_preset(db):
    return Schedule.objects.create(owner=None, name="fully-async", kind="fully-async")


def test_equal_work_and_the_slowest_decile_per_pooled_schedule(alice_experiment, sync_preset, fully_async_preset):
    sync = make_run(alice_experiment, sync_preset, steps=2)
    fast = make_run(alice_experiment, fully_async_preset, steps=2)
    group = sync.config["train"]["group_size"]
    batch = sync.config["train"]["prompts_per_step"] * group
    # sync produced its whole batch each step; fully-async half of it, and dropped one group
    rows = {sync.pk: store(sync, 2, batch, 0, [10] * 9 + [40]),
            fast.pk: store(fast, 2, batch // 2, 1, [10] * 10)}
    assert window_counts(sync, rows[sync.pk]) == (2.0, 2, 2 * batch, 2 * batch)
    assert window_counts(fast, rows[fast.pk]) == (2.0, 2, 2 * batch, batch - group)
    assert sorted(trained_tokens(sync)) == [10] * 9 + [40]
    pooled = {g["schedule"]: g for g in pooled_summary([sync, fast], rows)}
    assert pooled["sync"]["step_equal_work_s"] == pytest.approx(1.0)
    assert pooled["fully-async"]["step_equal_work_s"] == pytest.approx(2.0 * batch / (batch - group))
    # sync's slowest decile: 40+ tokens, one in ten of its own; none of fully-async's
    assert (pooled["sync"]["slowest_decile_tokens"], pooled["sync"]["slowest_decile_share"]) == (40, 0.1)
    assert pooled["fully-async"]["slowest_decile_share"] == 0.0
    assert "trained_tokens_all" not in pooled["sync"]  # bulky: not in the API


def test_a_run_without_timed_steps_or_spans_has_no_figures(alice_experiment, sync_preset):
    run = make_run(alice_experiment, sync_preset, steps=2)
    assert window_counts(run, [{"step": 0, "timing_s/step": 1.0}]) is None
    (group,) = pooled_summary([run], {run.pk: []})
    assert group["step_equal_work_s"] is None and group["slowest_decile_share"] is None
