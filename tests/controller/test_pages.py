"""Page views: login, ownership, forms (context per docs/web-contract.md)."""

from pathlib import Path

import plotly
import pytest
from asgiref.testing import ApplicationCommunicator
from django.test import Client

from controller.asgi import application

from controller.models import Experiment, Run

from .conftest import make_run

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["/", "/experiments/1/", "/runs/1/", "/compare/"])
def test_every_page_requires_login(path):
    response = Client().get(path)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_the_login_page_renders():
    assert Client().get("/accounts/login/").status_code == 200


def test_the_experiments_page_lists_mine_and_starts_from_quickstart(alice_client, alice_experiment, bob_experiment):
    response = alice_client.get("/")
    assert list(response.context["experiments"]) == [alice_experiment]
    assert "builtin:tiny" in response.context["form"]["config"].value()


def test_it_creates_an_experiment_from_the_form(alice_client, alice):
    response = alice_client.post("/", {"name": "form-made", "description": "", "config": "train:\n  steps: 3\n"})
    created = Experiment.objects.get(name="form-made")
    assert response.status_code == 302 and response["Location"] == f"/experiments/{created.pk}/"
    assert created.owner == alice and created.config == {"train": {"steps": 3}}


@pytest.mark.parametrize("config, reason", [
    ("train: {steps: -2}", "train.steps"),
    ("train: [", "not valid YAML (line "),
    ("seed: 1\nsead: 2", "sead: unknown field"),
])
def test_the_form_names_the_bad_config_field(alice_client, config, reason):
    response = alice_client.post("/", {"name": "bad", "config": config})
    assert response.status_code == 400
    assert reason in response.context["form"].errors["config"][0]
    assert not Experiment.objects.exists()


def test_the_experiment_page_has_runs_schedules_and_a_launch_form(
    alice_client, alice_run, sync_preset, streaming_preset
):
    response = alice_client.get(f"/experiments/{alice_run.experiment_id}/")
    context = response.context
    assert list(context["runs"]) == [alice_run]
    assert {s.name for s in context["schedules"]} == {"sync", "streaming"}
    assert set(context["launch_form"].fields) == {"schedule", "steps", "name", "overrides"}


def test_it_launches_a_run_from_the_form(alice_client, alice_experiment, sync_preset):
    response = alice_client.post(f"/experiments/{alice_experiment.pk}/launch/",
                                 {"schedule": sync_preset.pk, "steps": 2, "name": "from the page"})
    run = Run.objects.get(name="from the page")
    assert response["Location"] == f"/runs/{run.pk}/"
    assert (run.status, run.steps, run.config["train"]["schedule"]) == ("queued", 2, "sync")


@pytest.mark.parametrize("data, field", [
    ({"schedule": "", "steps": 2}, "schedule"),
    ({"schedule": "999999", "steps": 2}, "schedule"),
    ({"steps": "-4"}, "steps"),
    ({"steps": "1e9"}, "steps"),
    ({"steps": "99999999999999999999"}, "steps"),
])
def test_the_launch_form_rejects_bad_input(alice_client, alice_experiment, sync_preset, data, field):
    payload = {"schedule": sync_preset.pk, **data}
    response = alice_client.post(f"/experiments/{alice_experiment.pk}/launch/", payload)
    assert response.status_code == 400
    assert field in response.context["launch_form"].errors
    assert not Run.objects.exists()


def test_the_run_page_points_at_its_socket_and_api(alice_client, alice_run):
    context = alice_client.get(f"/runs/{alice_run.pk}/").context
    assert context["ws_path"] == f"/ws/runs/{alice_run.pk}/"
    assert context["api_base"] == f"/api/runs/{alice_run.pk}/"
    # the run's full config as YAML, as the experiment page shows its own
    import yaml
    assert "schedule: streaming" in context["config_yaml"]
    assert yaml.safe_load(context["config_yaml"]) == alice_run.config


def test_it_rejects_other_users_pages(bob_client, alice_run, sync_preset):
    assert bob_client.get(f"/experiments/{alice_run.experiment_id}/").status_code == 404
    assert bob_client.get(f"/runs/{alice_run.pk}/").status_code == 404
    assert bob_client.post(f"/experiments/{alice_run.experiment_id}/launch/",
                           {"schedule": sync_preset.pk}).status_code == 404
    assert bob_client.post(f"/runs/{alice_run.pk}/cancel/").status_code == 404
    assert bob_client.get("/compare/", {"runs": f"{alice_run.pk},{alice_run.pk + 1}"}).status_code == 404


def test_cancel_from_the_page_redirects_back(alice_client, alice_experiment, sync_preset):
    run = make_run(alice_experiment, sync_preset, status=Run.Status.RUNNING)
    response = alice_client.post(f"/runs/{run.pk}/cancel/")
    assert response["Location"] == f"/runs/{run.pk}/"
    run.refresh_from_db()
    assert run.cancel_requested


def test_launch_and_cancel_take_only_post(alice_client, alice_run):
    assert alice_client.get(f"/experiments/{alice_run.experiment_id}/launch/").status_code == 405
    assert alice_client.get(f"/runs/{alice_run.pk}/cancel/").status_code == 405


def test_compare_diffs_the_configs(alice_client, alice_experiment, sync_preset, streaming_preset):
    one = make_run(alice_experiment, sync_preset, steps=2)
    two = make_run(alice_experiment, streaming_preset, steps=3)
    context = alice_client.get("/compare/", {"runs": f"{one.pk},{two.pk}"}).context
    assert context["runs"] == [one, two]
    assert context["config_diff"] == [
        {"path": "train.schedule", "values": ["sync", "streaming"]},
        {"path": "train.steps", "values": [2, 3]},
    ]
    assert set(context["all_runs"]) == {one, two}


@pytest.mark.parametrize("runs, reason", [("1,x", "comma-separated"), ("1", "between 2 and 12"),
                                          (",".join(map(str, range(1, 14))), "between 2 and 12"), ("1,1", "twice")])
def test_compare_explains_a_bad_selection(alice_client, runs, reason):
    response = alice_client.get("/compare/", {"runs": runs})
    assert response.status_code == 400 and reason in response.context["error"]


def test_compare_without_runs_shows_the_picker(alice_client, alice_run):
    response = alice_client.get("/compare/")
    assert response.status_code == 200 and response.context["runs"] == []


async def served_over_asgi(path: str) -> tuple[int, bytes]:
    scope = {"type": "http", "method": "GET", "path": path, "query_string": b"", "headers": []}
    app = ApplicationCommunicator(application, scope)
    await app.send_input({"type": "http.request", "body": b""})
    start = await app.receive_output(timeout=30)
    body, more = b"", True
    while more:  # a streamed file response
        message = await app.receive_output(timeout=30)
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return start["status"], body


async def test_plotly_js_is_served_over_asgi_from_the_plotly_package():
    status, body = await served_over_asgi("/static/plotly.min.js")
    assert status == 200
    assert body == (Path(plotly.__file__).parent / "package_data" / "plotly.min.js").read_bytes()


async def test_the_basic_plotly_bundle_is_served_over_asgi():
    status, body = await served_over_asgi("/static/vendor/plotly-basic.min.js")
    assert status == 200 and body.startswith(b"/**\n* plotly.js (basic - minified) v")


def test_the_run_page_loads_the_basic_plotly_bundle(alice_client, alice_run):
    """All the run page draws is scatter and bar traces: the partial bundle costs a quarter of
    the full one's evaluation (docs/bench-web.md, "A viewer beside a run")."""
    page = alice_client.get(f"/runs/{alice_run.pk}/").content.decode()
    assert "/static/vendor/plotly-basic.min.js" in page and "plotly.min.js\"" not in page
