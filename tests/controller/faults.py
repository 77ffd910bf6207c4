"""Fault injection for the controller: a real ``celery worker`` process (prefork pool, as
in production) on this test process's database and broker, a private Redis server that can
be killed and restarted, and checks that a run left nothing behind. Only processes this
test started are looked at (other test runs may share the machine)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from controller.models import Run, Span
from learner.stopping import SHM

ROOT = Path(__file__).resolve().parents[2]


def proc_stat(pid: int) -> list[str] | None:
    """Fields after the command name of /proc/<pid>/stat: state, ppid, pgrp, ..."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def exited(pid: int) -> bool:
    """Gone, or a zombie its parent has not reaped."""
    stat = proc_stat(pid)
    return stat is None or stat[0] == "Z"


def live_processes() -> list[tuple[int, list[str]]]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := proc_stat(int(entry.name))) is not None and stat[0] != "Z":
            found.append((int(entry.name), stat))
    return found


def group_members(pgid: int) -> list[int]:
    return [pid for pid, stat in live_processes() if int(stat[2]) == pgid]


def children(pid: int) -> list[int]:
    return [child for child, stat in live_processes() if int(stat[1]) == pid]


def wait_until(predicate, timeout: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f}s")
        time.sleep(poll)
    return value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A private, non-persistent redis-server: a restart loses everything, as a crash does."""

    def __init__(self, workdir: Path):
        self.port, self.workdir, self.proc = free_port(), workdir, None
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        self.proc = subprocess.Popen(
            [shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_until(self._answers, 30, "redis-server started")
        return self

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def crash(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.crash()


class WorkerProcess:
    """``celery -A controller worker -Q runs`` (prefork, one pool process) in its own session;
    ``queues`` and ``node`` (THUNDERSYNC_NODE) for a worker of one node of a run that spans nodes;
    ``path_first``: a directory put first on its PATH (a fault injected into a program it runs)."""

    def __init__(self, run_dir: Path, log_path: Path, redis_url: str | None = None, queues: str = "runs",
                 node: str = "local", path_first: Path | None = None):
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controller.settings.test", "THUNDERSYNC_NODE": node,
               "THUNDERSYNC_TEST_TAG": settings.TEST_TAG, "THUNDERSYNC_TEST_DATABASE": connection.settings_dict["NAME"],
               "THUNDERSYNC_RUN_DIR": str(run_dir), "PYTHONPATH": str(ROOT)}
        if path_first:  # a directory of programs the worker and its runs find before the system's
            env["PATH"] = f"{path_first}{os.pathsep}{env.get('PATH', '')}"
        if redis_url:
            env["THUNDERSYNC_TEST_REDIS_URL"] = redis_url
        self.log_path = log_path
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controller", "worker", "-Q", queues, "-P", "prefork", "-c", "1",
             "--prefetch-multiplier", "1", "--without-heartbeat", "--without-mingle", "--without-gossip",
             "-n", f"faults-{uuid.uuid4().hex[:8]}@%h", "-l", "INFO"],
            cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: b" ready." in log_path.read_bytes() or self.proc.poll() is not None, 120,
                   "the Celery worker started")
        assert self.proc.poll() is None, log_path.read_text()[-3000:]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def pool_child(self) -> int:
        return wait_until(lambda: next(iter(children(self.pid)), None), 30, "the worker's pool process")

    def stop(self) -> None:
        """Kill whatever is left of the worker (main and pool) and wait for it."""
        for pid in [self.pid, *group_members(self.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.poll() is None:
            self.proc.wait(timeout=30)
        wait_until(lambda: not group_members(self.pid), 30, "the worker's processes are gone")
        self.log.close()


def wait_final(run_id: int, timeout: float = 60.0) -> Run:
    return wait_until(lambda: (run := Run.objects.get(pk=run_id)).status in Run.FINISHED and run, timeout,
                      f"run {run_id} reached a final state")


def wait_running_with_spans(run_id: int, spans: int = 1, timeout: float = 240.0) -> Run:
    def ready():
        run = Run.objects.get(pk=run_id)
        assert run.status not in Run.FINISHED, f"run {run_id} ended early: {run.status} {run.error}"
        return run.status == "running" and Span.objects.filter(run_id=run_id).count() >= spans and run
    return wait_until(ready, timeout, f"run {run_id} running with {spans} spans")


def assert_nothing_left(run: Run, timeout: float = 30.0) -> None:
    """The learner's process group is gone, and with it its /dev/shm semaphores."""
    pgid = run.pids[0]
    wait_until(lambda: not group_members(pgid), timeout, f"the learner's process group {pgid} is empty")
    wait_until(lambda: not list(SHM.glob(f"sem.mp-ts{pgid}-*")), timeout, f"no semaphores of {pgid} left")


def assert_spans_kept(run_id: int, before: int) -> None:
    """Every span stored before the fault is still there, numbered densely from 0."""
    seqs = list(Span.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    assert len(seqs) >= before and seqs == list(range(len(seqs)))


class ProductionWeb:
    """daphne serving ``controller.asgi`` with ``controller.settings.production`` (persistent
    PostgreSQL connections, Redis as cache, broker and channel layer) on this test run's
    database and the given Redis; ``login`` opens a ``requests`` session through the real form.
    ``root``: the source tree it runs (a benchmark compares two)."""

    def __init__(self, redis_url: str, run_dir: Path, log_path: Path, env: dict[str, str] | None = None,
                 root: Path = ROOT):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        db = connection.settings_dict
        self.database_url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
        self.run_dir = run_dir
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controller.settings.production", "PYTHONPATH": str(root),
               "DJANGO_SECRET_KEY": uuid.uuid4().hex * 2, "DJANGO_HTTPS": "0", "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
               "DATABASE_URL": self.database_url, "REDIS_URL": redis_url, "THUNDERSYNC_RUN_DIR": str(run_dir),
               # a request that finds no live pooled connection (backends terminated every 50 ms)
               # answers 503 after this wait, not production's 5 s: hundreds of such requests
               "THUNDERSYNC_DB_POOL_TIMEOUT_S": "0.25", **(env or {})}
        self.log_path, self.log = log_path, open(log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port), "controller.asgi:application"],
            cwd=root, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_until(lambda: self.proc.poll() is not None or self._listens(), 60, "daphne listens")
        assert self.proc.poll() is None, log_path.read_text()[-3000:]

    def _listens(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def login(self, username: str, password: str):
        import requests

        session = requests.Session()
        session.get(f"{self.url}/accounts/login/", timeout=30)
        answer = session.post(f"{self.url}/accounts/login/", timeout=30, allow_redirects=False,
                              data={"username": username, "password": password,
                                    "csrfmiddlewaretoken": session.cookies["csrftoken"]})
        assert answer.status_code == 302, answer.text[-2000:]
        session.headers["X-CSRFToken"] = session.cookies["csrftoken"]
        session.headers["Referer"] = self.url + "/"
        return session

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()


def production_password(user, password: str):
    """``user`` with ``password`` hashed by a hasher production accepts (the test settings use MD5)."""
    from django.contrib.auth.hashers import PBKDF2PasswordHasher

    hasher = PBKDF2PasswordHasher()
    user.password = hasher.encode(password, hasher.salt(), iterations=1000)
    user.save(update_fields=["password"])
    return user


# -- fixtures of the production-shape tests (import them into the test module) --------------

@pytest.fixture
def redis_server(tmp_path):
    """A private Redis (RedisServer) that the test may crash and start again."""
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def web(redis_server, tmp_path):
    """daphne on controller.settings.production (ProductionWeb) with ``redis_server`` as its Redis."""
    server = ProductionWeb(redis_server.url, tmp_path / "runs", tmp_path / "daphne.log")
    yield server
    server.stop()


class BackendTerminator:
    """Terminates every PostgreSQL backend of the test database but this process's own,
    every ``period_s``, from a thread with its own connection: a flapping database."""

    def __init__(self, period_s: float = 0.05):
        import threading

        import psycopg

        db = connection.settings_dict
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            self.spared = cursor.fetchone()[0]
        self.conn = psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], dbname="postgres",
                                    autocommit=True)
        self.database, self.period_s, self.terminated = db["NAME"], period_s, 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stopped.wait(self.period_s):
            rows = self.conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> %s "
                "AND pid <> pg_backend_pid()", [self.database, self.spared]).fetchall()
            self.terminated += len(rows)

    def __enter__(self) -> "BackendTerminator":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        self.conn.close()


class TcpGate:
    """A TCP relay on 127.0.0.1 in front of a server (PostgreSQL) that this test can shut as the
    server's own stop would look to its clients: the listening socket closed (a connect is
    refused) and every relayed connection cut; ``open`` listens on the same port again."""

    def __init__(self, target_port: int, target_host: str = "127.0.0.1"):
        import threading

        self.target, self.port = (target_host, target_port), free_port()
        self.listener: socket.socket | None = None
        self.relayed: set[socket.socket] = set()
        self.lock = threading.Lock()

    def open(self) -> "TcpGate":
        import threading

        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self.listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        return self

    def shut(self) -> None:
        with self.lock:
            listener, self.listener = self.listener, None
            relayed, self.relayed = self.relayed, set()
        if listener is not None:
            listener.shutdown(socket.SHUT_RDWR)  # wakes its accept()
            listener.close()
        for sock in relayed:
            self._close(sock)

    @staticmethod
    def _close(sock: socket.socket) -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()

    def _accept(self, listener: socket.socket) -> None:
        import threading

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # shut
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                self._close(client)
                continue
            with self.lock:
                if self.listener is not listener:  # shut meanwhile
                    self._close(client)
                    self._close(upstream)
                    continue
                self.relayed |= {client, upstream}
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        with self.lock:
            self.relayed -= {source, sink}
        self._close(source)
        self._close(sink)
