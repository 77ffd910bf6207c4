"""Processes a run starts get the worker's environment without its secrets
(controller/supervision/child_env.py): the learner (cold or from the warm runner) and the runner itself."""

import sys
import time
from pathlib import Path

import pytest

from controller.supervision import warm
from controller.supervision.child_env import is_secret, run_environment
from controller.supervision.supervisor import LearnerProcess

SECRETS = {"DJANGO_SECRET_KEY": "k-123", "DATABASE_URL": "postgres://app:pw@db/app", "REDIS_URL": "redis://r:6379/0",
           "PGPASSWORD": "pw", "CELERY_BROKER_URL": "redis://r", "AWS_SECRET_ACCESS_KEY": "a", "HF_TOKEN": "t"}


@pytest.fixture
def secrets_in_environment(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)


def test_the_secret_names_are_recognised_and_the_rest_kept():
    assert all(is_secret(name) for name in SECRETS)
    kept = run_environment({"THUNDERSYNC_RANK_KEY": "ab"}, base={**SECRETS, "PATH": "/usr/bin", "HOME": "/h",
                                                                  "THUNDERSYNC_RUN_DIR": "/runs"})
    assert kept == {"PATH": "/usr/bin", "HOME": "/h", "THUNDERSYNC_RUN_DIR": "/runs", "PYTHONUNBUFFERED": "1",
                    "THUNDERSYNC_RANK_KEY": "ab"}


def test_a_learner_process_sees_no_secret(secrets_in_environment, settings, tmp_path):
    settings.THUNDERSYNC_WARM_RUNNER = False
    code = "import os; print(' '.join(sorted(os.environ)))"
    child = LearnerProcess([sys.executable, "-c", code], tmp_path, stderr_lines=10, env={"THUNDERSYNC_RANK_KEY": "ab"})
    line = child.next_line(timeout=30)
    child.proc.wait(30)
    names = line.split()
    assert "PATH" in names and "THUNDERSYNC_RANK_KEY" in names
    assert not set(SECRETS) & set(names)


def test_the_warm_runner_a_run_forks_from_has_no_secret(secrets_in_environment, settings, tmp_path):
    settings.THUNDERSYNC_WARM_RUNNER, settings.THUNDERSYNC_RUN_DIR = True, tmp_path
    proc = warm.start()
    try:
        deadline = time.monotonic() + 30
        while b"learner.warm.server" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():  # exec'd
            assert time.monotonic() < deadline, "the warm runner did not start"
            time.sleep(0.02)
        environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
    finally:
        warm.stop()
    names = {entry.split(b"=", 1)[0].decode() for entry in environ if entry}
    assert "PATH" in names and not set(SECRETS) & names
