"""Every list of the API a page at a time (controller/jsonapi/pagination.py), per-user caps on stored
experiments and runs (controller/limits/quotas.py check_stored), and the pages' bounded lists."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from controller.models import Comparison, Experiment, Run, Schedule, StepMetric
from controller.jsonapi.pagination import DEFAULT_PAGE, MAX_PAGE
from controller.urls import api_urlpatterns

from .conftest import QUICKSTART, make_run, post_json, store_spans

pytestmark = pytest.mark.django_db


def pages(client, url: str) -> list[dict]:
    """Every page of a list, following ``next`` until it is null (at most 50 pages)."""
    found = []
    while url and len(found) < 50:
        response = client.get(url)
        assert response.status_code == 200, response.content
        found.append(response.json())
        url = found[-1]["next"]
    assert url is None
    return found


def test_runs_are_paged_newest_first_with_count_and_links(alice_client, alice_experiment, sync_preset):
    made = [make_run(alice_experiment, sync_preset).pk for _ in range(7)]
    got = pages(alice_client, "/api/runs/?limit=3")
    assert [len(p["runs"]) for p in got] == [3, 3, 1]
    assert all(p["count"] == 7 and p["limit"] == 3 for p in got)
    assert [p["offset"] for p in got] == [0, 3, 6]
    assert [r["id"] for p in got for r in p["runs"]] == sorted(made, reverse=True)
    assert got[0]["previous"] is None and got[1]["previous"] == "/api/runs/?limit=3&offset=0"
    # the filter rides along in the links
    other = Experiment.objects.create(owner=alice_experiment.owner, name="other", config=QUICKSTART)
    make_run(other, sync_preset)
    first = alice_client.get(f"/api/runs/?experiment={other.pk}&limit=1").json()
    assert first["count"] == 1 and first["next"] is None
    first = alice_client.get(f"/api/runs/?experiment={alice_experiment.pk}&limit=5").json()
    assert first["count"] == 7 and f"experiment={alice_experiment.pk}" in first["next"]


def test_the_default_and_the_maximum_page(alice_client, alice_experiment, sync_preset):
    Run.objects.bulk_create([Run(experiment=alice_experiment, schedule=sync_preset, steps=2, config={})
                             for _ in range(DEFAULT_PAGE + 5)])
    body = alice_client.get("/api/runs/").json()
    assert (len(body["runs"]), body["count"], body["limit"]) == (DEFAULT_PAGE, DEFAULT_PAGE + 5, DEFAULT_PAGE)
    assert body["next"] == f"/api/runs/?limit={DEFAULT_PAGE}&offset={DEFAULT_PAGE}"
    assert len(alice_client.get(f"/api/runs/?limit={MAX_PAGE}").json()["runs"]) == DEFAULT_PAGE + 5
    past = alice_client.get("/api/runs/?offset=100000").json()
    assert past["runs"] == [] and past["next"] is None and past["count"] == DEFAULT_PAGE + 5


@pytest.mark.parametrize("query, field", [("limit=0", "limit"), (f"limit={MAX_PAGE + 1}", "limit"),
                                          ("offset=-1", "offset"), ("limit=ten", "limit"), ("limit=", "limit")])
def test_a_page_out_of_range_is_a_400_naming_the_parameter(alice_client, query, field):
    for url in ("/api/runs/", "/api/experiments/", "/api/schedules/", "/api/comparisons/"):
        response = alice_client.get(f"{url}?{query}")
        assert response.status_code == 400, url
        assert list(response.json()["errors"]) == [field]


def test_a_page_of_runs_costs_the_same_queries_for_1_or_40_runs(alice_client, alice_experiment, sync_preset):
    """last_seq and checkpoints are read for the whole page, not per run."""
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert alice_client.get("/api/runs/").status_code == 200
        return len(captured)

    store_spans(make_run(alice_experiment, sync_preset), 5)
    one = queries()
    for _ in range(39):
        make_run(alice_experiment, sync_preset)
    assert queries() == one
    body = alice_client.get("/api/runs/?limit=500").json()
    assert sorted(r["last_seq"] for r in body["runs"])[-2:] == [-1, 4]


def test_every_list_endpoint_is_paged_and_documented(alice_client, alice_experiment, sync_preset):
    run = make_run(alice_experiment, sync_preset)
    StepMetric.objects.bulk_create([StepMetric(run=run, step=s, values={"loss": 1.0}) for s in range(5)])
    Comparison.objects.create(experiment=alice_experiment, name="c", steps=3)
    schema = alice_client.get("/api/openapi.json").json()
    paged = {path for path, ops in schema["paths"].items()
             if "count" in ops.get("get", {}).get("responses", {}).get("200", {}).get("content", {}).get(
                 "application/json", {}).get("schema", {}).get("properties", {})}
    assert paged == {"/api/experiments/", "/api/schedules/", "/api/runs/", "/api/comparisons/",
                     "/api/runs/{run_id}/metrics/"}
    for path in paged:
        names = {p["name"] for p in schema["paths"][path]["get"]["parameters"]}
        assert {"limit", "offset"} <= names, path
        url = path.replace("{run_id}", str(run.pk))
        body = alice_client.get(f"{url}?limit=1").json()
        key = next(k for k in body if isinstance(body[k], list))
        assert len(body[key]) == 1 and body["count"] >= 1 and body["limit"] == 1, path
    metrics = pages(alice_client, f"/api/runs/{run.pk}/metrics/?limit=2")
    assert [m["step"] for p in metrics for m in p["metrics"]] == [0, 1, 2, 3, 4]
    # every GET route without an id is a list: none is left unpaged
    lists = {"/" + str(p.pattern) for p in api_urlpatterns if "<" not in str(p.pattern)}
    assert lists - paged == {"/api/openapi.json", "/api/compare/"}


def test_an_experiment_shows_its_newest_runs_and_links_to_all(alice_client, alice_experiment, sync_preset):
    Run.objects.bulk_create([Run(experiment=alice_experiment, schedule=sync_preset, steps=2, config={})
                             for _ in range(DEFAULT_PAGE + 2)])
    body = alice_client.get(f"/api/experiments/{alice_experiment.pk}/").json()
    assert len(body["runs"]) == DEFAULT_PAGE and body["runs_count"] == DEFAULT_PAGE + 2
    assert alice_client.get(body["runs_url"] + "&offset=100").json()["count"] == DEFAULT_PAGE + 2


def test_spans_pages_carry_a_next_link_while_full(alice_client, alice_experiment, sync_preset):
    run = make_run(alice_experiment, sync_preset)
    store_spans(run, 5)
    got = pages(alice_client, f"/api/runs/{run.pk}/spans/?limit=2")
    assert [[s["seq"] for s in p["spans"]] for p in got] == [[0, 1], [2, 3], [4]]


# Per-user caps on what is stored


def test_experiments_past_the_per_user_limit_are_refused_naming_it(alice_client, bob_client, settings):
    settings.THUNDERSYNC_MAX_EXPERIMENTS_PER_USER = 2
    made = [post_json(alice_client, "/api/experiments/", {"name": f"e{i}", "config": QUICKSTART}) for i in range(2)]
    assert [r.status_code for r in made] == [201, 201]
    refused = post_json(alice_client, "/api/experiments/", {"name": "e3", "config": QUICKSTART})
    assert refused.status_code == 409
    assert refused.json()["errors"] == {"quota": (
        "you have 2 experiments stored, the limit is 2 per user (THUNDERSYNC_MAX_EXPERIMENTS_PER_USER): "
        "delete some to make room")}
    page = alice_client.post("/", {"name": "e3", "config": "train: {steps: 1}"})
    assert page.status_code == 409 and "THUNDERSYNC_MAX_EXPERIMENTS_PER_USER" in page.content.decode()
    clone = alice_client.post(f"/experiments/{made[0].json()['id']}/clone/", follow=True)
    assert "THUNDERSYNC_MAX_EXPERIMENTS_PER_USER" in clone.content.decode()
    assert Experiment.objects.count() == 2
    assert post_json(bob_client, "/api/experiments/", {"name": "b", "config": QUICKSTART}).status_code == 201


def test_runs_past_the_per_user_limit_are_refused_naming_it(alice, alice_client, alice_experiment, sync_preset,
                                                            settings):
    settings.THUNDERSYNC_MAX_RUNS_PER_USER = 3
    for _ in range(3):
        make_run(alice_experiment, sync_preset)
    launch = {"experiment": alice_experiment.pk, "schedule": sync_preset.pk}
    refused = post_json(alice_client, "/api/runs/", launch)
    assert refused.status_code == 409
    assert refused.json()["errors"]["quota"].startswith(
        "you have 3 runs stored, the limit is 3 per user (THUNDERSYNC_MAX_RUNS_PER_USER)")
    streaming = Schedule.objects.create(owner=None, name="streaming", kind="streaming")
    comparison = post_json(alice_client, "/api/comparisons/", {
        "experiment": alice_experiment.pk, "schedules": [sync_preset.pk, streaming.pk], "steps": 3})
    assert comparison.status_code == 409 and "THUNDERSYNC_MAX_RUNS_PER_USER" in comparison.json()["errors"]["quota"]
    page = alice_client.post(f"/experiments/{alice_experiment.pk}/launch/", {"schedule": sync_preset.pk})
    assert page.status_code == 400 and "THUNDERSYNC_MAX_RUNS_PER_USER" in page.content.decode()
    assert Run.objects.count() == 3 and not Comparison.objects.exists()
    Run.objects.filter(pk=Run.objects.first().pk).delete()
    assert post_json(alice_client, "/api/runs/", launch).status_code == 201


# The pages' lists


def test_the_experiments_page_is_paged(alice, alice_client):
    Experiment.objects.bulk_create([Experiment(owner=alice, name=f"e{i:03}", config=QUICKSTART) for i in range(55)])
    first = alice_client.get("/")
    assert len(first.context["experiments"]) == 50 and 'id="page-next"' in first.content.decode()
    second = alice_client.get("/?page=2")
    assert len(second.context["experiments"]) == 5


def test_the_experiment_page_shows_its_newest_runs_and_links_to_all(alice_client, alice_experiment, sync_preset):
    from controller.views import EXPERIMENT_RUNS_SHOWN

    Run.objects.bulk_create([Run(experiment=alice_experiment, schedule=sync_preset, steps=2, config={})
                             for _ in range(EXPERIMENT_RUNS_SHOWN + 3)])
    page = alice_client.get(f"/experiments/{alice_experiment.pk}/")
    assert len(page.context["runs"]) == EXPERIMENT_RUNS_SHOWN
    assert f'href="/runs/?experiment={alice_experiment.pk}"' in page.content.decode()


def test_the_compare_pickers_runs_are_bounded_and_keep_the_compared_ones(alice_client, alice_experiment, sync_preset):
    from controller.views import PICKER_RUNS

    old = [make_run(alice_experiment, sync_preset) for _ in range(2)]
    Run.objects.bulk_create([Run(experiment=alice_experiment, schedule=sync_preset, steps=2, config={})
                             for _ in range(PICKER_RUNS)])
    page = alice_client.get("/compare/")
    assert len(page.context["all_runs"]) == PICKER_RUNS and 'id="picker-more"' in page.content.decode()
    page = alice_client.get(f"/compare/?runs={old[0].pk},{old[1].pk}")
    assert page.status_code == 200 and len(page.context["all_runs"]) == PICKER_RUNS + 2
    assert {r.pk for r in page.context["all_runs"]} >= {r.pk for r in old}
