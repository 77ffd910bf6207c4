"""Creating, listing, showing and cancelling runs (the worker side is in test_run_end_to_end)."""

import pytest
from django.utils import timezone
from django.test import Client

from controller.broker import enqueue_or_withdraw
from controller.models import Run, Schedule
from controller.tasks import run_training

from .conftest import make_run, post_json

pytestmark = pytest.mark.django_db
URL = "/api/runs/"


def test_it_requires_login(alice_run):
    assert Client().get(URL).status_code == 401
    assert Client().get(f"{URL}{alice_run.pk}/").status_code == 401


def test_it_creates_a_queued_run_and_enqueues_it_after_commit(
    alice_client, alice_experiment, sync_preset, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks() as callbacks:
        response = post_json(alice_client, URL, {"experiment": alice_experiment.pk, "schedule": sync_preset.pk,
                                                 "steps": 3, "name": "three steps"})
    assert response.status_code == 201, response.content
    body = response.json()
    run = Run.objects.get(pk=body["id"])
    assert body["status"] == "queued" and body["last_seq"] == -1
    assert body["schedule"] == {"id": sync_preset.pk, "name": "sync", "kind": "sync"}
    assert run.config["train"]["schedule"] == "sync" and run.config["train"]["steps"] == 3
    assert run.config["name"] == "three steps"
    assert [(cb.func, cb.args) for cb in callbacks] == [(enqueue_or_withdraw, (run.pk, run.celery_task_id))]


def test_steps_default_to_the_experiments_config(alice_client, alice_experiment, streaming_preset):
    response = post_json(alice_client, URL, {"experiment": alice_experiment.pk, "schedule": streaming_preset.pk})
    assert response.json()["steps"] == alice_experiment.config["train"]["steps"]


@pytest.mark.parametrize("payload, field, reason", [
    ({"schedule": "SYNC", "steps": 1}, "schedule", "expected an integer"),
    ({"steps": -1}, "steps", "greater than or equal to 1"),
    ({"steps": 0}, "steps", "greater than or equal to 1"),
    ({"steps": 10**12}, "steps", "less than or equal to 1000000"),
    ({"steps": 2.5}, "steps", "expected an integer"),
    ({"steps": True}, "steps", "expected an integer"),
    ({"experiment": None}, "experiment", "expected an integer"),
    ({"gpus": 8}, "gpus", "unknown field"),
])
def test_it_rejects_bad_input_with_field_and_reason(
    alice_client, alice_experiment, sync_preset, payload, field, reason
):
    full = {"experiment": alice_experiment.pk, "schedule": sync_preset.pk, **payload}
    response = post_json(alice_client, URL, full)
    assert response.status_code == 400, response.content
    assert reason in response.json()["errors"][field]
    assert Run.objects.count() == 0


def test_other_users_experiment_is_not_found(bob_client, alice_experiment, sync_preset):
    response = post_json(bob_client, URL, {"experiment": alice_experiment.pk, "schedule": sync_preset.pk})
    assert response.status_code == 404
    assert response.json()["errors"] == {"experiment": "no such experiment"}


def test_other_users_schedule_is_not_found(bob_client, alice, bob_experiment):
    private = Schedule.objects.create(owner=alice, name="alice-only", kind="sync")
    response = post_json(bob_client, URL, {"experiment": bob_experiment.pk, "schedule": private.pk})
    assert response.status_code == 404
    assert response.json()["errors"] == {"schedule": "no such schedule"}


@pytest.mark.parametrize("payload", [{"schedule": 10**40}, {"experiment": 2**31}, {"experiment": 10**40, "schedule": 0}])
def test_unknown_ids_are_not_found(alice_client, alice_experiment, sync_preset, payload):
    full = {"experiment": alice_experiment.pk, "schedule": sync_preset.pk, **payload}
    response = post_json(alice_client, URL, full)
    assert response.status_code == 404, response.content
    assert set(response.json()["errors"]) == set(payload)
    assert Run.objects.count() == 0


@pytest.mark.parametrize("path", ["abc/", "1.5/", "-1/", "1/nope/", "1/trace", "x/metrics.csv", "nope/"])
def test_every_unrouted_api_path_answers_json_404(alice_client, path):
    response = alice_client.get(f"{URL}{path}")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"errors": {"path": "no such API path"}}


def test_it_rejects_a_schedule_that_does_not_fit_the_config(alice_client, alice, alice_experiment):
    alice_experiment.config = {**alice_experiment.config, "algorithm": {"ppo_epochs": 2}}
    alice_experiment.save()
    strict = Schedule.objects.create(owner=alice, name="strict", kind="streaming")
    response = post_json(alice_client, URL, {"experiment": alice_experiment.pk, "schedule": strict.pk})
    assert response.status_code == 400
    assert "algorithm.ppo_epochs" in response.json()["errors"]["schedule"]


def test_it_lists_only_my_runs(alice_client, alice_run, bob_run):
    assert [r["id"] for r in alice_client.get(URL).json()["runs"]] == [alice_run.pk]
    assert alice_client.get(URL, {"experiment": "x"}).status_code == 400


def test_it_shows_my_run(alice_client, alice_run):
    body = alice_client.get(f"{URL}{alice_run.pk}/").json()
    assert body["id"] == alice_run.pk and body["status"] == "succeeded"
    assert set(body) >= {"id", "name", "status", "schedule", "experiment", "created", "started", "finished",
                         "error", "summary", "last_seq"}


def test_it_rejects_other_users_run(bob_client, alice_run):
    for path in ("", "metrics/", "spans/", "trace.json", "metrics.csv"):
        assert bob_client.get(f"{URL}{alice_run.pk}/{path}").status_code == 404, path
    assert bob_client.post(f"{URL}{alice_run.pk}/cancel/").status_code == 404


def test_cancelling_a_queued_run_ends_it_at_once(alice_client, alice_experiment, sync_preset):
    run = make_run(alice_experiment, sync_preset, status=Run.Status.QUEUED)
    response = alice_client.post(f"{URL}{run.pk}/cancel/")
    assert response.status_code == 202
    assert response.json()["status"] == "cancelled"
    # ...and its task, delivered later, starts nothing.
    assert run_training.apply(args=[run.pk]).get() == "skipped"


def test_cancelling_a_running_run_sets_the_flag(alice_client, alice_experiment, sync_preset):
    # supervised elsewhere and alive (a fresh heartbeat): its supervisor stops the learner
    run = make_run(alice_experiment, sync_preset, status=Run.Status.RUNNING, supervisor="other-node:7:1",
                   heartbeat=timezone.now())
    body = alice_client.post(f"{URL}{run.pk}/cancel/").json()
    assert body["status"] == "running" and body["cancel_requested"] is True


def test_cancelling_a_finished_run_is_a_conflict(alice_client, alice_run):
    response = alice_client.post(f"{URL}{alice_run.pk}/cancel/")
    assert response.status_code == 409
    assert response.json()["errors"]["status"] == "the run has already succeeded"
    alice_run.refresh_from_db()
    assert alice_run.status == "succeeded" and not alice_run.cancel_requested


def test_a_second_delivery_never_starts_a_run_twice(alice_experiment, sync_preset):
    run = make_run(alice_experiment, sync_preset, status=Run.Status.RUNNING)
    assert run_training.apply(args=[run.pk]).get() == "skipped"
    run.refresh_from_db()
    assert run.status == "running" and run.started is None
