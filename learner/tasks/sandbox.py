"""``python-sandbox`` tool: run untrusted Python in a confined, resource-limited subprocess.

Every call runs under bubblewrap (``learner/tasks/sandbox_bwrap.py``): mount, PID, network,
IPC and UTS namespaces of its own: a read-only view of ``/usr`` and the interpreter's prefix
only, a private size-bounded ``/tmp`` holding its working directory, no other process visible,
only its own loopback, an unprivileged user id of its own when the worker is root. Where bwrap
cannot run (not installed, namespaces refused) a call raises ``SandboxUnavailable``: there is
no unconfined fallback, and a run that needs the tool is refused before it starts
(``learner/preflight.py``, ``controller/sandbox_hosts.py``).

Also (set in ``preexec_fn``, i.e. after fork, before exec, inherited by bwrap's children):
- an isolated interpreter, ``python -I -S`` (no user site, no PYTHON* variables, no
  ``site``), only the environment given here;
- rlimits: CPU seconds (SIGXCPU at ``cpu_s``, SIGKILL one second later), address space and
  data segment (``memory_mb``), file size, open files, no core dumps, and a process count
  (under bwrap as root the call runs as a user id of its own, so it holds there);
- its own session, so the whole process group is killed at the wall-clock limit and at exit;
  a descendant that left the group (``setsid()``) dies with the call's pid namespace, and is
  swept by a token in its inherited environment too (``_sweep``);
- stdout and stderr go to anonymous files (not pipes), so a flood of output cannot fill the
  parent's memory; each is truncated to ``max_output`` characters.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from typing import IO, Literal

from learner.tasks import sandbox_bwrap

PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)  # loaded before any fork: preexec_fn must not import
MAX_FILE_BYTES = 16 * 2**20
MAX_OPEN_FILES = 64
MAX_PROCESSES = 64
SANDBOX_TOKEN = "THUNDERSYNC_SANDBOX_CALL"  # in every sandbox process's environment: the sweep finds them by it


class SandboxUnavailable(RuntimeError):
    """bwrap cannot confine a call on this host; the call is not run."""


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int  # negative: killed by that signal
    timed_out: bool  # the wall-clock or CPU limit ended the run
    killed_reason: str | None  # "wall_time", "cpu_time", "signal:<NAME>" or None
    duration_s: float
    confinement: Literal["bwrap"] = "bwrap"  # the only one: no call runs unconfined
    network: Literal["netns"] = "netns"  # its own network namespace (bwrap --unshare-net)


def _limits(cpu_s: int, memory_mb: int):
    """The child-side setup; runs between fork and exec, so it only makes system calls."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        memory = memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (MAX_FILE_BYTES, MAX_FILE_BYTES))
        resource.setrlimit(resource.RLIMIT_NOFILE, (MAX_OPEN_FILES, MAX_OPEN_FILES))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (MAX_PROCESSES, MAX_PROCESSES))
        # its own session escapes the run's process-group kill: die with the thread that runs
        # the call instead (a rollout worker killed mid-call leaves no sandbox behind)
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return apply


def _read_truncated(handle: IO[bytes], max_output: int) -> str:
    handle.seek(0)
    data = handle.read(4 * max_output + 4).decode("utf-8", errors="replace")
    total = handle.seek(0, os.SEEK_END)
    if len(data) > max_output or total > 4 * max_output + 4:
        return data[:max_output] + f"\n[output truncated: {total} bytes in all]"
    return data


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # the group is already empty
        pass


def _sweep(token: str) -> int:
    """SIGKILL every process whose environment carries this call's token, wherever it is now:
    a child that left the sandbox's process group and session (``setsid()``) escapes the group
    kill, and once its parent is gone it is no longer anyone's descendant we could walk to,
    but it inherited the token. Repeats until none is left (a process forking while it is
    killed). Returns how many were killed."""
    needle, killed = f"{SANDBOX_TOKEN}={token}".encode(), 0
    for _ in range(50):
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if needle in fh.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:  # gone meanwhile, or not ours to read
                continue
        if not found:
            return killed
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                pass
        time.sleep(0.01)
    return killed


def _reason(returncode: int, wall_killed: bool, duration_s: float, cpu_s: int) -> str | None:
    if wall_killed:
        return "wall_time"
    if returncode == -signal.SIGXCPU:  # the soft CPU limit
        return "cpu_time"
    if returncode == -signal.SIGKILL and duration_s >= cpu_s:  # the hard one (CPU time <= wall time)
        return "cpu_time"
    if returncode < 0:
        return f"signal:{signal.Signals(-returncode).name}"
    return None


def run_python(
    code: str, *, cpu_s: int = 2, memory_mb: int = 256, wall_s: float = 5.0, max_output: int = 4096
) -> SandboxResult:
    """Run ``code`` as ``__main__`` in a confined child interpreter and collect its output.
    Raises ``SandboxUnavailable`` (and runs nothing) where bwrap cannot confine it."""
    for field, value in (("cpu_s", cpu_s), ("memory_mb", memory_mb), ("wall_s", wall_s), ("max_output", max_output)):
        if value <= 0:
            raise ValueError(f"{field}: must be positive, got {value}")
    probe = sandbox_bwrap.probe()
    if probe.problem is not None:
        raise SandboxUnavailable(f"python-sandbox: refusing to run unconfined: {probe.problem}")
    token = uuid.uuid4().hex
    inside = sandbox_bwrap.WORKDIR
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": inside, "TMPDIR": inside, SANDBOX_TOKEN: token}
    argv = [sandbox_bwrap.interpreter(), "-I", "-S", "main.py"]
    with tempfile.TemporaryFile() as src, tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        src.write(code.encode("utf-8", errors="surrogateescape"))
        src.seek(0)
        cmd = sandbox_bwrap.command(argv, env, sandbox_bwrap.call_uid(), bwrap=probe.bwrap,
                                    fresh_proc=probe.fresh_proc, code_fd=src.fileno())
        start = time.monotonic()
        proc = subprocess.Popen(
            cmd, cwd=tempfile.gettempdir(), env={}, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            start_new_session=True, pass_fds=(src.fileno(),), preexec_fn=_limits(cpu_s, memory_mb),
        )  # fmt: skip
        wall_killed = False
        try:
            proc.wait(timeout=wall_s)
        except subprocess.TimeoutExpired:
            wall_killed = True
            _kill_group(proc.pid)
            proc.wait()
        _kill_group(proc.pid)  # background children outlive their parent otherwise
        _sweep(token)  # ...and so do those that left the group with setsid()
        duration = time.monotonic() - start
        returncode = proc.returncode
        if 128 < returncode < 128 + signal.NSIG:  # bwrap: 128 + the signal
            returncode = 128 - returncode
        reason = _reason(returncode, wall_killed, duration, cpu_s)
        return SandboxResult(
            stdout=_read_truncated(out, max_output),
            stderr=_read_truncated(err, max_output),
            exit_code=returncode,
            timed_out=reason in ("wall_time", "cpu_time"),
            killed_reason=reason,
            duration_s=duration,
        )

