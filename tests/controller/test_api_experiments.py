import pytest
from django.test import Client

from controller.models import Experiment

from .conftest import QUICKSTART, post_json

pytestmark = pytest.mark.django_db
URL = "/api/experiments/"


def test_it_requires_login(alice_experiment):
    response = Client().get(URL)
    assert response.status_code == 401
    assert response.json() == {"errors": {"auth": "login required"}}


def test_it_lists_only_my_experiments(alice_client, alice_experiment, bob_experiment):
    names = [e["name"] for e in alice_client.get(URL).json()["experiments"]]
    assert names == ["quickstart"]


def test_it_creates_an_experiment_from_a_json_config(alice_client, alice):
    response = post_json(alice_client, URL, {"name": "tiny", "description": "d", "config": QUICKSTART})
    assert response.status_code == 201
    created = Experiment.objects.get(pk=response.json()["id"])
    assert created.owner == alice
    assert created.config == QUICKSTART


def test_it_creates_an_experiment_from_yaml_text(alice_client):
    response = post_json(alice_client, URL, {"name": "y", "config": "train:\n  steps: 2\n  schedule: sync\n"})
    assert response.status_code == 201
    assert response.json()["config"] == {"train": {"steps": 2, "schedule": "sync"}}


@pytest.mark.parametrize("payload, field, reason", [
    ({"name": "x", "colour": "red"}, "colour", "unknown field"),
    ({"name": "x", "config": {"train": {"steps": -1}}}, "config", "train.steps"),
    ({"name": "x", "config": {"train": {"group_size": 10**9}}}, "config", "train.group_size"),
    ({"name": "x", "config": {"train": {"lr": "fast"}}}, "config", "train.lr"),
    ({"name": "x", "config": {"model": {"size": 7}}}, "config", "model.size: unknown field"),
    ({"name": "x", "config": "train: [unclosed"}, "config", "not valid YAML"),
    ({"name": "x", "config": "- a list\n- of things"}, "config", "expected a mapping"),
    ({"name": "x", "config": 12}, "config", "expected a JSON object or a string"),
    ({"name": "x" * 201}, "name", "at most 200"),
    ({"name": ""}, "name", "required"),
    ({"name": ["x"]}, "name", "expected a string"),
    ({"name": "x", "config": None}, "config", "expected a JSON object or a string"),
])
def test_it_rejects_bad_input_with_field_and_reason(alice_client, payload, field, reason):
    response = post_json(alice_client, URL, payload)
    assert response.status_code == 400, response.content
    errors = response.json()["errors"]
    assert field in errors, errors
    assert reason in errors[field]
    assert Experiment.objects.count() == 0


@pytest.mark.parametrize("body, reason", [
    ("{not json", "malformed JSON"),
    ("[1, 2]", "expected a JSON object"),
    (b"\xff\xfe", "malformed JSON"),
])
def test_it_rejects_malformed_bodies(alice_client, body, reason):
    response = post_json(alice_client, URL, body)
    assert response.status_code == 400
    assert reason in response.json()["errors"]["body"]


def test_bad_input_loses_nothing_already_stored(alice_client, alice_experiment):
    post_json(alice_client, URL, {"name": "x", "config": {"train": {"steps": "many"}}})
    alice_experiment.refresh_from_db()
    assert alice_experiment.config == QUICKSTART
    assert Experiment.objects.count() == 1


def test_it_shows_my_experiment_with_its_runs(alice_client, alice_run):
    body = alice_client.get(f"{URL}{alice_run.experiment_id}/").json()
    assert body["name"] == "quickstart"
    assert [r["id"] for r in body["runs"]] == [alice_run.pk]


def test_it_rejects_other_users_experiment(bob_client, alice_experiment):
    response = bob_client.get(f"{URL}{alice_experiment.pk}/")
    assert response.status_code == 404
    assert response.json() == {"errors": {"id": "not found"}}


def test_it_answers_404_for_ids_beyond_the_integer_range(alice_client):
    assert alice_client.get(f"{URL}{10**30}/").status_code == 404


def test_it_refuses_other_methods(alice_client, alice_experiment):
    response = alice_client.delete(f"{URL}{alice_experiment.pk}/")
    assert response.status_code == 405
    assert response["Allow"] == "GET"


def test_it_enforces_csrf_for_session_posts(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = post_json(client, URL, {"name": "x"})
    assert response.status_code == 403
    assert "CSRF" in response.json()["errors"]["csrf"]


def test_it_rejects_a_body_over_the_upload_limit(alice_client, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = post_json(alice_client, URL, {"name": "x", "description": "y" * 2000})
    assert response.status_code == 413
    assert response.json() == {"errors": {"body": "request body too large"}}


@pytest.mark.parametrize("body", [
    '{"name": "x", "config": ' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"name": "x", "config": {"train": ' + '{"a": ' * 40 + "1" + "}" * 40 + "}}",
])
def test_it_rejects_deeply_nested_json(alice_client, body):
    response = post_json(alice_client, URL, body)
    assert response.status_code == 400
    assert "nested deeper than 32 levels" in response.json()["errors"]["body"]


@pytest.mark.parametrize("config", ["a: " + "[" * 19_000, "a: " + "[" * 40 + "]" * 40])
def test_it_rejects_deeply_nested_yaml(alice_client, config):
    response = post_json(alice_client, URL, {"name": "x", "config": config})
    assert response.status_code == 400
    assert "nested" in response.json()["errors"]["config"]
