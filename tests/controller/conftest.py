"""Fixtures for the controller: named users, logged-in clients, presets, a real worker.

Settings: controller.settings.test (PostgreSQL and Redis on 127.0.0.1, see pyproject.toml).
"""

import asyncio
import inspect
import json
import time
from pathlib import Path

import pytest
import yaml
from celery import Celery
from django.test import Client

from controller.models import Experiment, Run, Schedule, Span, StepMetric

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())


@pytest.fixture(autouse=True)
def fresh_channel_layer():
    """Each test gets channel layers of its own. pytest-asyncio runs every async test in a new
    event loop, and a layer kept from an earlier test holds locks bound to that test's loop: a
    consumer cancelled at the end of a later test then failed with "<Lock> is bound to a different
    event loop" (seen once in a full CI run, depending on which tests shared the xdist worker)."""
    from channels.layers import channel_layers

    channel_layers.backends.clear()
    yield
    channel_layers.backends.clear()


@pytest.fixture(autouse=True)
def bounded_loop_teardown(request):
    """An async test's leftover tasks are ended here, by ``fanout.end_tasks`` (cancelled again
    while one runs on, at most 10 s), before pytest-asyncio closes the test's event loop, which
    cancels each once and waits for them without a limit. A cancellation can be lost (Python 3.11's
    ``asyncio.wait_for`` inside redis-py), and a channels-redis receive that lost it pops on until
    a message comes: such a task held an event loop's close for the whole 600 s test timeout.
    A task that still runs after that is unregistered, so the close goes on, and the test fails."""
    if inspect.iscoroutinefunction(getattr(request.node, "function", None)):
        request.getfixturevalue("leftover_tasks_ended")
    yield


@pytest.fixture
async def leftover_tasks_ended():
    yield
    from controller.live.fanout import end_tasks

    leftover = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    stuck = await end_tasks(leftover, timeout_s=10.0)
    for task in stuck:
        asyncio.tasks._unregister_task(task)
    assert not stuck, f"tasks that did not end when cancelled for 10 s: {stuck}"


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice", password="alice-password")


@pytest.fixture
def bob(django_user_model):
    return django_user_model.objects.create_user("bob", password="bob-password")


@pytest.fixture
def alice_client(alice):
    client = Client()
    client.force_login(alice)
    return client


@pytest.fixture
def bob_client(bob):
    client = Client()
    client.force_login(bob)
    return client


@pytest.fixture
def sync_preset(db):
    return Schedule.objects.create(owner=None, name="sync", kind="sync")


@pytest.fixture
def streaming_preset(db):
    return Schedule.objects.create(owner=None, name="streaming", kind="streaming")


@pytest.fixture
def alice_experiment(alice):
    return Experiment.objects.create(owner=alice, name="quickstart", config=QUICKSTART)


@pytest.fixture
def bob_experiment(bob):
    return Experiment.objects.create(owner=bob, name="bob's", config=QUICKSTART)


def make_run(experiment, schedule, status=Run.Status.SUCCEEDED, **fields) -> Run:
    """A stored run (no task): for the read-only endpoints."""
    from controller.config_merge import run_config

    config = run_config(experiment.config, schedule.overrides(), fields.pop("steps", 2), "")
    return Run.objects.create(experiment=experiment, schedule=schedule, steps=config["train"]["steps"],
                              config=config, status=status, **fields)


def store_spans(run, count: int, steps: int = 2) -> list[Span]:
    """``count`` spans, seq dense from 0, spread over ``steps`` steps, on two lanes."""
    spans = [
        Span(run=run, seq=i, step=i * steps // count, kind="rollout.generate" if i % 2 else "learner.backward",
             t0=0.1 * i, t1=0.1 * i + 0.05, lane="rollout/0/0" if i % 2 else "learner/0", traj=i, group=i // 4,
             turn=0, policy_version=0, tokens=3)
        for i in range(count)
    ]
    return Span.objects.bulk_create(spans)


def store_metrics(run, steps: int = 2) -> None:
    for step in range(steps):
        StepMetric.objects.create(run=run, step=step, values={
            "timing_s/step": 1.0 + step, "trainer/idle_ratio": 0.5 / (step + 1), "reward/mean": 0.25 * step,
        })


@pytest.fixture
def alice_run(alice_experiment, streaming_preset):
    return make_run(alice_experiment, streaming_preset)


@pytest.fixture
def bob_run(bob_experiment, streaming_preset):
    return make_run(bob_experiment, streaming_preset)


def post_json(client, url, payload, **extra):
    body = payload if isinstance(payload, (str, bytes)) else json.dumps(payload)
    return client.post(url, body, content_type="application/json", **extra)


def wait_for_status(run_id: int, statuses, timeout: float) -> Run:
    """Poll the database until the run reaches one of ``statuses`` (a real process is working)."""
    deadline = time.monotonic() + timeout
    while True:
        run = Run.objects.get(pk=run_id)
        if run.status in statuses:
            return run
        if time.monotonic() > deadline:
            raise AssertionError(f"run {run_id} still {run.status} after {timeout}s; error: {run.error}")
        time.sleep(0.2)


@pytest.fixture
def celery_worker(transactional_db, settings, tmp_path):
    """A real Celery worker (solo pool, thread of this process) on the Redis broker, queue 'runs'."""
    from controller.celery import app
    from controller.supervision.embedded_worker import EmbeddedWorker

    settings.THUNDERSYNC_RUN_DIR = tmp_path / "runs"
    with app.connection_for_write() as conn:  # a clean queue: nothing left from an earlier test run
        conn.default_channel.queue_purge("runs")
    worker = EmbeddedWorker(app, queues=["runs"]).start()
    yield worker
    Run.objects.exclude(status__in=Run.FINISHED).update(cancel_requested=True)
    worker.stop(timeout=60)


def launch_from_page(page, base_url: str, experiment, schedule, steps: int) -> int:
    """Launch a run from the experiment page's form (a logged-in browser page); the run's id."""
    import re

    page.goto(f"{base_url}/experiments/{experiment.pk}/")
    page.select_option("#id_schedule", str(schedule.pk))
    page.fill("#id_steps", str(steps))
    page.click("#launch-form button[type=submit]")
    page.wait_for_url(re.compile(r"/runs/\d+/$"))
    return int(re.search(r"/runs/(\d+)/$", page.url).group(1))


@pytest.fixture
def memory_broker_app(settings):
    """A Celery app configured like the embedded settings: broker memory:// (this process only).
    Not made the current app, so later tests still enqueue through the Redis-backed one."""
    app = Celery("embedded-test", set_as_current=False)
    app.config_from_object("django.conf:settings", namespace="CELERY")
    app.conf.broker_url = "memory://"
    app.conf.broker_transport_options = {}
    app.autodiscover_tasks(["controller"])  # as controller/celery.py: the worker imports controller/tasks.py
    return app
