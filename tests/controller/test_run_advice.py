"""The run page's schedule advisor and drain decisions (GET /api/runs/<id>/advice/): the simulator
behind ``thundersync simulate --spans`` replayed on the run's stored spans, its figures the
simulator's own for the same events, the model's error against the run's measured step; a run not
finished or without spans says why; streaming's drain decisions in a sentence from the learner's
own step metrics."""

import statistics

import pytest

from controller.comparisons.advisor import MAX_REPLAYED, advice, run_events, sentence
from controller.comparisons.drain import drain_notes, step_note
from controller.models import Run, StepMetric
from learner.config import SCHEDULES
from learner.sim.results import simulate_all
from learner.sim.workload import workload_from_spans

from .conftest import make_run
from .test_browser_insight import store_workload

pytestmark = pytest.mark.django_db


@pytest.fixture
def sync_run(alice_experiment, sync_preset):
    run = make_run(alice_experiment, sync_preset, steps=5, name="sync run")
    store_workload(run, seed=3, boot_s=12.0, steps=5)
    return run


def test_the_advisor_replays_the_runs_spans_under_every_schedule(alice_client, sync_run):
    body = alice_client.get(f"/api/runs/{sync_run.pk}/advice/").json()
    a = body["advisor"]
    assert body["advisor_note"] == "" and a["schedule"] == "sync" and a["first_step"] == 1
    assert [s["schedule"] for s in a["schedules"]] == list(SCHEDULES)
    # the same engine as `thundersync simulate --spans` on the same events, the first step left out
    workload = workload_from_spans(run_events(sync_run))
    expected = simulate_all(workload, SCHEDULES, steps=len(workload.batches) + 1, warmup=1)
    assert a["steps_replayed"] == len(workload.batches) == 4
    for row in a["schedules"]:
        r = expected[row["schedule"]]
        assert row["step_s"] == pytest.approx(r.step_s) and row["staleness_max"] == r.staleness_max
        assert row["learner_idle"] == pytest.approx(r.trainer_idle_ratio)
    by = {s["schedule"]: s for s in a["schedules"]}
    assert by["sync"]["staleness_max"] == 0 and by["streaming"]["staleness_max"] == 0 and by["async"]["staleness_max"] >= 0
    assert by["streaming"]["step_s"] <= by["sync"]["step_s"]
    # the model's error on the run's own schedule: simulated sync against the measured median
    measured = statistics.median(m.values["timing_s/step"] for m in StepMetric.objects.filter(run=sync_run, step__gte=1))
    assert a["measured_step_s"] == pytest.approx(measured) and a["simulated_step_s"] == by["sync"]["step_s"]
    assert a["model_error"] == pytest.approx((by["sync"]["step_s"] - measured) / measured)
    assert a["rl_ratio"] == pytest.approx(a["rollout_s"] / a["learner_s"])
    assert a["breakdown"]["rollout_s"] == a["rollout_s"]
    assert a["breakdown"]["backward_s"] + a["breakdown"]["barrier_s"] == pytest.approx(a["learner_s"])
    assert a["advice"].startswith(f"{a['regime']}: R/L {a['rl_ratio']:.1f}")
    assert body["drain"] is None  # a sync run has no drain


def test_the_advice_is_cached_per_stored_state(sync_run, django_assert_max_num_queries):
    first = advice(sync_run)
    with django_assert_max_num_queries(3):  # the key's two reads and the cache: no replay
        assert advice(sync_run) == first


def test_the_sentence_names_the_regime():
    predicted = {name: {"step_s": 1.0, "speedup_vs_sync": 1.0, "staleness_mean": 0.0, "staleness_max": 0}
                 for name in SCHEDULES}
    predicted["sync"]["step_s"] = 0.65
    rollout = sentence("rollout-bound", 2.9, 0.5, 0.09, 0.02, predicted)
    assert rollout == ("rollout-bound: R/L 2.9; streaming can save at most the learner's 0.09 s of sync's 0.65 s "
                       "step; try speculation (drafting while the engine idles in the rollout's tail)")
    predicted["streaming"]["speedup_vs_sync"] = 1.7
    assert sentence("balanced", 1.0, 0.3, 0.3, 0.05, predicted).startswith(
        "balanced: R/L 1.0; streaming should reach 1.7x sync at zero staleness")


def test_a_run_without_advice_says_why(alice_client, alice_experiment, sync_preset, bob_run):
    running = make_run(alice_experiment, sync_preset, status=Run.Status.RUNNING)
    body = alice_client.get(f"/api/runs/{running.pk}/advice/").json()
    assert body["advisor"] is None and body["advisor_note"].startswith("the run is running")
    empty = make_run(alice_experiment, sync_preset)
    body = alice_client.get(f"/api/runs/{empty.pk}/advice/").json()
    assert body["advisor"] is None and "no learner.backward spans" in body["advisor_note"]
    assert alice_client.get(f"/api/runs/{bob_run.pk}/advice/").status_code == 404


def test_only_the_last_steps_are_replayed(alice_experiment, sync_preset):
    run = make_run(alice_experiment, sync_preset, steps=MAX_REPLAYED + 3)
    store_workload(run, seed=4, boot_s=3.0, steps=MAX_REPLAYED + 3)
    a = advice(run)
    assert a["first_step"] == 3 and a["steps_replayed"] == MAX_REPLAYED


def metrics(step, **values):
    names = {"early": "learner/early_row_share", "late": "learner/late_close_share",
             "ratio": "learner/early_cost_ratio"}
    out = {"step": step, "step/t_start": 10.0, "step/last_reward_t": 10.2}
    for key, value in values.items():
        out[names.get(key, f"learner/deferred_{key}")] = value
    return out


def test_the_drain_says_where_it_deferred_learning_and_why():
    deferred = metrics(4, early=0.0, late=1.0, ratio=1.3, overrun=2.0, cost=0.0)
    note = step_note(4, deferred)
    assert note["sentence"] == ("learnt nothing early in step 4: every group closed in the last tenth of the rollout "
                                "(20 ms); the work would have run past the predicted last reward, into the tail "
                                "(2 idle moments); open rows cost 1.3x a known row here")
    assert step_note(5, metrics(5, early=0.6, late=0.3, ratio=1.1))["deferred"] is False
    assert step_note(6, {"step": 6, "timing_s/step": 1.0}) is None  # not streaming: no drain metric
    summary = drain_notes([metrics(3, early=0.8), deferred, metrics(5, early=0.4)])
    assert summary["deferred_steps"] == [4] and [n["step"] for n in summary["notes"]] == [4]
    assert summary["headline"].startswith("The drain deferred all learning to the last reward in 1 of 3 steps")
    assert drain_notes([{"step": 0, "timing_s/step": 1.0}]) is None


def test_the_api_gives_a_streaming_runs_drain(alice_client, alice_experiment, streaming_preset):
    run = make_run(alice_experiment, streaming_preset, steps=3)
    store_workload(run, seed=5, boot_s=2.0, steps=3)
    for m in StepMetric.objects.filter(run=run):
        learnt = m.step != 1
        m.values.update({"learner/early_row_share": 0.7 if learnt else 0.0, "learner/late_close_share": 0.9,
                         "learner/early_cost_ratio": 2.4, "learner/deferred_cost": 0.0 if learnt else 3.0})
        m.save()
    drain = alice_client.get(f"/api/runs/{run.pk}/advice/").json()["drain"]
    assert drain["deferred_steps"] == [1]
    assert "an early row cost more than twice a known one" in drain["notes"][0]["sentence"]
    assert drain["notes"][0]["sentence"].endswith("open rows cost 2.4x a known row here")
