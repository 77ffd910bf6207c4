"""Processes of this host: who a process is (a run's supervisor), and stopping process groups.

A leaf module: the supervisor, the reaper, the warm runner and the ranks of a run that spans
nodes all use it, and it imports nothing of the controller.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import time
from pathlib import Path

HOST = socket.gethostname()
PR_SET_PDEATHSIG = 1
try:
    _LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: preexec_fn must not load it
except OSError:
    _LIBC = None


def process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot ('' if unknown): with the pid it
    names one process, even after the pid is reused (a restarted container starts at 1 again)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return ""
    return "" if fields[0] in ("Z", "X") else fields[19]  # a zombie has exited: not an owner


def proc_stats():
    """(pid, the fields of /proc/<pid>/stat after the command name) of every process now; one
    that exits while being read is left out."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue


def group_members(pgid: int) -> list[int]:
    """The live (not zombie) processes of process group ``pgid``, from /proc."""
    return [pid for pid, fields in proc_stats() if fields[0] not in ("Z", "X") and int(fields[2]) == pgid]


def works_in(pid: int, directory: Path) -> bool:
    """``pid``'s working directory is ``directory`` (symlinks resolved)."""
    try:
        return os.path.realpath(f"/proc/{pid}/cwd") == os.path.realpath(directory)
    except OSError:
        return False


def me() -> str:
    """This process as a run's supervisor: ``host:pid:start-time``."""
    return f"{HOST}:{os.getpid()}:{process_start(os.getpid())}"


def die_with_parent() -> None:
    """Child side, before exec (``preexec_fn``): SIGTERM when the thread that started it dies
    (a killed Celery worker), so a learner stops at a safe point instead of training for nobody."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def signal_group(pgid: int, sig: signal.Signals, wait_s: float) -> bool:
    """Signal the group and wait up to ``wait_s`` for it to empty; False once it is gone."""
    deadline = time.monotonic() + wait_s
    try:
        os.killpg(pgid, sig)
        while time.monotonic() < deadline:
            time.sleep(0.1)
            os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
