"""The confinement of a ``python-sandbox`` call under bubblewrap (``bwrap``, Debian's
``bubblewrap`` package; docs/tasks.md, "The sandbox's boundary").

Each call runs in namespaces of its own: mount (it sees ``/usr``, the interpreter's own
prefix and ``/etc/ld.so.cache`` read-only, a fresh ``/dev`` and ``/proc``, an empty
private ``/tmp`` and its working directory, the only place it can write: no project code,
no run directories, no home directories), PID (``/proc`` shows only the call's own
processes: no parent's environment to read), network (only its own loopback), IPC and UTS.
Its environment is only what the caller passes. When this process is root, the call runs as
an unprivileged user id of its own (``setpriv``, no capabilities, ``no_new_privs``): the
process-count limit (``RLIMIT_NPROC``, counted per user id) then holds, which it cannot for
root, so a fork bomb stops at ``MAX_PROCESSES``. The pid namespace dies with its first
process, so killing ``bwrap`` kills every process the call started, ``setsid()`` or not.

``available()`` runs bwrap once with the same flags; where it cannot work (not installed,
or namespaces refused) the caller falls back to rlimits and a network namespace only, and
says so in ``SandboxResult.confinement``.
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BWRAP = shutil.which("bwrap")
SETPRIV = shutil.which("setpriv")
# Unprivileged user ids, one per call (RLIMIT_NPROC counts per user id: concurrent calls do not
# share one budget); far above any account's id.
UID_BASE, UID_SPAN = 1_900_000_000, 100_000_000
INSIDE_TMP = "/tmp"


def call_uid() -> int | None:
    """The user id a call runs as: a fresh one when we are root (and can switch), else ours."""
    if os.geteuid() != 0 or SETPRIV is None:
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


def command(argv: list[str], workdir: str, env: dict[str, str], uid: int | None) -> list[str]:
    """The bwrap command line running ``argv`` in ``workdir`` (bound read-write at the same
    path under the private ``/tmp``) with exactly ``env``."""
    inside = os.path.join(INSIDE_TMP, os.path.basename(workdir))
    args = [BWRAP, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv", *_view(),
            "--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", INSIDE_TMP, "--bind", workdir, inside, "--chdir", inside]
    for name, value in env.items():
        args += ["--setenv", name, value.replace(workdir, inside)]
    if uid is None:
        if os.geteuid() != 0:  # an unprivileged caller gets its namespaces through a user namespace
            args.insert(1, "--unshare-user")
        return [*args, "--", *argv]
    return [*args, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--",
            SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs", "--", *argv]


@functools.cache
def available() -> str | None:
    """None when a call can run under bwrap here; else why not (one line). Probed once per
    process, with the flags a call uses."""
    if BWRAP is None:
        return "bwrap is not installed (Debian: apt-get install bubblewrap)"
    workdir = tempfile.mkdtemp(prefix="thundersync-sandbox-probe-")
    try:
        os.chmod(workdir, 0o755)
        probe = command([interpreter(), "-I", "-S", "-c", "pass"], workdir, {}, call_uid())
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"bwrap failed: {err}"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if done.returncode != 0:
        return f"bwrap failed: {(done.stderr.strip().splitlines() or ['exit ' + str(done.returncode)])[-1]}"
    return None
