"""Liveness from the process, not from the database (controller/supervision/liveness.py): a supervisor
that only lost the database keeps its run; one that stopped touching its run directory is
reaped, and the reaper kills its run's whole process group whatever its command line, then
checks it is gone. Real processes; PostgreSQL."""

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from controller.supervision import liveness
from controller.supervision import ownership
from controller.supervision import processes
from controller.models import Run
from controller.supervision.runlog import run_dir

from .conftest import make_run
from .test_ownership import dead_local_supervisor

pytestmark = pytest.mark.django_db
# A hung learner group as a warm-forked one looks: no "train" in its command line, SIGTERM
# ignored, one child in the same group; both work in the run directory.
HUNG_GROUP = ("import os, signal, time\n"
              "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
              "os.fork()\n"
              "time.sleep(300)\n")


@pytest.fixture
def runs(settings, tmp_path):
    settings.THUNDERSYNC_RUN_DIR = str(tmp_path / "runs")
    settings.THUNDERSYNC_CANCEL_GRACE_S = 0.5
    return tmp_path / "runs"


def stale_run(experiment, preset, supervisor: str, settings, **fields) -> Run:
    run = make_run(experiment, preset, status=Run.Status.RUNNING, supervisor=supervisor,
                   heartbeat=timezone.now() - timedelta(seconds=settings.THUNDERSYNC_STALE_S + 5), **fields)
    run_dir(run.pk).mkdir(parents=True, exist_ok=True)
    return run


def test_a_supervisor_that_only_lost_the_database_keeps_its_run(runs, alice_experiment, sync_preset, settings):
    run = stale_run(alice_experiment, sync_preset, "other-node:12:34", settings)
    liveness.mark_alive(run.pk, "other-node:12:34")  # it still touches its run directory
    for _ in range(3):
        assert ownership.reap()[0] == 0
    assert Run.objects.get(pk=run.pk).status == "running"
    old = time.time() - settings.THUNDERSYNC_STALE_S - 1
    os.utime(run_dir(run.pk) / liveness.ALIVE_NAME, (old, old))  # now it stopped (SIGSTOP, a hang)
    ownership.reap()
    assert ownership.reap()[0] == 1
    assert Run.objects.get(pk=run.pk).status == "failed"


def test_a_file_left_by_another_supervisor_proves_nothing(runs, alice_experiment, sync_preset, settings):
    run = stale_run(alice_experiment, sync_preset, "other-node:12:34", settings)
    liveness.mark_alive(run.pk, "other-node:99:1")  # an earlier attempt's supervisor
    ownership.reap()
    assert ownership.reap()[0] == 1


def start_group(cwd) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HUNG_GROUP], cwd=cwd, start_new_session=True)
    threading.Thread(target=proc.wait, daemon=True).start()  # reaped as soon as it dies
    deadline = time.monotonic() + 30
    while len(processes.group_members(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes.group_members(proc.pid)) == 2
    return proc


def test_the_reaper_kills_a_reaped_runs_whole_group_whatever_its_command_line(
        runs, alice_experiment, sync_preset, settings):
    run = stale_run(alice_experiment, sync_preset, dead_local_supervisor(), settings)
    group = start_group(run_dir(run.pk))
    Run.objects.filter(pk=run.pk).update(pids=[group.pid])
    assert b"train" not in open(f"/proc/{group.pid}/cmdline", "rb").read()
    assert ownership.reap()[0] == 1
    assert processes.group_members(group.pid) == []  # SIGTERM ignored, SIGKILL, checked gone


def test_a_reused_pid_outside_the_run_directory_is_left_alone(runs, alice_experiment, sync_preset, settings, tmp_path):
    run = stale_run(alice_experiment, sync_preset, dead_local_supervisor(), settings)
    bystander = start_group(tmp_path)  # some other program now holds the recorded pid
    Run.objects.filter(pk=run.pk).update(pids=[bystander.pid])
    try:
        assert ownership.reap()[0] == 1
        assert len(processes.group_members(bystander.pid)) == 2
    finally:
        os.killpg(bystander.pid, signal.SIGKILL)
