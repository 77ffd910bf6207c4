"""Whether the workers can confine the ``python-sandbox`` tool, so a launch that needs it is
refused at once where none can (docs/tasks.md, "The sandbox's boundary").

The tool runs only under bubblewrap (``learner/tasks/sandbox_bwrap.py``); whether that works
is a property of the worker's host (bwrap installed, namespaces allowed: a container's seccomp
and AppArmor profiles decide), not of the web server's, and the two may be different hosts.
Every worker probes once when it starts (``report``: the Celery ``worker_ready`` signal, the
embedded worker's start) and stores the outcome under its host name in the shared cache
(Redis in production). ``launch_refusal`` refuses a run whose task calls the tool when every
worker that reported for the run's node cannot confine it. With no report (a cache not shared
with the workers, no worker started yet) the launch goes through, and the run's own start
refuses it (``learner/preflight.py``: the run fails with that one line): never a run without
confinement either way.
"""

from __future__ import annotations

import logging
import socket
import time

from django.conf import settings
from django.core.cache import cache

from learner.config import ConfigError
from learner.tasks import sandbox_bwrap

log = logging.getLogger(__name__)
KEY = "thundersync:sandbox-confinement"  # {host: {"node", "problem", "at"}}


class SandboxRefused(ConfigError):
    """No worker can confine the python-sandbox tool this run's task calls."""


def report(host: str | None = None) -> str | None:
    """Probe bwrap on this worker's host and store the outcome; returns the problem (None: it works).
    A worker that cannot confine says so loudly in its log."""
    host = host or socket.gethostname()
    probe = sandbox_bwrap.probe()
    if probe.problem is None:
        log.info("python-sandbox: bwrap confines tool calls on %s (%s /proc; probe %.0f ms)", host,
                 "a fresh" if probe.fresh_proc else "no", probe.seconds * 1000)
    else:
        log.error("python-sandbox: tool calls CANNOT be confined on %s, so runs whose task calls the tool are "
                  "refused: %s", host, probe.problem)
    try:
        reports = cache.get(KEY) or {}
        reports[host] = {"node": settings.THUNDERSYNC_NODE, "problem": probe.problem, "at": time.time()}
        cache.set(KEY, reports, timeout=None)
    except Exception as err:  # the cache is down: the runs' own start still checks
        log.warning("python-sandbox: could not record this worker's confinement: %s", err)
    return probe.problem


def launch_refusal(config: dict, node: str | None = None) -> SandboxRefused | None:
    """The refusal of a launch (``config``: the full run config as JSON) whose task calls the tool
    when every worker of ``node`` (any node when None) that reported cannot confine it; None
    otherwise (or when none reported)."""
    task = config["task"]
    field = sandbox_bwrap.needed_by(task["name"], task.get("tools") or [])
    if field is None:
        return None
    try:
        reports = cache.get(KEY) or {}
    except Exception:  # the cache is down: the run's start decides
        return None
    known = {host: r for host, r in reports.items() if node is None or r.get("node") == node}
    if not known or any(r.get("problem") is None for r in known.values()):
        return None
    host, newest = max(known.items(), key=lambda item: item[1].get("at", 0))
    return SandboxRefused(sandbox_bwrap.refused(field, task["name"], f"no worker can confine it "
                                                                     f"({host}: {newest['problem']})"))
