"""python-sandbox: real subprocesses under real limits (each test spawns a child)."""

from __future__ import annotations

import os
import socket
import time

import pytest

from learner.rollout import sandbox
from learner.rollout.sandbox import run_python


@pytest.fixture
def listening_port():
    """A real listening socket on loopback, so a refused connect means the sandbox, not an empty port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def no_bwrap(monkeypatch):
    """The confinement where bubblewrap cannot run (learner/rollout/sandbox_bwrap.py)."""
    monkeypatch.setattr(sandbox.sandbox_bwrap, "available", lambda: "bwrap is not installed")


@pytest.fixture
def no_network_namespace(monkeypatch, no_bwrap):
    def refuse() -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(sandbox, "_unshare_network", refuse)


def test_it_captures_prints_and_exit_code():
    result = run_python("import sys\nprint(6 * 7)\nprint('oops', file=sys.stderr)\nsys.exit(3)")
    assert result.stdout == "42\n"
    assert result.stderr == "oops\n"
    assert result.exit_code == 3
    assert not result.timed_out and result.killed_reason is None


def test_it_kills_an_infinite_loop_at_the_cpu_limit():
    result = run_python("while True:\n    pass", cpu_s=1, wall_s=10)
    assert result.timed_out
    assert result.killed_reason == "cpu_time"
    assert result.duration_s < 5


def test_it_kills_a_sleeper_at_the_wall_limit():
    result = run_python("import time\ntime.sleep(30)", wall_s=0.5)
    assert result.timed_out
    assert result.killed_reason == "wall_time"
    assert result.duration_s < 5


def test_it_refuses_a_1gb_allocation():
    result = run_python("x = bytearray(1 << 30)\nprint('allocated')", memory_mb=256)
    assert "allocated" not in result.stdout
    assert "MemoryError" in result.stderr
    assert result.exit_code != 0


def test_it_has_no_network_even_to_loopback(listening_port):
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {listening_port}), timeout=2)\nprint('connected')"
    result = run_python(code)
    assert result.network == "netns"  # we run as root here, so the namespace must apply
    assert "connected" not in result.stdout
    # bwrap's namespace has a loopback of its own, where nothing listens; the bare one has none
    assert ("Connection refused" if result.confinement == "bwrap" else "Network is unreachable") in result.stderr


def test_without_bwrap_the_network_namespace_still_applies(no_bwrap, listening_port):
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {listening_port}), timeout=2)\nprint('connected')"
    result = run_python(code)
    assert (result.confinement, result.network) == ("rlimits", "netns") and "Network is unreachable" in result.stderr


def test_it_falls_back_to_the_audit_hook_without_namespace_rights(no_network_namespace, listening_port):
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {listening_port}), timeout=2)\nprint('connected')"
    result = run_python(code)
    assert result.network == "audit-hook"
    assert "connected" not in result.stdout
    assert "network access is disabled" in result.stderr
    assert run_python("print('still runs')").stdout == "still runs\n"


def test_it_removes_its_working_directory():
    result = run_python("import os\nopen('scratch.txt', 'w').write('x')\nprint(os.getcwd())")
    workdir = result.stdout.strip()
    assert workdir.startswith("/") and "thundersync-sandbox-" in workdir
    assert not os.path.exists(workdir)


def test_it_scrubs_the_environment(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    result = run_python("import os\nprint(sorted(os.environ))")
    assert "SECRET_TOKEN" not in result.stdout
    pwd = ["PWD"] if result.confinement == "bwrap" else []  # bwrap sets the working directory's
    assert result.stdout.strip() == str(sorted(["HOME", "LANG", "PATH", "THUNDERSYNC_SANDBOX_CALL", "TMPDIR", *pwd]))


def test_it_truncates_a_flood_of_output():
    result = run_python("print('y' * 100000)", max_output=100)
    assert result.stdout.startswith("y" * 100)
    assert "[output truncated: 100001 bytes in all]" in result.stdout
    assert len(result.stdout) < 200


def test_it_rejects_nonpositive_limits():
    with pytest.raises(ValueError, match="cpu_s: must be positive"):
        run_python("print(1)", cpu_s=0)


def test_without_bwrap_it_kills_a_grandchild_that_left_with_setsid(no_bwrap, tmp_path):
    """(Under bwrap the call's pid namespace takes every process with it: test_sandbox_escape.py.)"""
    marker = tmp_path / "escaped.pid"
    code = (
        "import os, subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
        f"open({str(marker)!r}, 'w').write(str(child.pid))\n"
        "print('spawned')\n"
    )
    result = run_python(code, wall_s=20)
    assert result.stdout.strip() == "spawned", result.stderr
    pid = int(marker.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break  # killed, waiting for init to reap it
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"the setsid() grandchild {pid} is still alive")
