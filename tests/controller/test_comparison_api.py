"""Reading comparisons back through the API: the list (newest first, one experiment's on
request) and one comparison with its runs and the compare summary of what they stored; another
user's comparison is a 404, a bad query a 400 naming the parameter."""

import pytest

from controller.models import Comparison, join_tags

from .conftest import make_run, store_metrics

pytestmark = pytest.mark.django_db


@pytest.fixture
def comparison(alice_experiment, sync_preset, streaming_preset):
    found = Comparison.objects.create(experiment=alice_experiment, steps=2, name="sync vs streaming",
                                      note="first look", tags=join_tags(["kl", "quick"]))
    for preset in (sync_preset, streaming_preset):
        store_metrics(make_run(alice_experiment, preset, comparison=found, steps=2))
    return found


def test_the_list_holds_your_comparisons_newest_first(alice_client, alice_experiment, comparison):
    later = Comparison.objects.create(experiment=alice_experiment, steps=3)
    body = alice_client.get("/api/comparisons/").json()
    assert [c["id"] for c in body["comparisons"]] == [later.pk, comparison.pk]
    first = body["comparisons"][1]
    assert first["name"] == "sync vs streaming" and first["note"] == "first look" and first["tags"] == ["kl", "quick"]
    assert [r["schedule"]["kind"] for r in first["runs"]] == ["sync", "streaming"]
    mine = alice_client.get(f"/api/comparisons/?experiment={alice_experiment.pk}").json()["comparisons"]
    assert len(mine) == 2
    assert alice_client.get(f"/api/comparisons/?experiment={alice_experiment.pk + 1000}").json()["comparisons"] == []


def test_one_comparison_carries_the_summary_of_its_runs(alice_client, comparison):
    body = alice_client.get(f"/api/comparisons/{comparison.pk}/").json()
    assert body["id"] == comparison.pk and body["url"] == f"/comparisons/{comparison.pk}/"
    summary = body["summary"]
    by_schedule = {r["schedule"]: r for r in summary["runs"]}
    assert set(by_schedule) == {"sync", "streaming"}
    assert summary["reference"] == by_schedule["sync"]["id"]
    assert by_schedule["sync"]["speedup_vs_sync"] == pytest.approx(1.0)
    # the same figures the compare summary gives for the same runs
    ids = ",".join(str(r["id"]) for r in body["runs"])
    assert alice_client.get(f"/api/compare/?runs={ids}").json()["runs"] == summary["runs"]


def test_a_comparison_whose_runs_were_all_deleted_has_no_summary(alice_client, comparison):
    comparison.runs.all().delete()
    body = alice_client.get(f"/api/comparisons/{comparison.pk}/").json()
    assert body["runs"] == [] and body["summary"] is None


def test_another_users_comparison_is_not_found_and_a_bad_query_names_its_parameter(
        alice_client, bob_client, comparison):
    assert bob_client.get(f"/api/comparisons/{comparison.pk}/").status_code == 404
    assert bob_client.get("/api/comparisons/").json()["comparisons"] == []
    response = alice_client.get(f"/api/comparisons/{comparison.pk}/?smoothing=1.5")
    assert response.status_code == 400 and "smoothing" in response.json()["errors"]
    response = alice_client.get("/api/comparisons/?experiment=zero")
    assert response.status_code == 400 and "experiment" in response.json()["errors"]
