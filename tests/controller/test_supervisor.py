"""Process-group handling of the supervisor with small shell process trees standing in for
misbehaving learners (the real learner is exercised in test_run_end_to_end.py)."""

import json
import os
import time

import pytest

from controller.models import Run
from controller.supervision.supervisor import supervise

from .conftest import make_run

pytestmark = pytest.mark.django_db

STARTED = json.dumps({"type": "run", "status": "started", "config": {}, "t": 0.0})
FINISHED = json.dumps({"type": "run", "status": "finished", "summary": {"wall_s": 0.1}})


@pytest.fixture
def shell_learner(settings, tmp_path):
    """Use ``sh -c SCRIPT`` as the learner; the train arguments become $1.. of the script."""
    settings.THUNDERSYNC_RUN_DIR = tmp_path

    def use(script: str):
        settings.THUNDERSYNC_LEARNER_COMMAND = ["sh", "-c", script, "learner"]

    return use


def group_is_gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_orphans_holding_stdout_do_not_keep_a_finished_run_open(shell_learner, alice_experiment, sync_preset):
    # The "learner" reports the end and exits, leaving a child that holds its stdout open.
    shell_learner(f"sleep 300 & echo '{FINISHED}'")
    run = make_run(alice_experiment, sync_preset, status=Run.Status.STARTING)
    started = time.monotonic()
    finished = supervise(run)
    assert finished.status == "succeeded", finished.error
    assert time.monotonic() - started < 30
    assert group_is_gone(finished.pids[0])


def test_a_learner_ignoring_sigterm_is_killed_after_the_grace_period(
    shell_learner, settings, alice_experiment, sync_preset
):
    settings.THUNDERSYNC_CANCEL_GRACE_S = 1.0
    shell_learner(f"trap '' TERM; echo '{STARTED}'; sleep 300 & wait")
    run = make_run(alice_experiment, sync_preset, status=Run.Status.STARTING, cancel_requested=True)
    started = time.monotonic()
    finished = supervise(run)
    assert finished.status == "cancelled"
    assert 1.0 <= time.monotonic() - started < 30
    assert group_is_gone(finished.pids[0])


def test_exit_without_an_end_event_fails_with_the_stderr_tail(shell_learner, alice_experiment, sync_preset):
    shell_learner(f"echo '{STARTED}'; echo 'not an event'; echo 'Traceback: boom' >&2; exit 3")
    run = make_run(alice_experiment, sync_preset, status=Run.Status.STARTING)
    finished = supervise(run)
    assert finished.status == "failed"
    assert finished.error.splitlines()[0] == "the learner exited with code 3"
    assert "1 malformed event line(s)" in finished.error
    assert finished.error.endswith("last stderr lines:\nTraceback: boom")


def test_the_learner_gets_the_merged_config_file(shell_learner, alice_experiment, sync_preset, tmp_path):
    # The script checks its own arguments: train --config <run dir>/config.yaml --events -
    shell_learner(f'[ "$1 $2 $4 $5" = "train --config --events -" ] && grep -q "schedule: sync" "$3" '
                  f"&& echo '{FINISHED}'")
    run = make_run(alice_experiment, sync_preset, status=Run.Status.STARTING)
    assert supervise(run).status == "succeeded"
    assert (tmp_path / f"run-{run.pk}" / "config.yaml").exists()


def test_log_lines_go_live_numbered_as_in_the_file_and_the_error_says_it_once(
    shell_learner, alice_experiment, sync_preset, tmp_path, monkeypatch
):
    frames = []
    monkeypatch.setattr("controller.ingest.ingestion.live.publish", lambda run_id, frame: frames.append(frame))
    failed = json.dumps({"type": "run", "status": "failed", "error": "RuntimeError: boom"})
    shell_learner(f"echo 'boot: starting 1 rollout worker(s)' >&2; echo '{STARTED}'; echo '{failed}'; "
                  "printf 'Traceback (most recent call last):\\nRuntimeError: boom\\n' >&2; exit 1")
    run = make_run(alice_experiment, sync_preset, status=Run.Status.STARTING)
    finished = supervise(run)
    assert finished.status == "failed"
    assert finished.error == ("RuntimeError: boom\nlast stderr lines:\n"
                              "boot: starting 1 rollout worker(s)\nTraceback (most recent call last):")
    logged = {}
    for frame in frames:
        if frame["type"] == "log":
            logged.update({frame["first"] + i: line for i, line in enumerate(frame["lines"])})
    file_lines = (tmp_path / f"run-{run.pk}" / "learner.stderr.log").read_text().splitlines()
    assert [logged[i] for i in sorted(logged)] == file_lines and sorted(logged) == list(range(3))


SYSTEM = json.dumps({"type": "system", "t": 0.0, "node": "local", "values": {"system/learner/rss_mb": 100.0}})


def span(seq: int) -> str:
    return json.dumps({"type": "span", "seq": seq, "step": 0, "kind": "generate", "t0": 0.0, "t1": 0.1,
                       "lane": "worker-0"})


def test_the_watchdog_counts_progress_not_system_samples(shell_learner, settings, alice_experiment, sync_preset):
    # A learner stuck generating its task (a costly generator) still sends a system sample every 0.1 s:
    # they say it is alive, not that it gets anything done, so the watchdog stops it.
    settings.THUNDERSYNC_PROGRESS_TIMEOUT_S = 2.0
    settings.THUNDERSYNC_CANCEL_GRACE_S = 1.0
    shell_learner(f"echo '{STARTED}'; while true; do echo '{SYSTEM}'; sleep 0.1; done")
    run = make_run(alice_experiment, sync_preset, status=Run.Status.STARTING)
    started = time.monotonic()
    finished = supervise(run)
    assert finished.status == "failed"
    assert finished.error.startswith("no progress from the learner for 2s: no span, trajectory or step finished, "
                                     "only system samples"), finished.error
    assert 2.0 <= time.monotonic() - started < 30
    assert group_is_gone(finished.pids[0])


def test_a_learner_that_keeps_finishing_work_is_not_stopped(shell_learner, settings, alice_experiment, sync_preset):
    # spans arrive every 0.5 s for 4 s, longer than the 2 s timeout in all: progress, not a hang
    settings.THUNDERSYNC_PROGRESS_TIMEOUT_S = 2.0
    work = "".join(f"echo '{span(seq)}'; echo '{SYSTEM}'; sleep 0.5; " for seq in range(8))
    shell_learner(f"echo '{STARTED}'; {work}echo '{FINISHED}'")
    run = make_run(alice_experiment, sync_preset, status=Run.Status.STARTING)
    assert supervise(run).status == "succeeded"
