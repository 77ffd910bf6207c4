"""GET /api/compare/: the compare page's summary, every figure from stored metrics and spans."""

import statistics

import pytest

from controller.models import Span, StepMetric

from .conftest import make_run

pytestmark = pytest.mark.django_db


def store_steps(run, steps):
    """``steps``: [(t_start, t_end, last_reward, first_backward, reward, staleness)] per step."""
    for i, (t0, t1, last_reward, first_backward, reward, stale) in enumerate(steps):
        StepMetric.objects.create(run=run, step=i, values={
            "timing_s/step": t1 - t0, "timing_s/tail": t1 - last_reward, "step/t_start": t0, "step/t_end": t1,
            "step/last_reward_t": last_reward, "step/first_backward_t": first_backward,
            "reward/mean": reward, "staleness/mean": stale, "staleness/max": 2 * stale,
        })


@pytest.fixture
def sync_and_streaming(alice_experiment, sync_preset, streaming_preset):
    sync = make_run(alice_experiment, sync_preset, steps=3, name="sync")
    # boot ends at 10 s: the first step starts there
    store_steps(sync, [(10, 14, 12, 12.5, 0.1, 0.0), (14, 18, 16.5, 16.5, 0.4, 0.0), (18, 21, 20, 20.2, 0.6, 0.0)])
    streaming = make_run(alice_experiment, streaming_preset, steps=3, name="streaming")
    store_steps(streaming, [(30, 32, 31.5, 30.5, 0.2, 0.0), (32, 34.5, 34, 32.4, 0.5, 0.5),
                            (34.5, 36, 35.8, 34.6, 0.7, 1.0)])
    Span.objects.bulk_create([
        Span(run=streaming, seq=0, step=0, kind="rollout.generate", t0=29.0, t1=31.0, lane="rollout/0/0"),  # before step 0
        Span(run=streaming, seq=1, step=0, kind="learner.backward", t0=30.5, t1=31.5, lane="learner/0", traj=0),
        Span(run=streaming, seq=2, step=1, kind="rollout.generate", t0=33.0, t1=35.0, lane="rollout/0/0"),
        Span(run=streaming, seq=3, step=1, kind="learner.backward", t0=34.0, t1=35.5, lane="learner/0", traj=1),
    ])
    return sync, streaming


def test_the_sync_run_is_the_reference_and_figures_come_from_the_stored_metrics(alice_client, sync_and_streaming):
    sync, streaming = sync_and_streaming
    body = alice_client.get(f"/api/compare/?runs={streaming.pk},{sync.pk}&smoothing=0").json()
    assert body["reference"] == sync.pk
    rollout_s = statistics.median([12 - 10, 16.5 - 14, 20 - 18])
    learner_s = statistics.median([14 - 12.5, 18 - 16.5, 21 - 20.2])
    assert body["rollout_s"] == pytest.approx(rollout_s) and body["learner_s"] == pytest.approx(learner_s)
    fast, ref = body["runs"]
    # each run's own bound (docs/bench-report.md "Efficiency"): only streaming stored spans; over its window
    # [30, 36], 3 steps: engine 1 s (29-31 clipped) + 2 s, learner 1 s + 1.5 s, no optimizer span
    assert fast["engine_busy_s"] == pytest.approx(3.0 / 3) and fast["learner_work_s"] == pytest.approx(2.5 / 3)
    assert fast["bound_rule"] == "barrier" and fast["barrier_s"] == 0.0
    assert fast["bound_s"] == pytest.approx(max(1.0 + 0.0, 2.5 / 3))
    assert [fast["id"], ref["id"]] == [streaming.pk, sync.pk]
    assert ref["step_s"] == 4 and ref["speedup_vs_sync"] == 1.0
    assert fast["step_s"] == 2 and fast["speedup_vs_sync"] == 2.0
    assert fast["step_mean_s"] == pytest.approx(2.0) and fast["efficiency"] == pytest.approx(1.0 / 2.0)
    assert ref["efficiency"] is None and ref["engine_busy_s"] is None  # no spans: its work is unknown
    assert fast["steps_done"] == 3 and fast["final_reward"] == 0.7
    assert fast["tail_s"] == pytest.approx(statistics.median([0.5, 0.5, 0.2]))
    assert fast["staleness_mean"] == pytest.approx(0.5) and fast["staleness_max"] == 2.0
    # The default reward level is the highest every run reached (0.6, sync's best); time from
    # the first step's start, boot excluded: sync reaches it at the end of step 2 (21 - 10 s),
    # streaming at the end of step 2 (36 - 30 s).
    assert body["reward_level"] == 0.6
    assert (ref["time_to_reward_s"], ref["reward_step"]) == (11.0, 2)
    assert (fast["time_to_reward_s"], fast["reward_step"]) == (6.0, 2)
    # Idle over the training window [30, 36] from the spans (the rollout before 30 s is clipped).
    assert fast["training_s"] == 6.0
    assert fast["learner_idle"] == pytest.approx(1 - (1.0 + 1.5) / 6)
    assert fast["rollout_idle"] == pytest.approx(1 - (1.0 + 2.0) / 6)
    assert ref["learner_idle"] == 1.0  # no spans stored for the sync run


def test_a_chosen_reward_level_and_no_sync_run(alice_client, sync_and_streaming, alice_experiment, streaming_preset):
    _, streaming = sync_and_streaming
    other = make_run(alice_experiment, streaming_preset, name="empty")
    body = alice_client.get(f"/api/compare/?runs={streaming.pk},{other.pk}&reward=0.45&smoothing=0").json()
    assert body["reference"] is None
    fast, empty = body["runs"]
    assert (fast["time_to_reward_s"], fast["reward_step"]) == (4.5, 1)
    assert fast["speedup_vs_sync"] is None
    # efficiency needs no sync run: each run is held against its own work
    assert fast["bound_s"] == pytest.approx(1.0) and fast["efficiency"] == pytest.approx(0.5)
    assert empty["efficiency"] is None
    assert empty["steps_done"] == 0 and empty["step_s"] is None and empty["learner_idle"] is None
    never = alice_client.get(f"/api/compare/?runs={streaming.pk},{other.pk}&reward=5").json()
    assert never["runs"][0]["time_to_reward_s"] is None


@pytest.mark.parametrize("query, field", [
    ("", "runs"), ("runs=1", "runs"), ("runs=1,1", "runs"), ("runs=a,b", "runs"), ("runs=" + ",".join(map(str, range(1, 14))), "runs"),
    ("runs=1,99999999999", "runs"), ("runs=1,2&reward=high", "reward"), ("runs=1,2&reward=nan", "reward"),
    ("runs=1,2&smoothing=1", "smoothing"), ("runs=1,2&smoothing=x", "smoothing"),
])
def test_bad_queries_name_the_parameter(alice_client, query, field):
    response = alice_client.get(f"/api/compare/?{query}")
    assert response.status_code == 400 and field in response.json()["errors"]


def test_another_users_run_is_not_found(alice_client, sync_and_streaming, bob_run):
    sync, _ = sync_and_streaming
    assert alice_client.get(f"/api/compare/?runs={sync.pk},{bob_run.pk}").status_code == 404


def test_time_to_reward_reads_the_smoothed_reward_and_steps_have_a_spread(alice_client, sync_and_streaming):
    sync, streaming = sync_and_streaming
    body = alice_client.get(f"/api/compare/?runs={streaming.pk},{sync.pk}&smoothing=0.5").json()
    fast, ref = body["runs"]
    # sync's rewards 0.1, 0.4, 0.6 smooth to 0.1, 0.25, 0.425; streaming's 0.2, 0.5, 0.7 to
    # 0.2, 0.35, 0.525: the default level is the lower best, 0.425, reached at sync's last step
    assert body["reward_smoothing"] == 0.5 and body["reward_level"] == pytest.approx(0.425)
    assert (ref["time_to_reward_s"], ref["reward_step"]) == (11.0, 2)
    assert (fast["time_to_reward_s"], fast["reward_step"]) == (6.0, 2)
    # step times: streaming 2, 2.5, 1.5 s -> p10 1.6 s, p90 2.4 s (inclusive deciles)
    assert (fast["step_p10_s"], fast["step_p90_s"]) == (pytest.approx(1.6), pytest.approx(2.4))
    assert fast["speedup_p10"] == pytest.approx(4 / 2.4) and fast["speedup_p90"] == pytest.approx(4 / 1.6)
    assert body["warnings"] == []


def test_no_run_exceeds_efficiency_1_where_max_r_l_gave_more(alice_client, alice_experiment, sync_preset):
    """A run that never drains the engine (fully-async overlapping two batches' tool waits) steps
    faster than the sync run's R: max(R, L) / step gave it 2.5; the work bound, the bench's
    (learner.bench.efficiency), holds every run to at most 1."""
    from learner.bench.efficiency import own_bound, window_work

    from controller.models import Schedule

    fully_async = Schedule.objects.create(owner=None, name="fully-async", kind="fully-async")
    sync = make_run(alice_experiment, sync_preset, steps=3, name="sync")
    # R = 2.5 s (last reward - start), L = 0.5 s; engine busy 1 s of each step (the rest is tool wait)
    store_steps(sync, [(0, 3, 2.5, 2.5, 0.1, 0.0), (3, 6, 5.5, 5.5, 0.2, 0.0), (6, 9, 8.5, 8.5, 0.3, 0.0)])
    fast = make_run(alice_experiment, fully_async, steps=3, name="fully-async")
    store_steps(fast, [(20, 21, 20.8, 20.1, 0.1, 1.0), (21, 22, 21.8, 21.1, 0.2, 1.0), (22, 23, 22.8, 22.1, 0.3, 1.0)])
    spans, seq = [], 0
    for run, starts in ((sync, (0, 3, 6)), (fast, (20, 21, 22))):
        for step, t in enumerate(starts):
            gen_end = t + (1.0 if run is sync else 0.6)
            for lane, kind, t0, t1 in (("rollout/0/0", "rollout.generate", t, gen_end),
                                       ("rollout/0/1", "rollout.tool_wait", gen_end, t + 2.5),
                                       ("learner/0", "learner.backward", t + (2.5 if run is sync else 0.1),
                                        t + (3.0 if run is sync else 0.5))):
                spans.append(Span(run=run, seq=seq, step=step, kind=kind, t0=t0, t1=min(t1, t + 3), lane=lane))
                seq += 1
    Span.objects.bulk_create(spans)
    body = alice_client.get(f"/api/compare/?runs={sync.pk},{fast.pk}").json()
    ref, quick = body["runs"]
    assert max(body["rollout_s"], body["learner_s"]) / quick["step_s"] == pytest.approx(2.5)  # the old number
    assert all(r["efficiency"] <= 1 + 1e-9 for r in body["runs"])
    # the same numbers as the bench's own functions on the same spans
    rows = {}
    for run in (sync, fast):
        stored = [m.values for m in StepMetric.objects.filter(run=run).order_by("step")]
        lo, hi = stored[0]["step/t_start"], stored[-1]["step/t_end"]
        work = window_work(Span.objects.filter(run=run).values("lane", "kind", "t0", "t1"), lo, hi)
        rows[run.pk] = {"engine_busy_s": work["engine"] / 3, "learner_work_s": work["learner"] / 3,
                        "step_mean_s": (hi - lo) / 3}
    rules = {sync.pk: "serial", fast.pk: "overlapped"}
    expected = {rid: own_bound(w, rules[rid]) for rid, w in rows.items()}
    assert ref["bound_s"] == pytest.approx(expected[sync.pk]["bound_s"])
    assert quick["efficiency"] == pytest.approx(expected[fast.pk]["efficiency"])
    assert ref["efficiency"] == pytest.approx(expected[sync.pk]["efficiency"])
    # compared alone, sync keeps its efficiency: its bound is its own work, not the others'
    other = make_run(alice_experiment, sync_preset, steps=3, name="no spans")
    store_steps(other, [(40, 43, 42.5, 42.5, 0.1, 0.0)])
    alone = alice_client.get(f"/api/compare/?runs={sync.pk},{other.pk}").json()["runs"][0]
    assert alone["efficiency"] == pytest.approx(ref["efficiency"]) == pytest.approx((1.0 + 0.5) / 3.0)
    assert quick["efficiency"] == pytest.approx(max(0.6, 0.4) / 1.0)  # fast: overlapped, its engine work
