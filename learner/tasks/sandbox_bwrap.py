"""The confinement of a ``python-sandbox`` call under bubblewrap (``bwrap``, Debian's
``bubblewrap`` package; docs/tasks.md, "The sandbox's boundary"). There is no other
confinement: where bwrap cannot run, the tool refuses to run (fail closed).

Each call runs in namespaces of its own: mount (it sees ``/usr``, the interpreter's own
prefix and ``/etc/ld.so.cache`` read-only, a fresh ``/dev``, a private ``/tmp`` that is a
tmpfs of ``TMP_MB`` and holds its working directory, the only place it can write: no project
code, no run directories, no home directories, no ``/run`` or ``/var/run``, hence no Unix
socket of the host such as PostgreSQL's), PID (a fresh ``/proc`` shows only the call's own
processes: no parent's environment to read; where the kernel refuses a fresh ``/proc``, as in
a container whose ``/proc`` has masked paths, there is no ``/proc`` at all), network (only its
own loopback), IPC and UTS. Its environment is only what the caller passes. When this process
is root, the call runs as an unprivileged user id of its own (``setpriv``, no capabilities,
``no_new_privs``): the process-count limit (``RLIMIT_NPROC``, counted per user id) then
holds, which it cannot for root, so a fork bomb stops at ``MAX_PROCESSES``. The pid
namespace dies with its first process, so killing ``bwrap`` kills every process the call
started, ``setsid()`` or not.

``available()`` runs bwrap once per process with the flags a call uses (a trivial confined
``python -c pass``): None when it works, else why not, in one line. Which ``bwrap`` is
``$THUNDERSYNC_BWRAP`` if set (an operator's choice of binary, or a missing path in tests),
else the first on ``PATH``.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BWRAP_ENV = "THUNDERSYNC_BWRAP"
# Unprivileged user ids, one per call (RLIMIT_NPROC counts per user id: concurrent calls do not
# share one budget); far above any account's id.
UID_BASE, UID_SPAN = 1_900_000_000, 100_000_000
INSIDE_TMP = "/tmp"
WORKDIR = "/tmp/work"  # the call's working directory, inside its /tmp
TMP_MB = 64  # the call's /tmp (its working directory included): a tmpfs of this size


@dataclass(frozen=True)
class Probe:
    problem: str | None  # None: calls can run confined here
    bwrap: str | None
    fresh_proc: bool  # a fresh /proc in the call's pid namespace (else none at all)
    seconds: float  # what the probe cost


def bwrap_path() -> str | None:
    chosen = os.environ.get(BWRAP_ENV)
    if chosen is not None:
        return chosen if os.path.isfile(chosen) and os.access(chosen, os.X_OK) else None
    return shutil.which("bwrap")


def call_uid() -> int | None:
    """The user id a call runs as: a fresh one when we are root (and can switch), else ours."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        return None
    return UID_BASE + secrets.randbelow(UID_SPAN)


def interpreter() -> str:
    """The real interpreter (a virtualenv's ``python`` is a symlink to it); run with ``-I -S``
    it needs only its own prefix, not the virtualenv."""
    return os.path.realpath(sys.executable)


def _view() -> list[str]:
    """The read-only filesystem a call sees."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("bin", "lib", "lib64", "sbin"):
        path = f"/{top}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    args += [*_open_dirs("/etc/ld.so.cache"), "--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    prefix = os.path.realpath(sys.base_prefix)
    if not (prefix == "/usr" or prefix.startswith("/usr/")):
        args += [*_open_dirs(prefix), "--ro-bind", prefix, prefix]
    return args


def _open_dirs(path: str) -> list[str]:
    """Empty, traversable directories above ``path`` (bwrap makes missing ones 0700, which the
    call's own user id cannot enter: an interpreter under /root would not find its library)."""
    parents = [str(p) for p in reversed(Path(path).parents) if str(p) != "/"]
    return [arg for parent in parents for arg in ("--perms", "0755", "--dir", parent)]


def command(argv: list[str], env: dict[str, str], uid: int | None, *, bwrap: str, fresh_proc: bool = True,
            code_fd: int | None = None) -> list[str]:
    """The bwrap command line running ``argv`` in ``WORKDIR`` with exactly ``env``; with
    ``code_fd``, what bwrap reads from that inherited descriptor is ``WORKDIR/main.py`` (the
    program never passes through a host directory)."""
    args = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv", *_view(), *(["--proc", "/proc"] if fresh_proc else []),
            "--dev", "/dev", "--perms", "1777", "--size", str(TMP_MB * 2**20), "--tmpfs", INSIDE_TMP,
            "--perms", "0777", "--dir", WORKDIR]
    if code_fd is not None:
        args += ["--perms", "0444", "--file", str(code_fd), f"{WORKDIR}/main.py"]
    args += ["--chdir", WORKDIR]
    for name, value in env.items():
        args += ["--setenv", name, value]
    if uid is None:
        if os.geteuid() != 0:  # an unprivileged caller gets its namespaces through a user namespace
            args.insert(1, "--unshare-user")
        return [*args, "--", *argv]
    return [*args, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
            shutil.which("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--",
            *argv]


def _try(bwrap: str, fresh_proc: bool) -> str | None:
    """Why a trivial confined call fails with these flags, or None."""
    probe = command([interpreter(), "-I", "-S", "-c", "pass"], {}, call_uid(), bwrap=bwrap, fresh_proc=fresh_proc)
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
                              cwd=tempfile.gettempdir())
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bwrap failed: {err}"
    if done.returncode != 0:
        return f"bwrap failed: {(done.stderr.strip().splitlines() or ['exit ' + str(done.returncode)])[-1]}"
    return None


@functools.cache
def _probe(bwrap: str | None) -> Probe:
    start = time.monotonic()
    if bwrap is None:
        where = (f"${BWRAP_ENV}={os.environ[BWRAP_ENV]} is not an executable file" if BWRAP_ENV in os.environ
                 else "not on PATH")
        return Probe(f"bwrap is not installed ({where}; Debian: apt-get install bubblewrap)", None, False, 0.0)
    problem = _try(bwrap, fresh_proc=True)
    if problem is None:
        return Probe(None, bwrap, True, time.monotonic() - start)
    if _try(bwrap, fresh_proc=False) is None:  # e.g. Docker's masked /proc paths forbid a fresh proc mount
        return Probe(None, bwrap, False, time.monotonic() - start)
    return Probe(problem, bwrap, False, time.monotonic() - start)


def probe() -> Probe:
    """The probe of the bwrap in use now (once per process and binary)."""
    return _probe(bwrap_path())


def available() -> str | None:
    """None when a call can run confined under bwrap here; else why not (one line)."""
    return probe().problem


def needed_by(task_name: str, tools: list[str]) -> str | None:
    """The config field that makes a run call the sandbox (``task.name``, ``task.tools``), or None."""
    if task_name == "python-sandbox":
        return "task.name"
    if "python-sandbox" in tools:
        return "task.tools"
    return None


def refused(field: str, task_name: str, why: str) -> str:
    return (f"{field}: task {task_name} calls the python-sandbox tool, which runs policy-written code only under "
            f"bubblewrap, and {why}")


def refusal(task) -> str | None:
    """Why a run with this task (a ``TaskConfig``) cannot start here (one line naming the field), or None."""
    field = needed_by(task.name, task.tools)
    if field is None:
        return None
    problem = available()
    return None if problem is None else refused(field, task.name, f"bubblewrap cannot confine it on this host: {problem}")
