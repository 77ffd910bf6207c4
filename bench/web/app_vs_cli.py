"""One config launched through the app and through the CLI, alternating: step-median ratios app/CLI
per schedule, for the embedded default and the production shape.

Arms, each round in turn for each schedule (same config and seed):
  embedded    ``manage.py demo`` as ``./run demo`` serves it: SQLite (a temporary file), the
              in-memory broker, the embedded Celery worker thread (and its warm runner) and
              daphne in one process
  production  ``controller.settings.production``: PostgreSQL (a fresh database, dropped at the
              end), Redis (an empty database index, flushed at the end), a real
              ``celery -A controller worker -Q runs --prefetch-multiplier 1 --concurrency 1``
              (and its warm runner) and ``daphne controller.asgi:application``, all on 127.0.0.1
  cli         ``thundersync train --config FILE --schedule S --quiet``, as a user runs it
App runs are launched as a script or the browser would: logged in over HTTP, ``POST /api/runs/``,
read back from ``/api/runs/<id>/metrics/`` (``timing_s/step``); each app shape gets one untimed
run first (model cache, warm runner), and every timed app run must have been forked by the warm
runner (its log's first line). The CLI's step times are its per-step lines (10 ms resolution).
A run's figure is its median step over steps 1.. (step 0 is a warm-up); an arm's is the median
of its runs; ratio = app / cli. Each app run also reports the CPU seconds per step of the app's
servers (every process in their sessions; a run leads its own). Config: configs/bench.yaml with algorithm.kl_coef 0.04,
task.tool_latency.scale 0.3, train.prompts_per_step 16, train.steps 8. Target: <= 1.05.

    .venv/bin/python -m bench.web.app_vs_cli [--rounds 3] [--shapes embedded production] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import requests
import yaml

from bench.load_report import finish
from controller.supervision.processes import proc_stats
from tests.harness.web_harness import free_port

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
SCHEDULES = ("sync", "streaming")
TARGET = 1.05
RUN_TIMEOUT_S = 900.0
START_TIMEOUT_S = 240.0


def bench_config() -> dict:
    config = yaml.safe_load((ROOT / "configs" / "bench.yaml").read_text())
    config["algorithm"]["kl_coef"] = 0.04
    config["task"]["tool_latency"]["scale"] = 0.3
    config["train"].update(prompts_per_step=16, steps=8)
    return config


@contextmanager
def process(argv: list[str], env: dict[str, str], log: Path, stop_signal: int = signal.SIGTERM):
    """A server process in a session of its own: stopped with ``stop_signal``, then its whole group
    SIGKILLed (its warm runner and any run left), on every exit path."""
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(stop_signal)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(check, what: str, procs: list[subprocess.Popen], log: Path, timeout: float = START_TIMEOUT_S):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        for proc in procs:
            if proc.poll() is not None:
                raise SystemExit(f"{what}: a server exited ({proc.args[:4]}); see {log}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout:.0f}s; see {log}")
        time.sleep(0.2)


def session_cpu_s(sessions: list[int]) -> float:
    """CPU seconds (user + system) so far of every live process in these sessions: the app's
    servers and their threads and pool children, not the runs (a run leads a session of its own)."""
    tick = os.sysconf("SC_CLK_TCK")
    return sum((int(fields[11]) + int(fields[12])) / tick for _, fields in proc_stats() if int(fields[3]) in sessions)


def listening(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/accounts/login/", timeout=2).status_code == 200
    except requests.RequestException:
        return False


class AppClient:
    """A logged-in user of the app's JSON API."""

    def __init__(self, base: str, username: str, password: str, run_dir: Path, servers: list[int]):
        self.base, self.run_dir, self.http, self.servers = base, run_dir, requests.Session(), servers
        self.app_cpu_per_step: list[float] = []  # the servers' CPU seconds per step of each run
        self.http.get(f"{base}/accounts/login/", timeout=30)
        answer = self.http.post(f"{base}/accounts/login/", timeout=30, allow_redirects=False, data={
            "username": username, "password": password, "csrfmiddlewaretoken": self.http.cookies["csrftoken"]},
            headers={"Referer": f"{base}/accounts/login/"})
        if answer.status_code != 302:
            raise SystemExit(f"cannot log in to {base}: HTTP {answer.status_code}")
        self.schedules: dict[str, int] = {}

    def call(self, method: str, path: str, **body) -> dict:
        answer = self.http.request(method, f"{self.base}{path}", json=body or None, timeout=60,
                                   headers={"X-CSRFToken": self.http.cookies["csrftoken"]})
        if answer.status_code >= 300:
            raise SystemExit(f"{method} {path}: HTTP {answer.status_code} {answer.text[:500]}")
        return answer.json()

    def prepare(self, config: dict) -> None:
        self.experiment = self.call("POST", "/api/experiments/", name="app vs cli", config=config)["id"]
        for kind in SCHEDULES:
            self.schedules[kind] = self.call("POST", "/api/schedules/", name=f"app-vs-cli {kind}", kind=kind)["id"]

    def run(self, schedule: str) -> tuple[list[float], bool]:
        """Launch one run and wait for it: (its step times, whether the warm runner forked it)."""
        cpu_before = session_cpu_s(self.servers)
        run = self.call("POST", "/api/runs/", experiment=self.experiment, schedule=self.schedules[schedule])
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while run["status"] not in ("succeeded", "failed", "cancelled"):
            if time.monotonic() > deadline:
                self.call("POST", f"/api/runs/{run['id']}/cancel/")
                raise SystemExit(f"run {run['id']} did not finish within {RUN_TIMEOUT_S:.0f}s")
            time.sleep(0.5)
            run = self.call("GET", f"/api/runs/{run['id']}/")
        if run["status"] != "succeeded":
            raise SystemExit(f"run {run['id']} {run['status']}: {run['error'][:1000]}")
        metrics = self.call("GET", f"/api/runs/{run['id']}/metrics/")["metrics"]
        self.app_cpu_per_step.append((session_cpu_s(self.servers) - cpu_before) / max(len(metrics), 1))
        log = (self.run_dir / f"run-{run['id']}" / "learner.stderr.log").read_text()
        return [m["values"]["timing_s/step"] for m in metrics], log.startswith("boot: forked from the warm runner")


def embedded_app(stack: ExitStack, tmp: Path) -> AppClient:
    """``manage.py demo`` on a temporary SQLite file; its printed login."""
    port, run_dir, log = free_port(), tmp / "embedded-runs", tmp / "embedded.log"
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controller.settings.embedded", "PYTHONPATH": str(ROOT),
           "THUNDERSYNC_SQLITE": str(tmp / "embedded.sqlite3"), "THUNDERSYNC_RUN_DIR": str(run_dir)}
    demo = stack.enter_context(process([PYTHON, "manage.py", "demo", "--port", str(port)], env, log,
                                       stop_signal=signal.SIGINT))  # Ctrl-C: it stops its worker and runs
    wait_for(lambda: listening(port), "the embedded server", [demo], log)
    password = re.search(r"^password: (\S+)$", log.read_text(), re.M).group(1)
    return AppClient(f"http://127.0.0.1:{port}", "demo", password, run_dir, [demo.pid])


def free_redis_index() -> int:
    import redis

    for index in range(15, 0, -1):
        if redis.Redis(host="127.0.0.1", port=6379, db=index).dbsize() == 0:
            return index
    raise SystemExit("no empty Redis database index for the production shape")


@contextmanager
def fresh_services():
    """A new PostgreSQL database and an empty Redis index; dropped and flushed on exit."""
    import psycopg
    import redis

    name, index = f"app_vs_cli_{os.getpid()}", free_redis_index()
    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgres://postgres@127.0.0.1:5432/{name}", f"redis://127.0.0.1:6379/{index}"
    finally:
        with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        redis.Redis(host="127.0.0.1", port=6379, db=index).flushdb()


def production_app(stack: ExitStack, tmp: Path) -> AppClient:
    """PostgreSQL + Redis, a Celery worker process and daphne, as docker-compose.yml runs them."""
    database, redis_url = stack.enter_context(fresh_services())
    port, run_dir, password = free_port(), tmp / "production-runs", secrets.token_urlsafe(12)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controller.settings.production", "PYTHONPATH": str(ROOT),
           "DJANGO_SECRET_KEY": secrets.token_hex(32), "DJANGO_HTTPS": "0", "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
           "DATABASE_URL": database, "REDIS_URL": redis_url, "THUNDERSYNC_RUN_DIR": str(run_dir),
           "DJANGO_SUPERUSER_PASSWORD": password}
    for command in (["migrate", "--noinput"], ["createsuperuser", "--noinput", "--username", "bench",
                                                "--email", "bench@localhost"]):
        subprocess.run([PYTHON, "manage.py", *command], cwd=ROOT, env=env, check=True, capture_output=True,
                       timeout=START_TIMEOUT_S)
    worker_log, web_log = tmp / "celery.log", tmp / "daphne.log"
    worker = stack.enter_context(process([PYTHON, "-m", "celery", "-A", "controller", "worker", "-Q", "runs",
                                          "--prefetch-multiplier", "1", "--concurrency", "1", "--loglevel",
                                          "WARNING"], env, worker_log))
    web = stack.enter_context(process([PYTHON, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                                       "controller.asgi:application"], env, web_log))
    wait_for(lambda: listening(port), "daphne", [worker, web], web_log)
    return AppClient(f"http://127.0.0.1:{port}", "bench", password, run_dir, [worker.pid, web.pid])


def cli_run(config_path: Path, schedule: str, cwd: Path) -> list[float]:
    done = subprocess.run([PYTHON, "-m", "learner.cli", "train", "--config", str(config_path), "--schedule",
                           schedule, "--quiet"], cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if done.returncode:
        raise SystemExit(f"thundersync train failed ({done.returncode}): {done.stderr[-2000:]}")
    return [float(s) for s in re.findall(r"^step +\d+ .* step ([\d.]+)s", done.stderr, re.M)]


def step_median(steps: list[float]) -> float:
    return statistics.median(steps[1:])


def measure(shapes: list[str], rounds: int, tmp: Path) -> dict:
    config = bench_config()
    config_path = tmp / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    runs: dict[str, dict[str, list[float]]] = {arm: {s: [] for s in SCHEDULES} for arm in (*shapes, "cli")}
    with ExitStack() as stack:
        apps = {}
        for shape in shapes:
            apps[shape] = (embedded_app if shape == "embedded" else production_app)(stack, tmp)
            apps[shape].prepare(config)
            apps[shape].run("streaming")  # untimed: model cache, warm runner ready
        for n in range(rounds):
            for schedule in SCHEDULES:
                for arm in runs:
                    if arm == "cli":
                        steps = cli_run(config_path, schedule, tmp)
                    else:
                        steps, forked = apps[arm].run(schedule)
                        if not forked:
                            raise SystemExit(f"{arm}: a timed run started cold, not from the warm runner")
                    runs[arm][schedule].append(step_median(steps))
                    app_cpu = "" if arm == "cli" else f", app CPU {apps[arm].app_cpu_per_step[-1]:.3f} s/step"
                    print(f"round {n + 1} {schedule:9s} {arm:10s} step median {runs[arm][schedule][-1]:.3f} s "
                          f"(load {os.getloadavg()[0]:.1f}{app_cpu})", flush=True)
        app_cpu = {shape: app.app_cpu_per_step[1:] for shape, app in apps.items()}  # timed runs only
    return runs, app_cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shapes", nargs="+", choices=("embedded", "production"), default=["embedded", "production"])
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on kill too
    out = {"config": "configs/bench.yaml + kl_coef 0.04, tool_latency.scale 0.3, prompts_per_step 16, steps 8",
           "rounds": args.rounds, "cpus": os.cpu_count(), "load_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        runs, app_cpu = measure(args.shapes, args.rounds, Path(tmp))
    out["step_medians_s"] = runs
    out["app_cpu_s_per_step"] = app_cpu  # per timed app run, in launch order (sync, streaming per round)
    out["ratios"] = {shape: {s: statistics.median(runs[shape][s]) / statistics.median(runs["cli"][s])
                             for s in SCHEDULES} for shape in args.shapes}
    for shape, ratios in out["ratios"].items():
        for schedule, ratio in ratios.items():
            print(f"{shape:10s} {schedule:9s} app {statistics.median(runs[shape][schedule]):.3f} s / cli "
                  f"{statistics.median(runs['cli'][schedule]):.3f} s = {ratio:.3f} "
                  f"({'within' if ratio <= TARGET else 'over'} {TARGET})")
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
