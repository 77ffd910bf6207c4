"""No run without an owner (controller/supervision/ownership.py): claims, adoption by a redelivered
task, the reaper, cancel of an unsupervised run, re-sending a message the broker lost.
Real PostgreSQL and Redis; supervisors are stood in for by real processes that exit."""

import subprocess
from datetime import timedelta

import pytest
from django.utils import timezone

from controller import broker
from controller.supervision import ownership
from controller.supervision import processes
from controller.celery import app
from controller.supervision.launching import request_cancel
from controller.models import Run
from controller.tasks import run_training

from .conftest import make_run

pytestmark = pytest.mark.django_db


def dead_local_supervisor() -> str:
    """The identity of a process of this host that has exited."""
    proc = subprocess.Popen(["sleep", "30"])
    identity = f"{processes.HOST}:{proc.pid}:{processes.process_start(proc.pid)}"
    proc.kill()
    proc.wait()
    return identity


def running(experiment, preset, supervisor: str, heartbeat_age_s: float = 0.0, **fields) -> Run:
    return make_run(experiment, preset, status=Run.Status.RUNNING, supervisor=supervisor,
                    heartbeat=timezone.now() - timedelta(seconds=heartbeat_age_s), **fields)


def test_a_redelivered_task_ends_the_run_its_dead_supervisor_left(alice_experiment, sync_preset):
    run = running(alice_experiment, sync_preset, dead_local_supervisor(), start_task_id="message-1")
    assert run_training.apply(args=[run.pk], task_id="message-1").get() == "adopted"
    run.refresh_from_db()
    assert run.status == "failed" and run.finished is not None
    assert "its supervising worker process" in run.error and "is gone" in run.error


def test_a_redelivered_message_adopts_exactly_the_run_it_started(alice_experiment, bob_experiment, sync_preset):
    # Fair dispatch: the message launched with bob's run started alice's (the fairest then),
    # and the message launched with alice's started bob's. Both supervisors died. The
    # redelivery of bob's message ends alice's run, the one it started, and only that one.
    alices = running(alice_experiment, sync_preset, dead_local_supervisor(), start_task_id="bobs-message",
                     celery_task_id="alices-message")
    bobs = running(bob_experiment, sync_preset, dead_local_supervisor(), start_task_id="alices-message",
                   celery_task_id="bobs-message")
    assert run_training.apply(args=[bobs.pk], task_id="bobs-message").get() == "adopted"
    alices.refresh_from_db()
    bobs.refresh_from_db()
    assert alices.status == "failed" and "is gone" in alices.error
    assert bobs.status == "running"  # its own message's redelivery, or the reaper, ends it
    assert run_training.apply(args=[alices.pk], task_id="a-fresh-slot").get() == "skipped"  # no message of its
    bobs.refresh_from_db()
    assert bobs.status == "running"


def test_a_claim_records_the_message_that_made_it(alice_experiment, sync_preset):
    from controller.supervision.dispatch import claim_next_run

    run = make_run(alice_experiment, sync_preset, status=Run.Status.QUEUED)
    assert claim_next_run("message-7") == run.pk
    run.refresh_from_db()
    assert run.status == "starting" and run.start_task_id == "message-7"


def test_a_redelivered_task_leaves_a_live_supervisors_run_alone(alice_experiment, sync_preset):
    # this process, but no live supervisor thread...
    run = running(alice_experiment, sync_preset, processes.me(), start_task_id="message-2")
    with ownership.supervising(run.pk):  # ...now there is one
        assert run_training.apply(args=[run.pk], task_id="message-2").get() == "skipped"
    run.refresh_from_db()
    assert run.status == "running"


def test_the_reaper_ends_a_dead_local_owners_run_at_once(alice_experiment, sync_preset):
    run = running(alice_experiment, sync_preset, dead_local_supervisor())
    assert ownership.reap()[0] == 1
    run.refresh_from_db()
    assert run.status == "failed" and "no checkpoint to resume from" in run.error


def test_the_reaper_waits_two_passes_for_a_remote_owner_with_a_stale_heartbeat(
    alice_experiment, sync_preset, settings
):
    stale = running(alice_experiment, sync_preset, "other-node:12:34", heartbeat_age_s=settings.THUNDERSYNC_STALE_S + 5)
    fresh = running(alice_experiment, sync_preset, "other-node:13:34")
    assert ownership.reap()[0] == 0  # first sighting: it may only have lost the database
    assert ownership.reap()[0] == 1
    stale.refresh_from_db()
    fresh.refresh_from_db()
    assert stale.status == "failed" and "other-node:12:34 last reported" in stale.error
    assert fresh.status == "running"


def test_a_run_handed_to_a_node_nobody_serves_fails_naming_the_queue(alice_experiment, sync_preset, settings):
    # a run that spans nodes, handed to its first node's queue (controller/supervision/nodes.py), never taken
    run = running(alice_experiment, sync_preset, ownership.HANDED_OFF + "runs.a",
                  heartbeat_age_s=settings.THUNDERSYNC_STALE_S + 5)
    ownership.reap()
    assert ownership.reap()[0] == 1
    run.refresh_from_db()
    assert run.status == "failed" and "no worker took it from queue runs.a" in run.error, run.error


def test_an_owner_that_stamps_between_two_passes_keeps_its_run(alice_experiment, sync_preset, settings):
    run = running(alice_experiment, sync_preset, "other-node:12:34", heartbeat_age_s=settings.THUNDERSYNC_STALE_S + 5)
    ownership.reap()
    Run.objects.filter(pk=run.pk).update(heartbeat=timezone.now())  # its database came back
    assert ownership.reap()[0] == 0
    run.refresh_from_db()
    assert run.status == "running"


def test_the_reaper_honours_a_cancel_request(alice_experiment, sync_preset):
    run = running(alice_experiment, sync_preset, dead_local_supervisor(), cancel_requested=True)
    ownership.reap()
    run.refresh_from_db()
    assert run.status == "cancelled" and run.error == ""


def test_cancel_ends_an_unsupervised_run(alice_experiment, sync_preset, settings):
    run = running(alice_experiment, sync_preset, "other-node:12:34", heartbeat_age_s=settings.THUNDERSYNC_STALE_S + 5)
    assert request_cancel(run)
    assert run.status == "cancelled" and run.cancel_requested and run.finished is not None


def test_the_reaper_sends_again_a_queued_run_the_broker_lost(alice_experiment, sync_preset, settings):
    def purge():
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge("runs")

    purge()
    long_ago = timezone.now() - timedelta(seconds=settings.THUNDERSYNC_REQUEUE_AFTER_S + 5)
    lost = make_run(alice_experiment, sync_preset, status=Run.Status.QUEUED, enqueued=long_ago)
    try:
        assert broker.backlog() == 0
        assert ownership.reap() == (0, 1)
        assert broker.backlog() == 1
        lost.refresh_from_db()
        assert lost.enqueued > long_ago
        Run.objects.filter(pk=lost.pk).update(enqueued=long_ago)
        assert ownership.reap() == (0, 0)  # the broker holds a message: nothing is lost
        purge()
        Run.objects.filter(pk=lost.pk).update(enqueued=timezone.now())
        assert ownership.reap() == (0, 0)  # sent a moment ago: its message may still be on its way
    finally:
        purge()
