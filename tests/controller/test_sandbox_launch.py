"""A run whose task calls the python-sandbox tool is refused where no worker can confine it:
at launch when the workers reported so (controller/sandbox_hosts.py), else at the run's start
(learner/preflight.py) with one line; never run unconfined (docs/tasks.md)."""

import pytest
from django.core.cache import cache

from controller import sandbox_hosts
from controller.models import Experiment, Run
from learner.tasks import sandbox_bwrap

from .conftest import QUICKSTART, post_json, wait_for_status

URL = "/api/runs/"
SANDBOX = {**QUICKSTART, "task": {**QUICKSTART["task"], "name": "python-sandbox"}}


@pytest.fixture(autouse=True)
def no_reports():
    cache.delete(sandbox_hosts.KEY)
    yield
    cache.delete(sandbox_hosts.KEY)


@pytest.fixture
def missing_bwrap(monkeypatch, tmp_path):
    """This host's bwrap is missing (the probe looks where $THUNDERSYNC_BWRAP says)."""
    monkeypatch.setenv(sandbox_bwrap.BWRAP_ENV, str(tmp_path / "no-such-bwrap"))


@pytest.fixture
def sandbox_experiment(alice):
    return Experiment.objects.create(owner=alice, name="sandbox", config=SANDBOX)


@pytest.mark.django_db
def test_a_launch_is_refused_when_no_worker_can_confine_the_tool(
    alice_client, sandbox_experiment, alice_experiment, sync_preset, missing_bwrap
):
    assert sandbox_hosts.report("worker-a") is not None  # the worker said so when it started
    response = post_json(alice_client, URL, {"experiment": sandbox_experiment.pk, "schedule": sync_preset.pk, "steps": 2})
    assert response.status_code == 400, response.content
    reason = response.json()["errors"]["experiment"]
    assert reason.startswith("task.name: task python-sandbox calls the python-sandbox tool"), reason
    assert "no worker can confine it (worker-a: bwrap is not installed" in reason, reason
    assert Run.objects.count() == 0
    # a task without the tool launches on the same workers
    response = post_json(alice_client, URL, {"experiment": alice_experiment.pk, "schedule": sync_preset.pk, "steps": 2})
    assert response.status_code == 201, response.content


@pytest.mark.django_db
def test_a_dataset_task_with_the_tool_is_refused_naming_task_tools(alice_client, alice, sync_preset, missing_bwrap):
    config = {**QUICKSTART, "task": {"name": "dataset", "path": "configs/data/math.jsonl",
                                     "prompt_field": "question", "tools": ["python-sandbox"]}}
    experiment = Experiment.objects.create(owner=alice, name="data", config=config)
    sandbox_hosts.report("worker-a")
    response = post_json(alice_client, URL, {"experiment": experiment.pk, "schedule": sync_preset.pk, "steps": 2})
    assert response.status_code == 400, response.content
    assert response.json()["errors"]["experiment"].startswith("task.tools: task dataset calls the python-sandbox tool")


@pytest.mark.django_db
def test_one_worker_that_can_confine_is_enough_and_no_report_lets_the_start_decide(
    alice_client, sandbox_experiment, sync_preset, monkeypatch, tmp_path
):
    post = lambda: post_json(alice_client, URL, {"experiment": sandbox_experiment.pk, "schedule": sync_preset.pk,
                                                 "steps": 2})  # noqa: E731
    assert post().status_code == 201  # no worker reported: the run's start checks
    assert sandbox_hosts.report("worker-b") is None  # this host's real bwrap works
    monkeypatch.setenv(sandbox_bwrap.BWRAP_ENV, str(tmp_path / "no-such-bwrap"))
    assert sandbox_hosts.report("worker-a") is not None
    assert post().status_code == 201  # worker-b can run it


@pytest.mark.slow
def test_a_run_started_where_bwrap_is_missing_fails_at_start_with_one_line(
    celery_worker, sandbox_experiment, sync_preset, missing_bwrap
):
    """The controller believed a worker could confine (it reported before its bwrap went
    missing, or it never reported): the run's own start refuses, before any rollout worker."""
    from controller.supervision.launching import launch_run

    cache.delete(sandbox_hosts.KEY)  # the embedded worker reported this host's working bwrap at its start
    run = launch_run(sandbox_experiment, sync_preset, steps=2)
    run = wait_for_status(run.pk, Run.FINISHED, 120)
    assert run.status == "failed"
    first = run.error.strip().splitlines()[0]
    assert "task.name: task python-sandbox calls the python-sandbox tool" in first, run.error
    assert "bubblewrap cannot confine it on this host: bwrap is not installed" in first, run.error
    assert not run.spans.exists()  # no rollout ever ran
