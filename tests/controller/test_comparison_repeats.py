"""A comparison's repeats: POST /api/comparisons/ takes ``repeats`` (default 2, a sweep 1, bounded,
a bad value named), launches the runs in alternating rounds, and dispatch starts them one at a
time while other runs still start beside them."""

import pytest

from controller.supervision.dispatch import claim_next_run
from controller.models import Comparison, Run, Schedule

from .conftest import make_run, post_json

pytestmark = pytest.mark.django_db


@pytest.fixture
def presets(db):
    return [Schedule.objects.create(owner=None, name=k, kind=k) for k in ("sync", "async", "streaming")]


def body(experiment, presets, **more):
    return {"experiment": experiment.pk, "schedules": [p.pk for p in presets], "steps": 3, **more}


def test_repeats_default_to_two_in_alternating_rounds(alice_client, alice_experiment, presets):
    response = post_json(alice_client, "/api/comparisons/", body(alice_experiment, presets))
    assert response.status_code == 201, response.content
    assert response.json()["repeats"] == 2
    runs = list(Comparison.objects.get().runs.order_by("created", "id"))
    assert [r.schedule.kind for r in runs] == ["sync", "async", "streaming", "streaming", "async", "sync"]
    Run.objects.update(status=Run.Status.CANCELLED)  # out of the queue quota's count
    three = post_json(alice_client, "/api/comparisons/", body(alice_experiment, presets[:2], repeats=3))
    runs = Comparison.objects.get(pk=three.json()["id"]).runs.order_by("created", "id")
    assert [r.schedule.kind for r in runs] == ["sync", "async", "async", "sync", "sync", "async"]
    Run.objects.update(status=Run.Status.CANCELLED)
    sweep = post_json(alice_client, "/api/comparisons/", body(alice_experiment, presets[:2],
                                                             sweep={"field": "train.lr", "values": [1e-4, 3e-4]}))
    assert sweep.json()["repeats"] == 1 and len(sweep.json()["runs"]) == 4


@pytest.mark.parametrize("repeats, reason", [
    (0, "between 1 and 4 runs per schedule"), (5, "between 1 and 4 runs per schedule"),
    ("2", "expected an integer"), (2.5, "expected an integer"), (True, "expected an integer"),
])
def test_a_bad_repeats_is_named_and_nothing_is_stored(alice_client, alice_experiment, presets, repeats, reason):
    response = post_json(alice_client, "/api/comparisons/", body(alice_experiment, presets, repeats=repeats))
    assert response.status_code == 400, response.content
    assert reason in str(response.json()["errors"]["repeats"])
    assert Comparison.objects.count() == 0 and Run.objects.count() == 0


def test_a_bad_repeats_from_the_experiment_page_is_said_on_its_field(alice_client, alice_experiment, presets):
    form = {"schedules": [p.pk for p in presets[:2]], "steps": 3, "repeats": "many"}
    page = alice_client.post(f"/experiments/{alice_experiment.pk}/compare/", form)
    assert page.status_code == 400 and "a whole number of runs per schedule, 1-4" in page.content.decode()
    assert Comparison.objects.count() == 0


def test_a_comparisons_runs_start_one_at_a_time_in_launch_order(alice_client, alice_experiment, presets):
    post_json(alice_client, "/api/comparisons/", body(alice_experiment, presets[:2]))
    order = list(Comparison.objects.get().runs.order_by("created", "id").values_list("id", flat=True))
    alone = make_run(alice_experiment, presets[0], status=Run.Status.QUEUED, name="not in a comparison")
    first = claim_next_run()
    assert first == order[0]
    # the user's quota allows 2 at once: the second slot goes to the run outside the comparison
    assert claim_next_run() == alone.pk
    Run.objects.filter(pk=alone.pk).update(status=Run.Status.SUCCEEDED)
    assert claim_next_run() is None  # the comparison's next run waits for its first to end
    started = [first]
    for _ in order[1:]:
        Run.objects.filter(pk=started[-1]).update(status=Run.Status.SUCCEEDED)
        started.append(claim_next_run())
        assert claim_next_run() is None
    assert started == order


def test_repeats_train_one_seed_per_round_shared_by_the_rounds_runs(alice_client, alice_experiment, presets):
    response = post_json(alice_client, "/api/comparisons/", body(alice_experiment, presets[:2], repeats=3,
                                                                overrides={"seed": 7}))
    assert response.status_code == 201, response.content
    comparison = Comparison.objects.get()
    runs = list(comparison.runs.order_by("created", "id"))
    assert [(r.schedule.kind, r.config["seed"]) for r in runs] == [
        ("sync", 7), ("async", 7), ("async", 8), ("sync", 8), ("sync", 9), ("async", 9)]
    assert comparison.round_seeds() == [7, 8, 9]
    # the rounds' seeds do not split a schedule's repeats: one pooled group per schedule
    from controller.comparisons.pooled import group_key, label
    assert len({group_key(r) for r in runs}) == 2 and {label(r) for r in runs} == {"sync", "async"}
    from controller.comparisons.fairness import shared_schedule
    assert not shared_schedule(runs)
    page = alice_client.get(f"/comparisons/{comparison.pk}/").content.decode()
    assert "seeds 7, 8, 9, one per round" in page


def test_the_seed_is_an_override_and_a_sweep_axis(alice_client, alice_experiment, presets):
    one = post_json(alice_client, "/api/runs/", {"experiment": alice_experiment.pk, "schedule": presets[0].pk,
                                                 "steps": 2, "overrides": "seed=3"})
    assert one.status_code == 201, one.content
    assert Run.objects.get(pk=one.json()["id"]).config["seed"] == 3
    Run.objects.update(status=Run.Status.CANCELLED)
    sweep = post_json(alice_client, "/api/comparisons/", body(alice_experiment, presets[:1], repeats=1,
                                                             sweep={"field": "seed", "values": [1, 2, 3]}))
    assert sweep.status_code == 201, sweep.content
    runs = Comparison.objects.get(pk=sweep.json()["id"]).runs.order_by("created", "id")
    assert [r.config["seed"] for r in runs] == [1, 2, 3]
    bad = post_json(alice_client, "/api/runs/", {"experiment": alice_experiment.pk, "schedule": presets[0].pk,
                                                 "steps": 2, "overrides": "seed=-1"})
    assert bad.status_code == 400 and "seed" in str(bad.json()), bad.content
    nested = post_json(alice_client, "/api/runs/", {"experiment": alice_experiment.pk, "schedule": presets[0].pk,
                                                    "steps": 2, "overrides": "lr=0.1"})
    assert nested.status_code == 400 and "expected a dotted config field" in str(nested.json())


def test_a_comparison_of_any_size_summarises_every_run_pooled_per_schedule(alice_client, alice_experiment, presets):
    """4 schedules x 3 repeats = 12 runs: the comparison's own summary holds all of them, pooled per
    schedule (an ad-hoc overlay of hand-picked runs stays bounded, at 12)."""
    from controller.comparisons.compare import MAX_COMPARED

    from .test_api_compare import store_steps

    schedules = [*presets, Schedule.objects.create(owner=None, name="fully-async", kind="fully-async")]
    comparison = Comparison.objects.create(experiment=alice_experiment, steps=3, repeats=3)
    runs = []
    for k in range(3):
        for i, preset in enumerate(schedules):
            run = make_run(alice_experiment, preset, steps=3, comparison=comparison, name=f"{preset.name} {k}")
            step = 1.0 + 0.25 * i  # sync 1 s a step, the others slower or faster by schedule
            store_steps(run, [(10 + s * step, 10 + (s + 1) * step, 10 + s * step + 0.5, 10 + s * step + 0.6,
                               0.1 * (s + 1), 0.0) for s in range(3)])
            runs.append(run)
    body = alice_client.get(f"/api/comparisons/{comparison.pk}/").json()
    summary = body["summary"]
    assert len(body["runs"]) == 12 and len(summary["runs"]) == 12
    pooled = {g["schedule"]: g for g in summary["pooled"]}
    assert set(pooled) == {"sync", "async", "streaming", "fully-async"}
    assert all(len(g["runs"]) == 3 and g["steps"] == 9 for g in pooled.values())
    assert pooled["sync"]["speedup_vs_sync"] == 1.0 and pooled["async"]["step_s"] == 1.25
    ids = ",".join(str(r.pk) for r in runs)
    assert MAX_COMPARED == 12 and alice_client.get(f"/api/compare/?runs={ids}").status_code == 200
    extra = make_run(alice_experiment, presets[0], steps=3)
    too_many = alice_client.get(f"/api/compare/?runs={ids},{extra.pk}")
    assert too_many.status_code == 400 and "between 2 and 12" in too_many.json()["errors"]["runs"]
