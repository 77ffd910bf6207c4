"""Fault injection on real runs: PostgreSQL, Redis, a ``celery worker`` process, the tiny
quickstart learner. For every fault: the run reaches a final state within 60 s, no run is
left running or queued without a live owner, the spans stored before the fault are all
there, and neither processes nor /dev/shm semaphores of the run are left behind.
docs/controller.md "No run without an owner" describes the mechanisms under test."""

import os
import shlex
import shutil
import signal
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Min
from django.utils import timezone

from controller.celery import app
from controller.broker import enqueue
from controller.supervision.launching import launch_run
from controller.models import Experiment, Run, Span, StepMetric

from .conftest import QUICKSTART
from tests.harness.processes import rollout_workers

from .faults import (BackendTerminator, WorkerProcess, assert_nothing_left, assert_spans_kept, exited, group_members,
                     wait_final, wait_running_with_spans, wait_until)
from .faults import redis_server, web  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
BOUND_S = 60.0


@pytest.fixture
def run_dir(tmp_path, settings):
    """The worker's run directory, and this process's too: the API (a cancel) finds a run's
    leftover processes by their working directory, as the app and its worker share it."""
    settings.THUNDERSYNC_RUN_DIR = tmp_path / "runs"
    return settings.THUNDERSYNC_RUN_DIR


@pytest.fixture
def worker(run_dir, tmp_path):
    started = [WorkerProcess(run_dir, tmp_path / "worker.log")]

    def another():  # a replacement after the first was killed
        started.append(WorkerProcess(run_dir, tmp_path / "worker.log"))
        return started[-1]

    started[0].another = another
    yield started[0]
    Run.objects.exclude(status__in=Run.FINISHED).update(cancel_requested=True)
    for w in started:
        w.stop()


def no_run_without_owner() -> None:
    assert not Run.objects.exclude(status__in=Run.FINISHED).exists()


def launch(experiment, preset, steps: int) -> int:
    return launch_run(experiment, preset, steps=steps).pk


def test_a_killed_rollout_worker_is_replaced_then_kill_9_of_the_learner_fails_the_run(
    worker, run_dir, alice_experiment, streaming_preset
):
    run_id = launch(alice_experiment, streaming_preset, 200)
    run = wait_running_with_spans(run_id, 50)
    # kill -9 of a rollout worker: respawned, its trajectories sampled again, the run goes on
    # (docs/processes.md "A rollout worker dies"); one run serves both faults (suite time)
    victim, = rollout_workers(run.pids[0])
    os.kill(victim, signal.SIGKILL)
    steps_then = StepMetric.objects.filter(run_id=run_id).count()
    log = run_dir / f"run-{run_id}" / "learner.stderr.log"
    wait_until(lambda: b"was killed by SIGKILL" in log.read_bytes(), BOUND_S, "the driver saw its worker die")
    wait_until(lambda: StepMetric.objects.filter(run_id=run_id).count() >= steps_then + 2, BOUND_S,
               "two more steps after the respawn")
    assert Run.objects.get(pk=run_id).status == "running" and victim not in rollout_workers(run.pids[0])
    before = Span.objects.filter(run_id=run_id).count()
    os.kill(run.pids[0], signal.SIGKILL)
    run = wait_final(run_id, BOUND_S)
    assert run.status == "failed" and run.error.startswith("the learner was killed by SIGKILL")
    assert_spans_kept(run_id, before)
    assert_nothing_left(run)
    no_run_without_owner()


def test_kill_9_of_the_celery_pool_process_hands_the_run_to_the_redelivered_task(
    worker, alice_experiment, streaming_preset
):
    run_id = launch(alice_experiment, streaming_preset, 200)
    run = wait_running_with_spans(run_id, 50)
    before = Span.objects.filter(run_id=run_id).count()
    os.kill(worker.pool_child(), signal.SIGKILL)
    t0 = time.monotonic()
    run = wait_final(run_id, BOUND_S)
    assert run.status == "failed" and "supervising worker process" in run.error, run.error
    assert time.monotonic() - t0 < BOUND_S
    assert_spans_kept(run_id, before)
    assert_nothing_left(run)
    no_run_without_owner()


def test_a_lost_celery_worker_is_reaped_by_the_next_one(worker, alice_experiment, streaming_preset):
    run_id = launch(alice_experiment, streaming_preset, 200)
    run = wait_running_with_spans(run_id, 50)
    before = Span.objects.filter(run_id=run_id).count()
    # docker stop: SIGTERM (a warm shutdown would wait for the run), then SIGKILL after the
    # grace, here to the main process only (in a container the rest dies with it; outside one
    # the pool child must go by itself: Celery gives it a parent-death signal)
    pool = worker.pool_child()
    os.kill(worker.pid, signal.SIGTERM)
    time.sleep(2.0)  # the stop's grace period, not a stand-in for work
    os.kill(worker.pid, signal.SIGKILL)
    wait_until(lambda: exited(pool), 10, "the pool child died")
    worker.stop()  # nothing left to kill: waits for the group to be gone
    t0 = time.monotonic()
    worker.another()
    run = wait_final(run_id, BOUND_S)
    assert run.status == "failed" and "lost its supervisor" in run.error, run.error
    assert time.monotonic() - t0 < BOUND_S
    assert_spans_kept(run_id, before)
    assert_nothing_left(run)
    no_run_without_owner()


def test_a_run_whose_only_worker_died_is_ended_by_the_web_process(worker, alice_experiment, streaming_preset, web):
    """No worker of the run's queue comes back: the web process (production settings reap
    there too, controller/asgi.py) ends the run within its reap interval."""
    run_id = launch(alice_experiment, streaming_preset, 200)
    run = wait_running_with_spans(run_id, 20)
    worker.stop()  # kill -9 of the main and the pool process; none is started again
    t0 = time.monotonic()
    run = wait_final(run_id, BOUND_S)
    assert run.status == "failed" and "lost its supervisor" in run.error, run.error
    assert time.monotonic() - t0 < BOUND_S
    assert_nothing_left(run)
    no_run_without_owner()


def test_a_hung_supervisor_is_reaped_and_its_learner_group_killed(worker, alice_experiment, streaming_preset):
    """SIGSTOP of the pool process: its supervisor is alive but stops stamping and touching its
    run directory; the worker's reaper ends the run and kills the learner's whole group (it
    would block on its full stdout pipe forever), then checks it is gone."""
    run_id = launch(alice_experiment, streaming_preset, 200)
    run = wait_running_with_spans(run_id, 20)
    pool = worker.pool_child()
    os.kill(pool, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        run = wait_final(run_id, BOUND_S)
        assert run.status == "failed" and "last reported" in run.error, run.error
        assert time.monotonic() - t0 < BOUND_S
        assert_nothing_left(run)
    finally:
        os.kill(pool, signal.SIGCONT)


def test_cancel_ends_a_run_whose_worker_is_gone(worker, alice_client, alice_experiment, streaming_preset):
    run_id = launch(alice_experiment, streaming_preset, 200)
    run = wait_running_with_spans(run_id, 20)
    pool = worker.pool_child()
    os.kill(worker.pid, signal.SIGKILL)  # kill -9 of the main process only: its pool child goes with it
    wait_until(lambda: exited(pool), 10, "the pool child died")
    worker.stop()  # nobody supervises the run now, and no worker will come back
    response = alice_client.post(f"/api/runs/{run_id}/cancel/")
    assert response.status_code == 202 and response.json()["status"] == "cancelled"
    run = Run.objects.get(pk=run_id)
    assert run.status == "cancelled" and run.finished is not None
    assert_nothing_left(run)


def test_terminated_database_connections_do_not_kill_a_healthy_run(worker, alice_experiment, sync_preset):
    run_id = launch(alice_experiment, sync_preset, 4)
    wait_running_with_spans(run_id, 20)
    name = connection.settings_dict["NAME"]
    for _ in range(3):  # the supervisor's connection, the reaper's, whoever reconnected
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
        time.sleep(0.5)  # let them reconnect, then cut them again
    run = wait_final(run_id, 240)
    assert run.status == "succeeded", run.error
    assert b"the database is unreachable" in worker.log_path.read_bytes()  # the fault did hit the supervisor
    seqs = list(Span.objects.filter(run_id=run_id).values_list("seq", flat=True))
    assert sorted(seqs) == list(range(run.summary["spans"]))  # nothing lost, nothing twice
    assert run.summary["steps"] == 4
    assert_nothing_left(run)


def test_a_flapping_database_never_reaps_a_live_supervisor(worker, alice_experiment, sync_preset, settings):
    """Every backend terminated every 50 ms for three times THUNDERSYNC_STALE_S: the worker's
    reaper sees the run's heartbeat go stale, but its supervisor keeps touching its run
    directory (controller/supervision/liveness.py), so the run trains on and ends with every step."""
    run_id = launch(alice_experiment, sync_preset, 60)
    wait_running_with_spans(run_id, 20)
    with BackendTerminator(0.05) as terminator:
        time.sleep(3 * settings.THUNDERSYNC_STALE_S)  # the length of the outage, not a stand-in for work
    assert terminator.terminated > 0
    assert Run.objects.get(pk=run_id).status == "running"
    run = wait_final(run_id, 300)
    assert run.status == "succeeded", run.error
    assert b"the database is unreachable" in worker.log_path.read_bytes()  # the fault did hit the supervisor
    assert sorted(StepMetric.objects.filter(run_id=run_id).values_list("step", flat=True)) == list(range(60))
    assert sorted(Span.objects.filter(run_id=run_id).values_list("seq", flat=True)) == list(range(run.summary["spans"]))
    assert_nothing_left(run)


def test_a_full_run_disk_fails_the_run_with_the_reason(worker, run_dir, alice_experiment, sync_preset):
    run = Run.objects.create(experiment=alice_experiment, schedule=sync_preset, steps=200,
                             config={**alice_experiment.config, "train": {**alice_experiment.config["train"],
                                                                           "steps": 200}},
                             celery_task_id="full-disk")
    (run_dir / f"run-{run.pk}").mkdir(parents=True)
    (run_dir / f"run-{run.pk}" / "learner.stderr.log").symlink_to("/dev/full")  # every write: ENOSPC
    enqueue(run.pk, run.celery_task_id)
    run = wait_final(run.pk, 240)
    assert run.status == "failed" and "No space left on device" in run.error.splitlines()[0], run.error
    assert_nothing_left(run)


HANGING_BWRAP = """#!/bin/sh
# A tool call that hangs: this stand-in for bwrap records its pid and stops itself (SIGSTOP:
# alive, never answers) before the real bwrap would start the call's interpreter. The
# availability probe ("-c pass") passes straight through, so the run keeps bwrap's confinement.
for last; do :; done
if [ "$last" = main.py ]; then
  echo $$ >> {stopped}
  kill -STOP $$
fi
exec {real} "$@"
"""


@pytest.fixture
def hanging_tools(run_dir, tmp_path):
    """A worker whose every python-sandbox call hangs, and the file where each hung call's pid
    is written. Injected by construction rather than by catching a short-lived call with a
    signal: a call lives a few tens of milliseconds, which a poll of /proc misses on a loaded
    machine."""
    real = shutil.which("bwrap")
    if real is None:
        pytest.fail("bwrap is not installed (./run test installs bubblewrap)")
    bin_dir, stopped = tmp_path / "bin", tmp_path / "stopped-pids"
    bin_dir.mkdir()
    stopped.touch()
    (bin_dir / "bwrap").write_text(HANGING_BWRAP.format(stopped=shlex.quote(str(stopped)), real=shlex.quote(real)))
    (bin_dir / "bwrap").chmod(0o755)
    worker = WorkerProcess(run_dir, tmp_path / "worker.log", path_first=bin_dir)
    yield worker, stopped
    Run.objects.exclude(status__in=Run.FINISHED).update(cancel_requested=True)
    worker.stop()


def test_a_hanging_tool_times_out_and_the_run_goes_on(hanging_tools, alice, sync_preset):
    _, stopped_file = hanging_tools
    config = {**QUICKSTART, "task": {**QUICKSTART["task"], "name": "python-sandbox", "tool_timeout_s": 1.0}}
    experiment = Experiment.objects.create(owner=alice, name="sandbox", config=config)
    run_id = launch(experiment, sync_preset, 2)
    run = wait_final(run_id, 240)
    assert run.status == "succeeded", run.error
    stopped = {int(line) for line in stopped_file.read_text().split()}
    assert stopped  # the fault did hit: tool calls were made and hung
    spans = list(Span.objects.filter(run_id=run_id).values("kind", "t0", "t1", "traj"))
    hung = [s for s in spans if s["kind"] == "rollout.tool" and s["t1"] - s["t0"] >= 1.0]
    assert hung and all(s["t1"] - s["t0"] < 5.0 for s in hung)  # task.tool_timeout_s, not the sandbox's 5 s
    # while a call hung, other trajectories kept generating (the tool runs off the loop's thread)
    assert any(g["kind"] == "rollout.generate" and g["traj"] != h["traj"] and h["t0"] < g["t0"] < h["t1"]
               for h in hung for g in spans)
    assert_nothing_left(run)
    # each hung call was killed by the sandbox's wall clock, though it never answered a signal but SIGKILL
    wait_until(lambda: not [pid for pid in stopped if os.path.exists(f"/proc/{pid}")], 30, "the hung calls are gone")


def test_a_redis_restart_loses_no_run(redis_server, run_dir, tmp_path, alice_experiment, sync_preset):
    # The worker's broker is a private Redis that this test crashes (a restart without
    # persistence). The test process enqueues on the test run's shared broker, which that
    # worker never reads: for it, every message the test sends is lost, as in a crash.
    long_ago = timezone.now() - timedelta(minutes=5)
    first = launch_run(alice_experiment, sync_preset, steps=3)
    Run.objects.filter(pk=first.pk).update(enqueued=long_ago)
    worker = WorkerProcess(run_dir, tmp_path / "worker.log", redis_url=redis_server.url)
    try:
        wait_running_with_spans(first.pk, 20)  # the reaper sent its message again
        second = launch_run(alice_experiment, sync_preset, steps=1)
        Run.objects.filter(pk=second.pk).update(enqueued=long_ago)
        before = Span.objects.filter(run_id=first.pk).count()
        redis_server.crash()  # the running run's unacknowledged message dies with it
        redis_server.start()
        runs = [wait_final(first.pk, 240), wait_final(second.pk, 240)]
        for run in runs:
            assert run.status == "succeeded", run.error
            assert sorted(Span.objects.filter(run_id=run.pk).values_list("seq", flat=True)) == list(
                range(run.summary["spans"]))
            assert_nothing_left(run)
        assert Span.objects.filter(run_id=first.pk).count() >= before
        log = worker.log_path.read_bytes()
        assert b"the broker holds no message: sending one again" in log
        # one warning per outage, not per frame (the worker's log shows each record twice: plain and
        # in Celery's format, so count the latter)
        assert sum(b"WARNING/" in line and b"the channel layer is unreachable" in line
                   for line in log.splitlines()) <= 1
        no_run_without_owner()
    finally:
        worker.stop()
        with app.connection_for_write() as conn:  # the messages the worker never saw
            conn.default_channel.queue_purge("runs")


def test_a_killed_run_resumes_from_its_checkpoint_with_continuous_steps(worker, alice, alice_client, sync_preset):
    from controller.models import Checkpoint

    config = {**QUICKSTART, "train": {**QUICKSTART["train"], "checkpoint_every": 1}}
    experiment = Experiment.objects.create(owner=alice, name="checkpointed", config=config)
    run_id = launch(experiment, sync_preset, 5)
    run = wait_running_with_spans(run_id, 1)
    wait_until(lambda: Checkpoint.objects.filter(run_id=run_id, step__gte=1).exists(), 240, "two steps checkpointed")
    os.kill(run.pids[0], signal.SIGKILL)
    run = wait_final(run_id, BOUND_S)
    assert run.status == "failed" and "killed by SIGKILL" in run.error
    # The newest checkpoint's report, with its step's metrics and spans, never reached the
    # database (a learner killed right after writing it): the resume must start from the
    # newest one the database knows, or that step's metrics would be missing for good.
    newest = Checkpoint.objects.filter(run_id=run_id).latest("step")
    cut = Span.objects.filter(run_id=run_id, step__gte=newest.step).aggregate(seq=Min("seq"))["seq"]
    Span.objects.filter(run_id=run_id, seq__gte=cut if cut is not None else 2**31).delete()
    StepMetric.objects.filter(run_id=run_id, step__gte=newest.step).delete()
    newest.delete()
    (worker.log_path.parent / "runs" / f"run-{run_id}" / "output" / "checkpoints" / ".tmp-step-000009-1").mkdir()
    before = Span.objects.filter(run_id=run_id).count()
    page = alice_client.get(f"/runs/{run_id}/").content.decode()
    assert "killed by SIGKILL" in page and 'id="resume-form"' in page
    assert 'id="resume-form" hidden' not in " ".join(page.split())
    response = alice_client.post(f"/api/runs/{run_id}/resume/")
    assert response.status_code == 202 and response.json()["attempt"] == 1
    run = wait_final(run_id, 240)
    assert run.status == "succeeded", run.error
    assert [m.step for m in StepMetric.objects.filter(run_id=run_id).order_by("step")] == [0, 1, 2, 3, 4]
    assert_spans_kept(run_id, before)  # the first attempt's spans, then the second's after them
    spans = list(Span.objects.filter(run_id=run_id).order_by("seq").values("seq", "t0"))
    resumed = [s for s in spans if s["seq"] >= before]
    assert resumed and min(s["t0"] for s in resumed) >= max(s["t0"] for s in spans[:before]) - 1.0
    output = worker.log_path.parent / "runs" / f"run-{run_id}" / "output"
    assert (output / "model.safetensors").exists()
    assert not list((output / "checkpoints").glob(".tmp-*"))  # the half-written one was removed
    assert b"was never recorded: removed, resuming from step" in worker.log_path.read_bytes()
    assert_nothing_left(run)
