"""The node registry (controller/supervision/nodes.py): a launch may name in ``learner.nodes`` only nodes a
live worker serves, so a made-up name never creates a queue; a node queue that a run's
messages created is deleted when the run ends if no worker serves that node. Real PostgreSQL
and the real Redis broker (this test run's key prefix)."""

from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from controller.supervision import nodes
from controller.supervision import ownership
from controller.broker import forget_queue
from controller.supervision.launching import launch_run
from controller.models import Checkpoint, Experiment, Run, WorkerNode
from controller.tasks import run_training

from .conftest import QUICKSTART

pytestmark = pytest.mark.django_db


def broker_keys(fragment: str) -> list[str]:
    """This test run's broker keys (its global key prefix) that contain ``fragment``."""
    prefix = settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"]
    client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    try:
        return sorted(k.decode() for k in client.scan_iter(match=f"{prefix}*{fragment}*", count=1000))
    finally:
        client.close()


def on_nodes(owner, names: list[str]) -> Experiment:
    config = {**QUICKSTART, "learner": {**QUICKSTART.get("learner", {}), "world_size": len(names), "nodes": names}}
    return Experiment.objects.create(owner=owner, name="on " + ",".join(names), config=config)


def test_a_worker_serves_its_own_node_and_each_node_queue_it_consumes(settings):
    settings.THUNDERSYNC_NODE = "b"
    assert nodes.served_nodes(["runs", "runs.a", "runs.b", "celery", "runs.Bad Name!"]) == ["a", "b"]
    assert nodes.stamp(["runs.a"]) == ["a", "b"]
    assert nodes.live_nodes() == {"a", "b"}
    WorkerNode.objects.filter(name="a").update(seen=timezone.now() - timedelta(seconds=settings.THUNDERSYNC_NODE_TTL_S + 1))
    assert nodes.live_nodes() == {"b"}  # a's worker stopped stamping


def test_a_launch_naming_a_node_no_worker_serves_is_refused_and_creates_no_queue(alice, alice_client, sync_preset):
    nodes.stamp(["runs"])  # this machine's worker: node "local"
    experiment = on_nodes(alice, ["local", "evilnode"])
    answer = alice_client.post("/api/runs/", {"experiment": experiment.pk, "schedule": sync_preset.pk, "steps": 2},
                               content_type="application/json")
    assert answer.status_code == 400, answer.content
    (reason,) = answer.json()["errors"].values()
    assert reason.startswith("learner.nodes: no worker serves node 'evilnode'") and "served now: local" in reason
    assert not Run.objects.exists()
    assert broker_keys("runs.evilnode") == []
    # the same node named by a launch override is refused on the overrides
    plain = Experiment.objects.create(owner=alice, name="plain", config=QUICKSTART)
    answer = alice_client.post("/api/runs/", {"experiment": plain.pk, "schedule": sync_preset.pk, "steps": 2,
                                              "overrides": {"learner.nodes": ["evilnode"]}},
                               content_type="application/json")
    assert answer.status_code == 400 and "'evilnode'" in answer.json()["errors"]["overrides"], answer.content
    assert not Run.objects.exists() and broker_keys("runs.evilnode") == []


def test_a_node_queue_no_worker_serves_is_deleted_with_its_binding_when_the_run_ends(alice, sync_preset):
    """Node "ghost" is served at launch; the run is handed to runs.ghost (a real message in
    Redis), then ghost's worker goes away: the reaper fails the run and its queue goes too."""
    WorkerNode.objects.create(name="ghost", seen=timezone.now())
    run = launch_run(on_nodes(alice, ["ghost"]), sync_preset, steps=2, enqueue_on_commit=False)
    try:
        assert run_training.apply(args=[run.pk]).get() == "handed to node ghost"
        left = broker_keys("runs.ghost")
        assert any(k.endswith(":runs.ghost") for k in left) and any("_kombu.binding.runs.ghost" in k for k in left), left
        WorkerNode.objects.filter(name="ghost").update(seen=timezone.now() - timedelta(hours=1))
        Run.objects.filter(pk=run.pk).update(heartbeat=timezone.now() - timedelta(seconds=settings.THUNDERSYNC_STALE_S + 5))
        ownership.reap()  # first sighting of the stale run
        assert ownership.reap()[0] == 1
        run.refresh_from_db()
        assert run.status == Run.Status.FAILED and "no worker took it from queue runs.ghost" in run.error
        assert broker_keys("runs.ghost") == []
    finally:
        forget_queue("runs.ghost")  # whatever a failed check left in the shared Redis


def test_a_node_queue_another_unfinished_run_needs_is_kept(alice, sync_preset):
    WorkerNode.objects.create(name="ghost2", seen=timezone.now() - timedelta(hours=1))
    experiment = on_nodes(alice, ["ghost2"])
    ended = Run.objects.create(experiment=experiment, schedule=sync_preset, steps=2, config=experiment.config,
                               status=Run.Status.FAILED)
    Run.objects.create(experiment=experiment, schedule=sync_preset, steps=2, config=experiment.config,
                       status=Run.Status.QUEUED)
    assert nodes.release_queues(ended.pk, ended.config) == []
    Run.objects.filter(status=Run.Status.QUEUED).update(status=Run.Status.CANCELLED)
    assert nodes.release_queues(ended.pk, ended.config) == ["runs.ghost2"]


def test_resuming_a_run_whose_node_is_gone_is_refused_naming_it(alice, alice_client, sync_preset):
    experiment = on_nodes(alice, ["gone"])
    run = Run.objects.create(experiment=experiment, schedule=sync_preset, steps=2, config=experiment.config,
                             status=Run.Status.FAILED)
    Checkpoint.objects.create(run=run, step=1, path="step-1")
    answer = alice_client.post(f"/api/runs/{run.pk}/resume/")
    assert answer.status_code == 400, answer.content
    assert answer.json()["errors"]["learner.nodes"].startswith("learner.nodes: no worker serves node 'gone'")
    run.refresh_from_db()
    assert run.status == Run.Status.FAILED and broker_keys("runs.gone") == []
