"""A supervisor's liveness told through its run directory, not through the database.

Every THUNDERSYNC_HEARTBEAT_S the supervisor touches ``supervisor.alive`` in the run's
directory (its identity, ``host:pid:start-time``, is the file's text), whether or not the
database answers. A reaper that finds the run's database heartbeat stale leaves the run alone
while that file is fresh (younger than THUNDERSYNC_STALE_S) and names the run's supervisor: a
supervisor cut off from the database keeps its run. One that is stopped (SIGSTOP) or hangs
stops touching it and is reaped. The run directory is shared by every process that reaps
(docker-compose: the ``runs`` volume), so this holds across hosts too.
"""

from __future__ import annotations

import os
import time

from django.conf import settings

from controller.supervision.runlog import run_dir

ALIVE_NAME = "supervisor.alive"


def mark_alive(run_id: int, supervisor: str) -> None:
    """Called by the supervisor; a failure to write (a full disk) only costs this proof."""
    path = run_dir(run_id) / ALIVE_NAME
    try:
        if path.read_text() != supervisor:
            path.write_text(supervisor)
        os.utime(path)
    except FileNotFoundError:
        try:
            path.write_text(supervisor)
        except OSError:
            pass
    except OSError:
        pass


def alive(run_id: int, supervisor: str) -> bool:
    """The run's supervisor ``supervisor`` touched its file within THUNDERSYNC_STALE_S."""
    path = run_dir(run_id) / ALIVE_NAME
    try:
        age = time.time() - path.stat().st_mtime
        return bool(supervisor) and path.read_text() == supervisor and age <= settings.THUNDERSYNC_STALE_S
    except OSError:
        return False
