"""python-sandbox: real subprocesses under real limits (each test spawns a child)."""

from __future__ import annotations

import socket
import tempfile
import uuid
from pathlib import Path

import pytest

from learner.tasks.sandbox import run_python


@pytest.fixture
def listening_port():
    """A real listening socket on loopback, so a refused connect means the sandbox, not an empty port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    yield server.getsockname()[1]
    server.close()


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
    assert (result.confinement, result.network) == ("bwrap", "netns")
    assert "connected" not in result.stdout
    assert "Connection refused" in result.stderr  # its namespace's own loopback, where nothing listens


def test_its_working_directory_lives_and_dies_in_its_own_tmp():
    name = f"scratch-{uuid.uuid4().hex}.txt"
    result = run_python(f"import os\nopen({name!r}, 'w').write('x')\nprint(os.getcwd(), sorted(os.listdir('.')))")
    assert result.stdout.strip() == f"/tmp/work {sorted(['main.py', name])}", result.stderr
    assert not list(Path(tempfile.gettempdir()).rglob(name))  # never on the host's disk


def test_it_scrubs_the_environment(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    result = run_python("import os\nprint(sorted(os.environ))")
    assert "SECRET_TOKEN" not in result.stdout
    assert result.stdout.strip() == str(sorted(["HOME", "LANG", "PATH", "PWD", "THUNDERSYNC_SANDBOX_CALL", "TMPDIR"]))


def test_it_truncates_a_flood_of_output():
    result = run_python("print('y' * 100000)", max_output=100)
    assert result.stdout.startswith("y" * 100)
    assert "[output truncated: 100001 bytes in all]" in result.stdout
    assert len(result.stdout) < 200


def test_it_rejects_nonpositive_limits():
    with pytest.raises(ValueError, match="cpu_s: must be positive"):
        run_python("print(1)", cpu_s=0)
