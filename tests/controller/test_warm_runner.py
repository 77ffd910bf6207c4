"""The warm runner (learner/warm/server.py, controller/supervision/warm.py): runs launched on the embedded
default are forked from it, and every way a run ends leaves nothing behind, as a cold run's."""

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from controller.supervision import ownership
from controller.supervision import warm
from controller.supervision.embedded_worker import EmbeddedWorker
from controller.models import Run
from controller.tasks import run_training
from learner.warm.client import WarmProcess

from .conftest import make_run
from .faults import assert_nothing_left, group_members, wait_final, wait_running_with_spans, wait_until


def send(app, run: Run) -> None:
    app.send_task("controller.tasks.run_training", args=[run.pk], queue="runs")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_runs_on_the_embedded_default_fork_from_the_warm_runner_and_end_cleanly(
    memory_broker_app, settings, tmp_path, alice_experiment, streaming_preset
):
    settings.THUNDERSYNC_RUN_DIR = tmp_path
    settings.THUNDERSYNC_WARM_RUNNER = True  # on in the embedded and production settings
    worker = EmbeddedWorker(memory_broker_app, queues=["runs"]).start()  # starts the warm runner
    runner = warm._runner["proc"]
    socket = warm.socket_path(os.getpid())
    try:
        wait_until(lambda: socket.exists() or runner.poll() is not None, 240, "the warm runner is ready")
        assert runner.poll() is None, (tmp_path / "warm-runner.log").read_text()

        # 1. a run completes, forked by the runner (the log's first boot line says so)
        run = make_run(alice_experiment, streaming_preset, status=Run.Status.QUEUED, steps=1)
        send(memory_broker_app, run)
        done = wait_final(run.pk, timeout=120)
        assert done.status == "succeeded", done.error
        log = (tmp_path / f"run-{run.pk}" / "learner.stderr.log").read_text()
        assert log.startswith(f"boot: forked from the warm runner (pid {runner.pid})"), log[:500]
        assert done.summary["steps"] == 1
        assert_nothing_left(done)

        # 2. kill -9 of the forked learner: the run fails with the reason, its workers go too
        run = make_run(alice_experiment, streaming_preset, status=Run.Status.QUEUED, steps=200)
        send(memory_broker_app, run)
        running = wait_running_with_spans(run.pk, timeout=120)
        os.kill(running.pids[0], signal.SIGKILL)
        failed = wait_final(run.pk)
        assert failed.status == "failed" and "killed by SIGKILL" in failed.error, failed.error
        assert_nothing_left(failed)

        # 3. cancel: SIGTERM to the run's group, the learner stops at a safe point
        run = make_run(alice_experiment, streaming_preset, status=Run.Status.QUEUED, steps=200)
        send(memory_broker_app, run)
        running = wait_running_with_spans(run.pk, timeout=120)
        Run.objects.filter(pk=run.pk).update(cancel_requested=True)
        assert wait_final(run.pk).status == "cancelled"
        assert_nothing_left(running)

        # 4. its supervisor dies (the connection closes): the runner stops the run
        child = WarmProcess(socket, ["train", "--config", "configs/quickstart.yaml", "--steps", "200", "--events", "-"],
                            Path(__file__).resolve().parents[2], dict(os.environ))
        assert child.stdout.readline().startswith('{"type":"run","status":"started"')
        child._conn.close()
        wait_until(lambda: not group_members(child.pid), 30, "the orphaned run's group is gone")
        assert runner.poll() is None  # the runner itself serves on
    finally:
        worker.stop(timeout=60)
    # the worker's shutdown stops its runner and removes the socket
    assert runner.poll() is not None and not socket.exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_run_waiting_for_a_runner_that_still_imports_stays_its_supervisors(
    settings, tmp_path, alice_experiment, streaming_preset, monkeypatch
):
    """The first run after a worker starts waits for its runner (THUNDERSYNC_WARM_WAIT_S); a
    reaper pass meanwhile must not take it for a run whose supervisor stopped."""
    settings.THUNDERSYNC_RUN_DIR = tmp_path
    settings.THUNDERSYNC_WARM_RUNNER = True
    settings.THUNDERSYNC_WARM_WAIT_S = 5.0
    importing = subprocess.Popen(["sleep", "120"])  # alive, and its socket never appears
    monkeypatch.setitem(warm._runner, "proc", importing)
    run = make_run(alice_experiment, streaming_preset, status=Run.Status.QUEUED, steps=1)
    task = threading.Thread(target=lambda: run_training.apply(args=[run.pk]))
    task.start()
    try:
        wait_until(lambda: Run.objects.get(pk=run.pk).status == Run.Status.STARTING, 30, "the run is claimed")
        ownership.reap()  # while the supervisor waits for the runner
        assert Run.objects.get(pk=run.pk).status == Run.Status.STARTING, Run.objects.get(pk=run.pk).error
        task.join(300)
    finally:
        importing.kill()
        importing.wait()
    done = wait_final(run.pk)
    assert done.status == "succeeded", done.error  # started cold once the wait ran out
