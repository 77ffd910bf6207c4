"""This worker's warm runner (learner/warm/server.py, docs/processes.md "Warm runner").

Started with the Celery worker (``celery worker``: the ``worker_ready`` signal; the embedded
default's worker thread: ``EmbeddedWorker.start``) when ``THUNDERSYNC_WARM_RUNNER`` is on, stopped
with it. The supervisor asks ``spawn`` for each run: a ``WarmProcess`` forked by the runner, or
None, and then it starts ``thundersync`` cold as before (the runner is off, still importing past
``THUNDERSYNC_WARM_WAIT_S``, gone, or the learner command is not the default one).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from django.conf import settings

from learner.warm.client import WarmProcess

from controller.supervision.child_env import run_environment
from controller.supervision.processes import die_with_parent

log = logging.getLogger(__name__)
_runner: dict[str, subprocess.Popen] = {}


def socket_path(pid: int) -> Path:
    """The runner socket of the worker process ``pid`` (a prefork pool child finds its parent's)."""
    return Path(tempfile.gettempdir()) / f"thundersync-warm-{os.getuid()}-{pid}.sock"


def start() -> subprocess.Popen | None:
    """Start this process's warm runner (once); it imports in the background."""
    if not settings.THUNDERSYNC_WARM_RUNNER or "proc" in _runner:
        return _runner.get("proc")
    path = socket_path(os.getpid())
    path.unlink(missing_ok=True)
    log_path = Path(settings.THUNDERSYNC_RUN_DIR) / "warm-runner.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as out:
        _runner["proc"] = subprocess.Popen(
            [sys.executable, "-m", "learner.warm.server", "--socket", str(path)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=die_with_parent, env=run_environment(),  # a run forks from it: no secrets
        )
    log.info("warm runner starting (pid %s, socket %s)", _runner["proc"].pid, path)
    return _runner["proc"]


def stop(timeout: float = 10.0) -> None:
    """SIGTERM the runner (it stops its runs, if any are left) and wait; SIGKILL past ``timeout``."""
    proc = _runner.pop("proc", None)
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)
    socket_path(os.getpid()).unlink(missing_ok=True)


def _ready_socket() -> Path | None:
    """This process's runner socket once it is warm (waiting for it while it imports), else the
    parent's (prefork pool children), else None."""
    proc = _runner.get("proc")
    own = socket_path(os.getpid())
    deadline = time.monotonic() + settings.THUNDERSYNC_WARM_WAIT_S
    while proc is not None and proc.poll() is None and not own.exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # it imports already: waiting beats a cold start
    for path in (own, socket_path(os.getppid())):
        if path.exists():
            return path
    return None


def spawn(command: list[str], cwd: Path, env: dict[str, str]) -> WarmProcess | None:
    """The run forked by the warm runner, or None (start it cold)."""
    prefix = settings.DEFAULT_LEARNER_COMMAND
    if not settings.THUNDERSYNC_WARM_RUNNER or command[:len(prefix)] != prefix:
        return None
    path = _ready_socket()
    if path is None:
        return None
    try:
        return WarmProcess(path, command[len(prefix):], cwd, env)
    except OSError as err:
        log.warning("the warm runner at %s did not start the run (%s); starting it cold", path, err)
        return None
