"""The app's own per-run threads run at a lower CPU priority than the run they serve.

A ``streaming`` run keeps both cores of a small machine busy (its learner overlaps its
rollout), so whatever CPU the app spends while it trains (reading and decoding the learner's
events, the live publisher) competes with the run's critical path; in ``sync`` one core idles
at any time and the same work goes unnoticed (docs/bench.md "App vs CLI"). A raised nice value
lets that work take idle time first.

On Linux the nice value is per thread, so only threads that start no process are lowered:
a process inherits the nice value of the thread that starts it, and an unprivileged process
cannot raise it back (RLIMIT_NICE), so a learner started cold by a lowered thread would train
at the app's priority. The supervisor's own loop, which starts the learner, keeps its priority.
"""

from __future__ import annotations

import logging
import os
import threading

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
