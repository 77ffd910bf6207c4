import pytest
from django.test import Client

from controller.models import Schedule

from .conftest import post_json

pytestmark = pytest.mark.django_db
URL = "/api/schedules/"


def test_it_requires_login(sync_preset):
    assert Client().get(URL).status_code == 401


def test_it_lists_global_presets_and_mine_only(alice_client, alice, bob, sync_preset):
    Schedule.objects.create(owner=alice, name="alice-fa", kind="fully-async", knobs={"max_staleness": 4})
    Schedule.objects.create(owner=bob, name="bob-fa", kind="fully-async")
    listed = {s["name"]: s for s in alice_client.get(URL).json()["schedules"]}
    assert set(listed) == {"sync", "alice-fa"}
    assert listed["sync"]["global"] is True
    assert listed["alice-fa"]["knobs"] == {"max_staleness": 4}


def test_it_creates_my_preset(alice_client, alice):
    response = post_json(alice_client, URL, {"name": "fa-1", "kind": "fully-async", "knobs": {"max_staleness": 1}})
    assert response.status_code == 201
    created = Schedule.objects.get(pk=response.json()["id"])
    assert (created.owner, created.kind, created.knobs) == (alice, "fully-async", {"max_staleness": 1})


@pytest.mark.parametrize("payload, field, reason", [
    ({"name": "x", "kind": "warp"}, "kind", "not one of the available choices"),
    ({"name": "x", "kind": "async", "knobs": {"max_staleness": -2}}, "knobs", "train.max_staleness"),
    ({"name": "x", "kind": "async", "knobs": {"max_staleness": 10**12}}, "knobs", "train.max_staleness"),
    ({"name": "x", "kind": "async", "knobs": {"nope": 1}}, "knobs", "train.nope: unknown field"),
    ({"name": "x", "kind": "async", "knobs": {"train.steps.deep": 1}}, "knobs", "train.steps"),
    ({"name": "x", "kind": "async", "knobs": [1]}, "knobs", "expected a JSON object"),
    ({"name": "x", "kind": 3}, "kind", "expected a string"),
    ({"name": "x", "kind": "sync", "owner": 1}, "owner", "unknown field"),
    ({"kind": "sync"}, "name", "required"),
    ({"name": "sync", "kind": "sync"}, "name", "already exists"),
])
def test_it_rejects_bad_input_with_field_and_reason(alice_client, sync_preset, payload, field, reason):
    response = post_json(alice_client, URL, payload)
    assert response.status_code == 400, response.content
    assert reason in response.json()["errors"][field]
    assert list(Schedule.objects.values_list("name", flat=True)) == ["sync"]


def test_bob_may_reuse_a_name_alice_took(alice_client, bob_client):
    assert post_json(alice_client, URL, {"name": "mine", "kind": "sync"}).status_code == 201
    assert post_json(bob_client, URL, {"name": "mine", "kind": "sync"}).status_code == 201
