"""The python-sandbox's boundary (learner/rollout/sandbox_bwrap.py, docs/tasks.md): each
escape a hostile program tried is run for real under bubblewrap and must fail."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from learner.rollout import sandbox_bwrap
from learner.rollout.sandbox import MAX_PROCESSES, run_python

pytestmark = pytest.mark.skipif(sandbox_bwrap.available() is not None,
                                reason=f"no bubblewrap here: {sandbox_bwrap.available()}")
REPO_FILE = Path(__file__).resolve().parents[2] / "learner" / "config.py"


def confined(code: str, **limits):
    result = run_python(code, **limits)
    assert result.confinement == "bwrap"
    return result


def alive_with(marker: str) -> list[int]:
    """Host pids whose command line carries ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if marker.encode() in fh.read():
                    found.append(int(entry))
        except (OSError, ValueError):
            continue
    return found


def test_no_process_environment_holds_the_workers_secrets(monkeypatch):
    secret = f"sekrit-{uuid.uuid4().hex}"
    monkeypatch.setenv("DJANGO_SECRET_KEY", secret)
    monkeypatch.setenv("DATABASE_URL", f"postgres://app:{secret}@127.0.0.1/app")
    code = f"""
import os
print(sorted(os.environ.items()))
for pid in [os.getppid(), {os.getpid()}, {os.getppid()}] + [p for p in os.listdir('/proc') if p.isdigit()]:
    try:
        print(pid, open(f'/proc/{{pid}}/environ', 'rb').read())
    except OSError as err:
        print(pid, type(err).__name__)
print('pids seen', sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))
"""
    result = confined(code)
    assert result.exit_code == 0, result.stderr
    assert secret not in result.stdout + result.stderr and "DATABASE_URL" not in result.stdout
    seen = result.stdout.splitlines()[-1]
    assert seen in ("pids seen [1, 2]", "pids seen [1, 2, 3]"), seen  # its own pid namespace: bwrap's init, itself


def test_other_runs_files_and_the_project_are_not_there(tmp_path):
    other = tmp_path / "runs" / "run-7" / "output"
    other.mkdir(parents=True)
    (other / "model.safetensors").write_text(f"weights-{uuid.uuid4().hex}")
    code = f"""
import os, sys
for path in [{str(other / 'model.safetensors')!r}, {str(REPO_FILE)!r}, '/etc/passwd', '/work', '/home']:
    try:
        print(path, os.listdir(path) if os.path.isdir(path) else open(path).read()[:80])
    except OSError as err:
        print(path, type(err).__name__)
# every file it can see, but the system's programs and libraries, its interpreter and its own directory
needed = ('/usr', '/proc', '/dev', sys.base_prefix, os.getcwd())
for top, dirs, files in os.walk('/'):
    dirs[:] = [d for d in dirs if not os.path.join(top, d).startswith(needed)]
    for name in files:
        print('visible', os.path.join(top, name))
"""
    result = confined(code)
    lines = result.stdout.splitlines()
    assert len(lines) == 6 and all(line.endswith("FileNotFoundError") for line in lines[:5]), result.stdout
    assert lines[5:] == ["visible /etc/ld.so.cache"], result.stdout


def test_nothing_outside_its_own_directory_can_be_written(tmp_path):
    victim = tmp_path / "runs" / "run-7"
    victim.mkdir(parents=True)
    host_tmp = Path("/tmp") / f"thundersync-escape-{uuid.uuid4().hex}"
    code = f"""
for path in [{str(victim / 'pwned')!r}, '/usr/pwned', '/pwned', {str(host_tmp)!r}, 'mine.txt']:
    try:
        open(path, 'w').write('x')
        print(path, 'written')
    except OSError as err:
        print(path, type(err).__name__)
"""
    result = confined(code)
    assert result.stdout.splitlines() == [
        f"{victim / 'pwned'} FileNotFoundError", "/usr/pwned OSError", "/pwned PermissionError",
        f"{host_tmp} written", "mine.txt written"], result.stdout + result.stderr  # /tmp is its own
    assert not (victim / "pwned").exists() and not host_tmp.exists() and not Path("/usr/pwned").exists()


def test_a_fork_bomb_stops_at_the_process_limit_and_leaves_nothing_behind():
    marker = f"bomb-{uuid.uuid4().hex}"
    code = f"""
import os, subprocess, sys
n = 0
try:
    while True:
        subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}], start_new_session=True)
        n += 1
except OSError as err:
    print('stopped after', n, type(err).__name__, flush=True)
"""
    result = confined(code, wall_s=20, memory_mb=512)
    assert result.stdout.startswith("stopped after"), result.stdout + result.stderr
    assert 10 < int(result.stdout.split()[2]) < MAX_PROCESSES  # it did start processes, up to the limit
    assert alive_with(marker) == []  # its pid namespace died with it, setsid() or not


def test_no_network_to_this_host_or_beyond():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        code = f"""
import socket
for host, port in [('127.0.0.1', {server.getsockname()[1]}), ('127.0.0.1', 5432), ('127.0.0.1', 6379), ('1.1.1.1', 53)]:
    try:
        socket.create_connection((host, port), timeout=2)
        print(port, 'connected')
    except OSError as err:
        print(port, type(err).__name__)
"""
        result = confined(code)
    finally:
        server.close()
    assert len(result.stdout.splitlines()) == 4 and "connected" not in result.stdout, result.stdout + result.stderr


def test_it_runs_as_an_unprivileged_user_that_cannot_become_root():
    if os.geteuid() != 0:
        pytest.skip("the per-call user id is set when the worker runs as root")
    result = confined("import os\nprint(os.getresuid())\ntry:\n    os.setuid(0)\nexcept OSError as e:\n"
                      "    print(type(e).__name__)\n")
    ids, refused = result.stdout.splitlines()
    assert "0" not in ids.strip("()").replace(" ", "").split(",") and refused == "PermissionError"
