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
    assert body["bound_s"] == pytest.approx(max(rollout_s, learner_s))
    fast, ref = body["runs"]
    assert [fast["id"], ref["id"]] == [streaming.pk, sync.pk]
    assert ref["step_s"] == 4 and ref["speedup_vs_sync"] == 1.0
    assert fast["step_s"] == 2 and fast["speedup_vs_sync"] == 2.0
    assert fast["efficiency"] == pytest.approx(max(rollout_s, learner_s) / 2)
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
    assert body["reference"] is None and body["bound_s"] is None
    fast, empty = body["runs"]
    assert (fast["time_to_reward_s"], fast["reward_step"]) == (4.5, 1)
    assert fast["speedup_vs_sync"] is None and fast["efficiency"] is None
    assert empty["steps_done"] == 0 and empty["step_s"] is None and empty["learner_idle"] is None
    never = alice_client.get(f"/api/compare/?runs={streaming.pk},{other.pk}&reward=5").json()
    assert never["runs"][0]["time_to_reward_s"] is None


@pytest.mark.parametrize("query, field", [
    ("", "runs"), ("runs=1", "runs"), ("runs=1,1", "runs"), ("runs=a,b", "runs"), ("runs=1,2,3,4,5", "runs"),
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
