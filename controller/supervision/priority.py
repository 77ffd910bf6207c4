"""The app's own per-run threads run at a lower CPU priority than the run they serve.

A ``streaming`` run keeps both cores of a small machine busy (its learner overlaps its
rollout), so whatever CPU the app spends while it trains (reading and decoding the learner's
events, the live publisher) competes with the run's critical path; in ``sync`` one core idles
at any time and the same work goes unnoticed (docs/bench-web.md "App vs CLI"). A raised nice value
lets that work take idle time first.

Two levers, because Linux has two places a priority lives:
- the session's scheduler autogroup (``/proc/self/autogroup``, kernel.sched_autogroup_enabled):
  where it is on, the kernel first shares the CPU between sessions and only then by nice within
  one, so a per-thread nice alone cannot make the app yield to a run in another session (every
  run leads its own: the supervisor and the warm runner start it with setsid). The app's server
  processes (``manage.py demo``, ``celery worker``) lower their session's autogroup and restore it
  on exit; a new session (a run) starts at autogroup nice 0 whatever its parent's was.
- the per-thread nice (where autogroups are off: a container's cgroup, most servers). Only
  threads that start no process are lowered: a process inherits the nice of the thread that
  starts it and an unprivileged one cannot raise it back (RLIMIT_NICE), so a learner started
  cold by a lowered thread would train at the app's priority. The supervisor's loop, which
  starts the learner, keeps its priority.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Callable

from django.conf import settings

log = logging.getLogger(__name__)


def yield_to_runs() -> int | None:
    """Lower the calling thread to nice ``THUNDERSYNC_APP_NICE`` (never raise it); the value it
    now has, or None where the platform does not let it (left as it was)."""
    target = settings.THUNDERSYNC_APP_NICE
    try:
        tid = threading.get_native_id()
        if os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, target)
        return os.getpriority(os.PRIO_PROCESS, tid)
    except (AttributeError, OSError) as err:  # not Linux, or a sandbox that forbids it: same speed as before
        log.debug("cannot lower this thread's CPU priority: %s", err)
        return None


AUTOGROUP = Path("/proc/self/autogroup")  # "/autogroup-123 nice 0"


def lower_session() -> Callable[[], None]:
    """Lower this process's session autogroup to nice ``THUNDERSYNC_APP_NICE`` (never raise it);
    returns the call that restores what it was (a no-op where autogroups are off or absent)."""
    target = settings.THUNDERSYNC_APP_NICE
    try:
        before = int(AUTOGROUP.read_text().split()[-1])
        if before >= target:
            return lambda: None
        AUTOGROUP.write_text(str(target))
    except (OSError, ValueError, IndexError) as err:
        log.debug("cannot lower the process session's CPU priority: %s", err)
        return lambda: None

    def restore() -> None:
        try:
            AUTOGROUP.write_text(str(before))  # back to where it was: a terminal's later commands
        except OSError:
            pass

    return restore
