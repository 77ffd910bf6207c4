"""The python-sandbox's boundary (learner/tasks/sandbox_bwrap.py, docs/tasks.md): each
escape a hostile program tried is run for real under bubblewrap and must fail; without a
working bubblewrap none of them runs at all (the tool, the task and the trainer refuse)."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from learner.config import ConfigError, load_config
from learner.preflight import preflight
from learner.tasks import sandbox_bwrap
from learner.tasks.sandbox import MAX_PROCESSES, SandboxUnavailable, run_python
from learner.tasks.sandbox_task import sandbox_tool

if sandbox_bwrap.available() is not None:  # ./run test and ./run setup install bubblewrap
    pytest.fail(f"bubblewrap cannot confine the sandbox here: {sandbox_bwrap.available()}", pytrace=False)
REPO_FILE = Path(__file__).resolve().parents[2] / "learner" / "config.py"
PG_SOCKET = Path("/var/run/postgresql/.s.PGSQL.5432")


@pytest.fixture(params=["fresh-proc", "no-proc"])
def proc_mode(request, monkeypatch):
    """Both ways a call can be confined: a fresh /proc of its own pid namespace, or (where the
    kernel refuses one, as under Docker's masked /proc) no /proc at all."""
    if request.param == "no-proc":
        probe = dataclasses.replace(sandbox_bwrap.probe(), fresh_proc=False)
        monkeypatch.setattr(sandbox_bwrap, "probe", lambda: probe)
    return request.param


def confined(code: str, **limits):
    result = run_python(code, **limits)
    assert result.confinement == "bwrap"
    return result


@pytest.fixture
def secret_process():
    """A process of this host holding secrets in its environment (as daphne holds the web app's)."""
    secret = f"sekrit-{uuid.uuid4().hex}"
    env = {**os.environ, "DJANGO_SECRET_KEY": secret, "DATABASE_URL": f"postgres://app:{secret}@127.0.0.1/app"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    yield proc.pid, secret
    proc.kill()
    proc.wait()


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


def test_no_process_environment_holds_the_workers_secrets(monkeypatch, proc_mode):
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
    result = confined(code.replace("os.listdir('/proc')", "(os.listdir('/proc') if os.path.isdir('/proc') else [])"))
    assert result.exit_code == 0, result.stderr
    assert secret not in result.stdout + result.stderr and "DATABASE_URL" not in result.stdout
    seen = result.stdout.splitlines()[-1]
    if proc_mode == "fresh-proc":  # its own pid namespace: bwrap's init, itself
        assert seen in ("pids seen [1, 2]", "pids seen [1, 2, 3]"), seen
    else:
        assert seen == "pids seen []", seen


def test_another_processes_environ_is_out_of_reach(secret_process, proc_mode):
    pid, secret = secret_process
    assert secret.encode() in Path(f"/proc/{pid}/environ").read_bytes()  # there to read, outside
    code = f"""
import os
for path in ['/proc/{pid}/environ', '/proc/{pid}/cmdline', '/proc/1/environ']:
    try:
        print(path, open(path, 'rb').read())
    except OSError as err:
        print(path, type(err).__name__)
"""
    result = confined(code)
    assert secret not in result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"/proc/{pid}/environ FileNotFoundError" and lines[1].endswith("FileNotFoundError"), lines
    if proc_mode == "fresh-proc":  # pid 1 is bwrap's init, whose environment bwrap cleared
        assert secret not in lines[2] and "DJANGO" not in lines[2], lines[2]
    else:
        assert lines[2] == "/proc/1/environ FileNotFoundError", lines[2]


def test_a_0600_file_and_the_run_directories_are_not_there(tmp_path, proc_mode):
    secret = tmp_path / "settings.env"
    secret.write_text(f"DJANGO_SECRET_KEY={uuid.uuid4().hex}")
    secret.chmod(0o600)
    runs = tmp_path / "runs"
    for n in range(1, 6):
        (runs / f"run-{n}").mkdir(parents=True)
    code = f"""
import os
try:
    print(open({str(secret)!r}).read())
except OSError as err:
    print('secret', type(err).__name__)
for path in [{str(runs)!r}, {str(tmp_path)!r}, '/data/runs', '/home', '/var/lib']:
    try:
        print(path, os.listdir(path))
    except OSError as err:
        print(path, type(err).__name__)
"""
    result = confined(code)
    assert result.stdout.splitlines() == ["secret FileNotFoundError"] + [
        f"{path} FileNotFoundError" for path in (runs, tmp_path, "/data/runs", "/home", "/var/lib")], result.stdout


def test_other_runs_files_and_the_project_are_not_there(tmp_path, proc_mode):
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
needed = ('/usr', '/proc', '/dev', sys.base_prefix, os.getcwd(), '/tmp/work')
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


def test_no_unix_socket_of_the_host_postgresql_included(tmp_path):
    sock_dir = tmp_path / "sockets"
    sock_dir.mkdir()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_dir / ".s.PGSQL.5432"))
    server.listen(1)
    probes = [str(sock_dir / ".s.PGSQL.5432")] + ([str(PG_SOCKET)] if PG_SOCKET.exists() else [])
    try:
        for path in probes:  # reachable from outside: a refusal inside is the sandbox's
            with socket.socket(socket.AF_UNIX) as client:
                client.connect(path)
        code = f"""
import os, socket
for path in {probes!r} + ['/var/run/postgresql/.s.PGSQL.5432', '/run/postgresql/.s.PGSQL.5432']:
    try:
        socket.socket(socket.AF_UNIX).connect(path)
        print(path, 'connected')
    except OSError as err:
        print(path, type(err).__name__)
for path in ['/run', '/var/run', '/var']:
    print(path, os.path.exists(path))
print('/tmp', sorted(os.listdir('/tmp')))
"""
        result = confined(code)
    finally:
        server.close()
    lines = result.stdout.splitlines()
    assert "connected" not in result.stdout and all(line.endswith("FileNotFoundError") for line in lines[:-4]), lines
    assert lines[-4:] == ["/run False", "/var/run False", "/var False", "/tmp ['work']"], lines


def test_filling_tmp_stops_at_its_size():
    code = """
import os
written = 0
try:
    for i in range(10_000):
        with open(f'/tmp/fill-{i}', 'wb') as fh:
            fh.write(b'x' * (4 << 20))
        written += 4 << 20
except OSError as err:
    print(written >> 20, type(err).__name__, err.errno)
"""
    result = confined(code, wall_s=20)
    mib, kind, errno = result.stdout.split()
    assert (kind, errno) == ("OSError", "28") and int(mib) <= sandbox_bwrap.TMP_MB, result.stdout + result.stderr


def test_allocating_past_the_memory_limit_fails():
    code = """
chunks = []
try:
    while True:
        chunks.append(bytearray(16 << 20))
except MemoryError:
    print('stopped at', 16 * len(chunks))
"""
    result = confined(code, memory_mb=128)
    assert result.stdout.startswith("stopped at"), result.stdout + result.stderr
    assert int(result.stdout.split()[2]) < 128


ESCAPES = {  # each writes MARKER if it runs at all
    "read a process's environ": "open('/proc/1/environ', 'rb').read()",
    "read a 0600 file": "open('/etc/shadow').read()",
    "list the run directories": "import os; os.listdir('/tmp')",
    "write outside its directory": "open('/tmp/escaped', 'w').write('x')",
    "connect to PostgreSQL's socket": "import socket; socket.socket(socket.AF_UNIX).connect('/var/run/postgresql/.s.PGSQL.5432')",
    "fill /tmp": "open('/tmp/fill', 'wb').write(b'x' * (1 << 20))",
    "allocate memory": "bytearray(1 << 30)",
}


@pytest.fixture(params=["missing", "refused"])
def no_confinement(request, monkeypatch, tmp_path):
    """bwrap absent (a path with none), or present and refused its namespaces (as in a
    container whose seccomp profile forbids them): a stand-in that fails as bwrap does."""
    if request.param == "missing":
        monkeypatch.setenv(sandbox_bwrap.BWRAP_ENV, str(tmp_path / "bin" / "bwrap"))
        return "bwrap is not installed"
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace, likely because the kernel "
                    "does not allow non-privileged user namespaces.' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv(sandbox_bwrap.BWRAP_ENV, str(fake))
    return "No permissions to creating new namespace"


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_without_bubblewrap_no_escape_runs_at_all(no_confinement, escape, tmp_path):
    marker = tmp_path / "ran"
    code = f"open({str(marker)!r}, 'w').write('x')\n{ESCAPES[escape]}\n"
    with pytest.raises(SandboxUnavailable, match=no_confinement):
        run_python(code)
    with pytest.raises(SandboxUnavailable, match="refusing to run unconfined"):
        sandbox_tool(code)  # the task's and the data tasks' tool
    assert not marker.exists()  # it never ran, unconfined or otherwise


@pytest.mark.parametrize("task", [{"name": "python-sandbox"}, {"name": "dataset", "path": "configs/data/math.jsonl",
                                                                "tools": ["python-sandbox"]}])
def test_without_bubblewrap_the_trainer_refuses_the_task_before_any_worker(no_confinement, task, tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text(json.dumps({"task": task, "train": {"steps": 1}}))
    field = "task.name" if task["name"] == "python-sandbox" else "task.tools"
    with pytest.raises(ConfigError, match=f"{field}: task {task['name']} calls the python-sandbox tool"):
        preflight(load_config(str(config)))
    r = subprocess.run([sys.executable, "-m", "learner.cli", "train", "--config", str(config)], capture_output=True,
                       text=True, timeout=120, env=os.environ)  # the fixture's THUNDERSYNC_BWRAP included
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr  # one line: no "boot:" line, no worker started
    assert f"{field}: task {task['name']} calls the python-sandbox tool" in lines[0] and no_confinement in lines[0]


def test_a_task_without_the_tool_needs_no_bubblewrap(no_confinement):
    preflight(load_config("configs/quickstart.yaml"))  # arith-tool: the calculator, no sandbox
    sandbox_cfg = load_config("configs/quickstart.yaml", {"task.name": "python-sandbox"})
    with pytest.raises(ConfigError, match=no_confinement):
        preflight(sandbox_cfg)


NON_ROOT_WORKER = """
import json, os
from learner.tasks import sandbox_bwrap
from learner.tasks.sandbox import run_python
probe = sandbox_bwrap.probe()
result = run_python("import os\\nfor p in ['/proc', '/proc/{pid}/environ', '/var/run/postgresql']:\\n"
                    "    print(p, os.path.exists(p))\\nprint(os.getuid())")
print(json.dumps({"uid": os.getuid(), "problem": probe.problem, "fresh_proc": probe.fresh_proc,
                  "stdout": result.stdout, "stderr": result.stderr}))
"""


@pytest.mark.skipif(os.geteuid() != 0 or not Path("/usr/bin/python3").exists(),
                    reason="needs root to build the container-like worker (unshare -m, setpriv) and Debian's python3")
def test_a_non_root_worker_under_dockers_masked_proc_confines_without_proc(secret_process):
    """The compose worker: an unprivileged user (its namespaces through a user namespace) whose
    /proc has a masked path, as Docker masks /proc/kcore and others, so the kernel refuses a
    fresh /proc; the call then runs with no /proc at all, and still confined."""
    import shutil
    import tempfile

    pid, secret = secret_process
    with tempfile.TemporaryDirectory() as root:
        os.chmod(root, 0o755)
        package = Path(root) / "learner" / "tasks"
        package.mkdir(parents=True)
        source = Path(__file__).resolve().parents[2] / "learner"
        shutil.copy(source / "__init__.py", package.parent)
        for name in ("__init__.py", "sandbox.py", "sandbox_bwrap.py"):  # they need nothing beyond the stdlib
            shutil.copy(source / "tasks" / name, package)
        for path in [package.parent, package, *package.parent.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        worker = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "env", "-i", f"PYTHONPATH={root}",
                  "PATH=/usr/bin:/bin", "/usr/bin/python3", "-c", NON_ROOT_WORKER.replace("{pid}", str(pid))]
        done = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c",
                               'mount --bind /dev/null /proc/uptime && exec "$@"', "sh", *worker],
                              capture_output=True, text=True, timeout=60, cwd=root)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["uid"] == 65534 and seen["problem"] is None and seen["fresh_proc"] is False, seen
    assert seen["stdout"].splitlines() == ["/proc False", f"/proc/{pid}/environ False", "/var/run/postgresql False",
                                           "65534"], seen
    assert secret not in done.stdout
