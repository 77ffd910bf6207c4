"""SIGTERM and SIGINT stop a run at a safe point, never in the middle of an update.

``install`` makes both signals only *request* a stop; the driver notices the request at the
next step boundary (``check`` at the top of each step of ``learner.driver.loop``) or earlier
where it waits for the rollout fleet (``check``, called by ``learner.rollout.processes.fleet.Fleet`` while
it waits for a message, never while replicas load weights), which is between two learner
phases, and raises ``Interrupted`` there. (The fleet's check alone was not enough: a streaming
run whose messages are always queued never waits, and a cancel took effect ~10 steps later.) The CLI then stops the workers, writes the
checkpoint it is configured to, emits the terminal event and exits 128 + the signal number
(143 for SIGTERM, 130 for SIGINT). A second signal stops at once.

Semaphores: ``multiprocessing`` names its POSIX semaphores ``/dev/shm/sem.mp-<random>``,
and a process group killed with SIGKILL (resource tracker included) leaves them behind.
``tag_semaphores`` puts this process's pid into the names (``sem.mp-ts<pid>-...``) so that
whoever outlives the group (the supervisor, the next ``thundersync train``) can remove the
ones whose owner is dead: ``sweep_semaphores``. ``start_janitor`` forks a watcher in a session
of its own (outside the group, so a ``kill -9 -PGID`` misses it) that sweeps them as soon as
the group is gone: /dev/shm is clean after every exit path, not only after the next run.

Exit: ``exit_within`` bounds what runs after ``main`` returns. The interpreter's exit functions
include multiprocessing's, which join each queue's feeder thread with no timeout; a learner
whose supervisor was SIGKILLed was once seen parked there for half an hour, its run long
marked ended. Past ``EXIT_DEADLINE_S`` the process ends with its own exit code anyway (the
janitor still sweeps what it leaves).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

SHM = Path("/dev/shm")
EXIT_DEADLINE_S = 30.0  # the interpreter's exit functions take well under a second when nothing hangs
_TAGGED = re.compile(r"^sem\.mp-ts(\d+)-")
_requested: list[int] = []


class Interrupted(Exception):
    """The run was asked to stop by ``signum``."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_code = 128 + signum


def _on_signal(signum, _frame) -> None:
    if _requested:  # asked twice: do not wait for a safe point
        raise Interrupted(signum)
    _requested.append(signum)


def install() -> None:
    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)


def requested() -> int | None:
    return _requested[0] if _requested else None


def check() -> None:
    """At a safe point: raise ``Interrupted`` if a stop was requested."""
    if _requested:
        raise Interrupted(_requested[0])


def tag_semaphores() -> None:
    multiprocessing.current_process()._config["semprefix"] = f"/mp-ts{os.getpid()}"


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_semaphores(pids: set[int] | None = None) -> list[str]:
    """Remove tagged semaphores of ``pids`` (default: of every dead process); their names."""
    removed = []
    try:
        entries = list(SHM.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TAGGED.match(entry.name)
        if not match:
            continue
        pid = int(match.group(1))
        if (pid in pids) if pids is not None else not pid_alive(pid):
            try:
                entry.unlink()
                removed.append(entry.name)
            except OSError:
                pass
    return removed


JANITOR_GROUP_WAIT_S = 30.0  # how long the group's last members may outlive its leader


def start_janitor() -> int:
    """Fork the watcher described in the module doc; returns its pid (0 in the watcher, which
    never returns). Call it early, while this process has one thread."""
    leader = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        _janitor(leader)
    finally:
        os._exit(0)


def _janitor(leader: int) -> None:
    os.setsid()  # its own session and group: a signal to the run's group misses it
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)  # never keep the run's stdout pipe open (its reader waits for EOF)
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    while os.getppid() == leader:  # the leader's death reparents this process
        time.sleep(0.5)
    deadline = time.monotonic() + JANITOR_GROUP_WAIT_S
    while time.monotonic() < deadline:
        try:
            os.killpg(leader, 0)  # rollout workers and the resource tracker of the group
        except ProcessLookupError:
            break
        time.sleep(0.2)
    sweep_semaphores()


def exit_within(code: int, seconds: float | None = None) -> None:
    """From now on the process ends within ``seconds`` (``EXIT_DEADLINE_S``), with ``code``: a
    daemon thread (it keeps running while the exit functions do) ends it if the interpreter's
    own exit has not."""
    seconds = EXIT_DEADLINE_S if seconds is None else seconds

    def deadline() -> None:
        time.sleep(seconds)
        try:
            print(f"thundersync: exit still unfinished after {seconds:g}s (an exit function hangs); "
                  f"exiting {code}", file=sys.stderr, flush=True)
        finally:
            os._exit(code)

    threading.Thread(target=deadline, name="exit-deadline", daemon=True).start()
