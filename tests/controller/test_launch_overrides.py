"""Per-launch overrides and small sweeps: dotted config fields set for one launch, validated as
the config is (a bad one: an error naming the field and the reason, nothing stored), shown in the
run's config diff; a sweep of one field x values x schedules launched as one comparison, all or
none within the quota."""

import pytest

from controller.models import Comparison, Run, Schedule, UserQuota
from controller.overrides import OverrideError, parse_overrides, parse_sweep_values

from .conftest import post_json

pytestmark = pytest.mark.django_db


def test_override_lines_parse_to_typed_values():
    found = parse_overrides("train.lr=3e-4\n# a comment\nalgorithm.kl_coef = 0.04\nrollout.workers=2\n"
                            "rollout.engine=torch\nalgorithm.use_kl_loss=true")
    assert found == {"train.lr": 3e-4, "algorithm.kl_coef": 0.04, "rollout.workers": 2, "rollout.engine": "torch",
                     "algorithm.use_kl_loss": True}
    assert isinstance(found["rollout.workers"], int)
    assert parse_overrides("task.name=2020-01-01") == {"task.name": "2020-01-01"}  # a YAML date stays text
    assert parse_overrides({"train.lr": 1e-3}) == {"train.lr": 1e-3}
    assert parse_sweep_values("train.lr", "1e-4, 3e-4") == [1e-4, 3e-4]


@pytest.mark.parametrize("raw, reason", [
    ("train.lr", "'train.lr': expected field=value"),
    ("lr=1", "'lr': expected a dotted config field"),
    ("train.steps=5", "train.steps: not an override, use the steps field"),
    ("train.schedule=sync", "train.schedule: not an override, the schedule sets it"),
    ("train.lr=nan", "train.lr: 'nan' is not a finite number"),
    ("train.lr=1\ntrain.lr=2", "train.lr: set twice"),
    ({"train": {"lr": 1}}, "expected a dotted config field"),
    ({"algorithm.advantage": {"std": "none"}}, "algorithm.advantage: set the fields of a section one by one"),
    ("\n".join(f"train.f{i}=1" for i in range(9)), "at most 8 overrides"),
])
def test_bad_override_syntax_names_the_field(raw, reason):
    with pytest.raises(OverrideError, match=reason.replace("(", r"\(").replace(".", r"\.")):
        parse_overrides(raw)


def test_a_run_launched_with_overrides_trains_them_and_shows_them(alice_client, alice_experiment, streaming_preset):
    body = {"experiment": alice_experiment.pk, "schedule": streaming_preset.pk,
            "overrides": {"train.lr": 3e-4, "algorithm.kl_coef": 0.04}}
    response = post_json(alice_client, "/api/runs/", body)
    assert response.status_code == 201, response.content
    run = Run.objects.get(pk=response.json()["id"])
    assert run.config["train"]["lr"] == 3e-4 and run.config["algorithm"]["kl_coef"] == 0.04
    assert run.config["train"]["schedule"] == "streaming"
    assert response.json()["overrides"] == run.overrides == {"train.lr": 3e-4, "algorithm.kl_coef": 0.04}
    page = alice_client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="launch-diff"' in page and "algorithm.kl_coef" in page and "launch override" in page
    # the same as text, as the page's form sends it
    text = post_json(alice_client, "/api/runs/", {**body, "overrides": "train.lr=3e-4\nalgorithm.kl_coef=0.04"})
    again = Run.objects.get(pk=text.json()["id"])
    assert again.config == run.config and again.overrides == run.overrides


@pytest.mark.parametrize("overrides, reason", [
    ({"train.lrr": 1}, "train.lrr: unknown field"),
    ({"train.lr": -1}, "train.lr: Input should be greater than 0"),
    ("algorithm.kl_coef=high", "algorithm.kl_coef: Input should be a valid number"),
    ({"train.lr.x": 1}, "train.lr.x: cannot set a field inside a non-mapping"),
    ({"model.policy": "/etc/passwd"}, "model.policy"),
    ({"rollout.workers": 999}, "rollout.workers: Input should be less than or equal to 64"),
    ({"rollout.workers": 60}, "rollout.workers = 60 is over your quota"),
])
def test_a_bad_override_is_a_400_naming_the_field_and_nothing_is_stored(
        alice_client, alice_experiment, sync_preset, overrides, reason):
    response = post_json(alice_client, "/api/runs/", {
        "experiment": alice_experiment.pk, "schedule": sync_preset.pk, "overrides": overrides})
    assert response.status_code == 400, response.content
    assert reason in response.json()["errors"]["overrides"]
    assert Run.objects.count() == 0


def test_the_experiment_page_launches_with_overrides_or_shows_the_error(alice_client, alice_experiment, sync_preset):
    url = f"/experiments/{alice_experiment.pk}/launch/"
    bad = alice_client.post(url, {"schedule": sync_preset.pk, "overrides": "train.lr=-1"})
    assert bad.status_code == 400 and Run.objects.count() == 0
    assert "train.lr: Input should be greater than 0" in bad.content.decode()
    good = alice_client.post(url, {"schedule": sync_preset.pk, "overrides": "train.lr=3e-4"})
    run = Run.objects.get()
    assert good.status_code == 302 and run.config["train"]["lr"] == 3e-4 and run.overrides == {"train.lr": 3e-4}


@pytest.fixture
def presets(db):
    return [Schedule.objects.create(owner=None, name=k, kind=k) for k in ("sync", "streaming")]


def sweep_body(experiment, presets, **more):
    return {"experiment": experiment.pk, "schedules": [p.pk for p in presets], "steps": 3,
            "sweep": {"field": "train.lr", "values": [1e-4, 3e-4]}, **more}


def test_a_sweep_launches_one_run_per_value_and_schedule_as_one_comparison(alice_client, alice_experiment, presets):
    response = post_json(alice_client, "/api/comparisons/", sweep_body(
        alice_experiment, presets, overrides={"algorithm.kl_coef": 0.04}))
    assert response.status_code == 201, response.content
    body = response.json()
    comparison = Comparison.objects.get(pk=body["id"])
    assert body["sweep"] == {"field": "train.lr", "values": [1e-4, 3e-4]} and comparison.sweep_field == "train.lr"
    runs = list(comparison.runs.order_by("id"))
    assert [(r.schedule.kind, r.config["train"]["lr"]) for r in runs] == [
        ("sync", 1e-4), ("streaming", 1e-4), ("sync", 3e-4), ("streaming", 3e-4)]
    assert {r.steps for r in runs} == {3} and len({r.config["seed"] for r in runs}) == 1
    assert all(r.config["algorithm"]["kl_coef"] == 0.04 and r.status == Run.Status.QUEUED for r in runs)
    assert runs[2].overrides == {"algorithm.kl_coef": 0.04, "train.lr": 3e-4}
    assert [r["id"] for r in body["runs"]] == [r.pk for r in runs]
    # the compare page of the sweep lists the swept field among the config differences
    page = alice_client.get(f"/comparisons/{comparison.pk}/").content.decode()
    assert "train.lr" in page and "Swept train.lr" in page
    # the compare summary says the sweep's runs differ by the field, not that they repeat a schedule
    warnings = alice_client.get(f"/api/compare/?runs={runs[1].pk},{runs[3].pk}").json()["warnings"]
    assert any("Launched with different overrides (train.lr)" in w for w in warnings)
    assert not any("share a schedule" in w or "beyond the schedule" in w for w in warnings)


@pytest.mark.parametrize("more, field, reason", [
    ({"sweep": {"field": "train.lr", "values": [1e-4, -1]}}, "sweep_values", "train.lr: Input should be greater than 0"),
    ({"sweep": {"field": "train.lrr", "values": [1, 2]}}, "sweep_field", "train.lrr: unknown field"),
    ({"sweep": {"field": "train.lr", "values": [1e-4]}}, "sweep_values", "a sweep takes 2 to 4 values"),
    ({"sweep": {"field": "train.lr", "values": [1e-4, 2e-4, 3e-4, 4e-4]}, "repeats": 4}, "schedules",
     "32 runs: pick at most 24 in all, schedules × sweep values × repeats (8 × 4)"),
    ({"sweep": {"field": "train.lr"}}, "sweep", "values: required"),
    ({"sweep": {"field": "train.lr", "values": [1, 2]}, "overrides": {"train.lr": 1}}, "sweep_field",
     "both swept and overridden"),
    ({"sweep": {"field": "train.steps", "values": [3, 4]}}, "sweep_field", "use the steps field"),
    ({"schedules": {"sync": 1}}, "schedules", "expected a JSON array"),  # was a KeyError, a 500
    ({"schedules": [1.0, 2]}, "schedules", "a list of integer schedule ids"),
])
def test_a_bad_sweep_names_the_field_and_stores_nothing(alice_client, alice_experiment, presets, more, field, reason):
    response = post_json(alice_client, "/api/comparisons/", {**sweep_body(alice_experiment, presets), **more})
    assert response.status_code == 400, response.content
    assert reason in response.json()["errors"][field]
    assert Comparison.objects.count() == 0 and Run.objects.count() == 0


def test_a_sweep_over_the_queue_quota_queues_nothing(alice, alice_client, alice_experiment, presets):
    UserQuota.objects.create(user=alice, queued_runs=3)
    response = post_json(alice_client, "/api/comparisons/", sweep_body(alice_experiment, presets))
    assert response.status_code == 429, response.content
    assert "your quota is 3" in response.json()["errors"]["quota"]
    assert Comparison.objects.count() == 0 and Run.objects.count() == 0
    # a sweep over one schedule fits
    one = post_json(alice_client, "/api/comparisons/", sweep_body(alice_experiment, presets[1:]))
    assert one.status_code == 201 and Run.objects.count() == 2


def test_a_sweep_from_the_experiment_page(alice_client, alice_experiment, presets):
    url = f"/experiments/{alice_experiment.pk}/compare/"
    form = {"schedules": [presets[1].pk], "steps": 3, "sweep_field": "algorithm.kl_coef", "sweep_values": "0, 0.04"}
    bad = alice_client.post(url, {**form, "sweep_values": "0, x"})
    assert bad.status_code == 400 and "algorithm.kl_coef: Input should be a valid number" in bad.content.decode()
    assert Comparison.objects.count() == 0
    good = alice_client.post(url, form)
    comparison = Comparison.objects.get()
    assert good.status_code == 302 and good.url == f"/comparisons/{comparison.pk}/"
    assert sorted(r.config["algorithm"]["kl_coef"] for r in comparison.runs.all()) == [0.0, 0.04]


def test_a_sweep_whose_messages_the_broker_refuses_is_withdrawn_whole(
        alice_client, alice_experiment, presets, monkeypatch, django_capture_on_commit_callbacks):
    """The broker goes down after the first of four messages: no run and no comparison remain."""
    import kombu.exceptions
    from celery import current_app

    sent = []

    def send_task(name, args=None, **kwargs):
        if sent:
            raise kombu.exceptions.OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
        sent.append(args)

    monkeypatch.setattr(current_app, "send_task", send_task)
    # the test's transaction never commits: the on-commit callback runs as the capture ends, and
    # its error is what the outage handler turns into a 503 on a real commit (test_outages.py)
    with pytest.raises(kombu.exceptions.OperationalError):
        with django_capture_on_commit_callbacks(execute=True) as callbacks:
            response = post_json(alice_client, "/api/comparisons/", sweep_body(alice_experiment, presets))
            assert response.status_code == 201 and Run.objects.count() == 4
    assert len(callbacks) == 1  # one callback sends the comparison's four messages
    assert len(sent) == 1 and Run.objects.count() == 0 and Comparison.objects.count() == 0
