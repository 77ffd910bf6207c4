"""Bounded connections under load, with Redis restarted and PostgreSQL backends killed on the way.

The production shape on one machine: daphne on ``controller.settings.production`` (pooled
PostgreSQL, Redis channel layer) and a worker-like process on the same settings whose real
supervisors (``controller.supervision.supervisor.supervise``, one thread per run, as many as a worker with
that many run slots) read the JSONL events of stand-in learners (``emit`` below: spans shaped
like a multi-turn agent's rollouts, metrics per step, then ``run finished``), store them and
publish them. Against it: websocket viewers that ack as the run page does and reconnect with
``?after=<last seq>`` whenever closed, and API clients polling the JSON API. In the middle a
private Redis is killed and started again, later every PostgreSQL backend of the database is
terminated once. Reported: p95 API latency and every status, span frames delivered vs sent
(every viewer must end with every span of its run and its final status), PostgreSQL and Redis
connections per process (sampled from /proc), the faults' times.

    .venv/bin/python -m bench.web.live_load [--runs 4] [--viewers 100] [--clients 20] [--seconds 300] [--pause 0.25]

The suite's scaled-down version is tests/controller/test_connections_load.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PG_PORT = 5432
ACK_EVERY_S = 0.1  # live.js's ACK_EVERY_MS


# -- the stand-in learner: `python -m bench.web.live_load emit ... train --config F --events -` ----

def emit(seconds: float, spans_per_s: float, steps: int, seed: int) -> None:
    """Span and metrics events at ``spans_per_s`` for ``seconds``, in ``steps`` steps, then finished."""
    rng, out = random.Random(seed), sys.stdout
    print(json.dumps({"type": "run", "status": "started"}), flush=True)
    total, start = int(seconds * spans_per_s), time.monotonic()
    per_step = max(1, total // steps)
    for seq in range(total):
        while (ahead := start + seq / spans_per_s - time.monotonic()) > 0:
            time.sleep(min(ahead, 0.02))
        step, t0 = seq // per_step, seq / spans_per_s
        worker = rng.randrange(4)
        out.write(json.dumps({"type": "span", "seq": seq, "step": min(step, steps - 1), "kind": "rollout.generate",
                              "t0": t0, "t1": t0 + rng.uniform(0.01, 0.2), "lane": f"rollout/{worker}/0",
                              "traj": seq // 8, "group": seq // 32, "turn": seq % 8, "policy_version": step,
                              "tokens": rng.randint(8, 24)}) + "\n")
        if (seq + 1) % per_step == 0 and step < steps:
            out.write(json.dumps({"type": "metrics", "step": step, "values": {"timing_s/step": per_step / spans_per_s,
                                                                              "reward/mean": rng.random()}}) + "\n")
        if seq % 20 == 19:
            out.flush()
    print(json.dumps({"type": "run", "status": "finished", "summary": {"spans": total}}), flush=True)


# -- the worker-like process: `python -m bench.web.live_load supervise RUN_ID... --seconds --rate` ---

def supervise_runs(run_ids: list[int], seconds: float, spans_per_s: float) -> None:
    """One real supervisor thread per run (its own database connection for the whole run, as in a
    worker), each over a stand-in learner; prints one JSON line per run at the end."""
    import django

    django.setup()
    from django.conf import settings

    from controller.models import Run
    from controller.supervision.supervisor import supervise

    settings.THUNDERSYNC_LEARNER_COMMAND = [sys.executable, "-m", "bench.web.live_load", "emit", "--seconds",
                                            str(seconds), "--rate", str(spans_per_s)]
    results: dict[int, str] = {}

    from django.utils import timezone

    # this process owns the runs from now on: the web process's reaper must not take them while the
    # supervisors start their learners
    Run.objects.filter(pk__in=run_ids).update(heartbeat=timezone.now())

    def one(run_id: int) -> None:
        results[run_id] = supervise(Run.objects.get(pk=run_id)).status

    threads = [threading.Thread(target=one, args=(run_id,)) for run_id in run_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 300)
    print(json.dumps({"statuses": results}), flush=True)


# -- measuring ----------------------------------------------------------------------------------

def connections(pid: int, port: int) -> int:
    """Established TCP connections of process ``pid`` to ``port`` (its sockets in /proc/net/tcp)."""
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
        found = 0
        for table in ("tcp", "tcp6"):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[2].rsplit(":", 1)[1], 16) == port and fields[3] == "01" and fields[9] in inodes:
                    found += 1
        return found
    except OSError:  # the process is gone
        return 0


class ConnectionSampler:
    """The most connections each named process held to each port, sampled every ``period_s``."""

    def __init__(self, pids: dict[str, int], ports: dict[str, int], period_s: float = 0.25):
        self.pids, self.ports, self.period_s = pids, ports, period_s
        self.most = {(name, port): 0 for name in pids for port in ports}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self.stopped.wait(self.period_s):
            for name, pid in self.pids.items():
                for port_name, port in self.ports.items():
                    key = (name, port_name)
                    self.most[key] = max(self.most.get(key, 0), connections(pid, port))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join(timeout=10)

    def report(self) -> dict[str, int]:
        return {f"{name}/{port}": n for (name, port), n in self.most.items() if port in self.ports}


class ApiClients:
    """``count`` logged-in ``requests`` sessions polling the JSON API until stopped; every answer's
    status and latency kept."""

    def __init__(self, sessions: list, base_url: str, run_ids: list[int], pause_s: float = 0.0):
        self.sessions, self.base_url, self.run_ids, self.pause_s = sessions, base_url, run_ids, pause_s
        self.latencies_ms: list[float] = []
        self.statuses: dict[int, int] = {}
        self.errors: list[str] = []
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._loop, args=(s, i), daemon=True) for i, s in enumerate(sessions)]

    def _loop(self, session, index: int) -> None:
        run_id = self.run_ids[index % len(self.run_ids)]
        paths = ["/api/runs/", f"/api/runs/{run_id}/", f"/api/runs/{run_id}/spans/?after=-1&limit=200",
                 f"/api/runs/{run_id}/metrics/"]
        i = 0
        while not self.stopped.is_set():
            started = time.monotonic()
            try:
                status = session.get(self.base_url + paths[i % len(paths)], timeout=30).status_code
            except Exception as err:  # noqa: BLE001 (counted: a dropped connection is a failure too)
                self.errors.append(repr(err)[:200])
                status = 0
            self.latencies_ms.append((time.monotonic() - started) * 1000.0)
            self.statuses[status] = self.statuses.get(status, 0) + 1
            i += 1
            self.stopped.wait(self.pause_s)

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        for thread in self.threads:
            thread.join(timeout=60)

    def p95_ms(self) -> float:
        return statistics.quantiles(self.latencies_ms, n=100, method="inclusive")[94]


class Viewer:
    """One run page's socket: acks what it receives, reconnects with ``?after`` whenever closed
    (as live.js), until it holds every span of its run and the run's final status."""

    def __init__(self, ws_url: str, headers: dict, expected_spans: int):
        self.ws_url, self.headers, self.expected = ws_url, headers, expected_spans
        self.seqs: set[int] = set()
        self.status = None
        self.live_frames = self.connects = 0
        self.closes: list[int | str] = []

    def watermark(self) -> int:
        mark = -1
        while mark + 1 in self.seqs:
            mark += 1
        return mark

    def done(self) -> bool:
        return self.status == "succeeded" and len(self.seqs) >= self.expected

    async def run(self, deadline: float) -> None:
        import websockets

        retry_s = 0.5
        while not self.done() and time.monotonic() < deadline:
            self.connects += 1
            try:
                async with websockets.connect(f"{self.ws_url}?after={self.watermark()}", additional_headers=self.headers,
                                              open_timeout=30, max_size=2**24) as socket:
                    retry_s, received, replayed, acked_at = 0.5, 0, False, 0.0
                    while not self.done():
                        frame = json.loads(await asyncio.wait_for(socket.recv(), max(0.1, deadline - time.monotonic())))
                        received += 1
                        self.take(frame, replayed)
                        replayed = replayed or frame["type"] == "replay_done"
                        # as live.js: every frame of the replay, live ones at most every ACK_EVERY_S
                        if not replayed or time.monotonic() - acked_at >= ACK_EVERY_S:
                            acked_at = time.monotonic()
                            await socket.send(json.dumps({"type": "ack", "frames": received}))
            except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as err:
                closed = getattr(err, "rcvd", None)
                self.closes.append(closed.code if closed else type(err).__name__)
            if not self.done():
                await asyncio.sleep(retry_s * (0.5 + random.random()))  # live.js's jittered back-off
                retry_s = min(retry_s * 2, 4.0)

    def take(self, frame: dict, replayed: bool) -> None:
        if frame["type"] == "spans":
            self.seqs.update(span["seq"] for span in frame["spans"])
            self.live_frames += replayed
        elif frame["type"] == "status":
            self.status = frame["status"]


def run_viewers(viewers: list[Viewer], deadline: float) -> threading.Thread:
    """The viewers' event loop in a thread of its own."""
    async def all_of_them():
        await asyncio.gather(*(viewer.run(deadline) for viewer in viewers))

    thread = threading.Thread(target=lambda: asyncio.run(all_of_them()), daemon=True)
    thread.start()
    return thread


def worker_process(env: dict, run_ids: list[int], seconds: float, rate: float, log_path: Path) -> subprocess.Popen:
    log = open(log_path, "ab")
    try:
        return subprocess.Popen([sys.executable, "-m", "bench.web.live_load", "supervise", *map(str, run_ids),
                                 "--seconds", str(seconds), "--rate", str(rate)],
                                cwd=ROOT, env={**env, "THUNDERSYNC_WARM_RUNNER": "0"}, stdout=subprocess.PIPE,
                                stderr=log, text=True, start_new_session=True)
    finally:
        log.close()


def load(web, redis, database: str, spared: int, run_ids: list[int], sessions: list, viewers_per_run: int,
         seconds: float, rate: float, redis_at: float, pg_at: float, log_path: Path, pause_s: float = 0.0) -> dict:
    """The whole scenario (see the module doc) against ``web`` (tests/controller/faults.py
    ProductionWeb) on ``redis`` (RedisServer); the runs exist, status starting. ``spared``: the
    caller's own backend, not terminated; ``pause_s``: each API client's pause between requests
    (0: back to back). Returns the report."""
    expected = int(seconds * rate)
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controller.settings.production", "PYTHONPATH": str(ROOT),
           "DJANGO_SECRET_KEY": "bench-" + "k" * 50, "DJANGO_HTTPS": "0", "DATABASE_URL": web.database_url,
           "REDIS_URL": redis.url, "THUNDERSYNC_RUN_DIR": str(web.run_dir)}
    cookies = sessions[0].cookies.get_dict()
    headers = {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items()), "Origin": web.url}
    ws_base = web.url.replace("http", "ws", 1)
    viewers = [Viewer(f"{ws_base}/ws/runs/{run_id}/", headers, expected) for run_id in run_ids
               for _ in range(viewers_per_run)]
    started = time.monotonic()
    deadline = started + seconds + 60
    worker = worker_process(env, run_ids, seconds, rate, log_path)
    faults: dict[str, float] = {}
    try:
        sampler = ConnectionSampler({"daphne": web.proc.pid, "worker": worker.pid}, {"postgres": PG_PORT,
                                                                                      "redis": redis.port})
        with sampler, ApiClients(sessions, web.url, run_ids, pause_s) as api:
            viewing = run_viewers(viewers, deadline)
            time.sleep(max(0.0, started + redis_at - time.monotonic()))
            faults["redis_killed_s"] = time.monotonic() - started
            redis.crash()
            time.sleep(1.0)
            redis.start()
            faults["redis_back_s"] = time.monotonic() - started
            time.sleep(max(0.0, started + pg_at - time.monotonic()))
            faults["pg_backends_terminated"] = terminate_backends_but(database, spared)
            faults["pg_killed_s"] = time.monotonic() - started
            out, _ = worker.communicate(timeout=max(1.0, deadline - time.monotonic()))
            viewing.join(timeout=max(1.0, deadline - time.monotonic()))
        elapsed = time.monotonic() - started
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=30)
    closes: dict[str, int] = {}
    for viewer in viewers:
        for code in viewer.closes:
            closes[str(code)] = closes.get(str(code), 0) + 1
    lines = [line for line in (out or "").splitlines() if line.startswith("{")]
    return {
        "runs": len(run_ids), "viewers": len(viewers), "api_clients": len(sessions), "seconds": round(elapsed, 1),
        "spans_per_run": expected, "span_rate_per_run": rate, **{k: round(v, 1) for k, v in faults.items()},
        "run_statuses": json.loads(lines[-1])["statuses"] if lines else {},
        "viewers_complete": sum(v.done() for v in viewers),
        "spans_delivered": sum(len(v.seqs) for v in viewers), "spans_sent": expected * len(viewers),
        "live_span_frames": sum(v.live_frames for v in viewers), "reconnects": sum(v.connects - 1 for v in viewers),
        "close_codes": closes, "incomplete_viewers": [
            {"url": v.ws_url, "spans": len(v.seqs), "status": v.status, "connects": v.connects, "closes": v.closes[:8]}
            for v in viewers if not v.done()][:3], "api_requests": len(api.latencies_ms), "api_statuses": api.statuses,
        "api_pause_s": pause_s, "api_errors": api.errors[:5], "api_p50_ms": round(statistics.median(api.latencies_ms), 1),
        "api_p95_ms": round(api.p95_ms(), 1), "api_max_ms": round(max(api.latencies_ms), 1),
        "connections_max": sampler.report(), "load_average": os.getloadavg()[0],
    }


def terminate_backends_but(database: str, spared: int) -> int:
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=PG_PORT, user="postgres", dbname="postgres", autocommit=True) as conn:
        return len(conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND "
                                "pid <> pg_backend_pid() AND pid <> %s", [database, spared]).fetchall())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    e = sub.add_parser("emit")
    e.add_argument("--seconds", type=float, default=20.0)
    e.add_argument("--rate", type=float, default=100.0)
    e.add_argument("--steps", type=int, default=10)
    e.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("supervise")
    s.add_argument("runs", type=int, nargs="+")
    s.add_argument("--seconds", type=float, required=True)
    s.add_argument("--rate", type=float, required=True)
    args, _ = (parser.parse_known_args() if sys.argv[1:2] in (["emit"], ["supervise"])  # emit ignores the
               else (argparse.Namespace(command=None), None))                             # learner's own arguments
    if args.command == "emit":
        emit(args.seconds, args.rate, args.steps, args.seed)
    elif args.command == "supervise":
        supervise_runs(args.runs, args.seconds, args.rate)
    else:
        bench = argparse.ArgumentParser(description=__doc__.splitlines()[0])
        bench.add_argument("--runs", type=int, default=4)
        bench.add_argument("--viewers", type=int, default=100, help="in all, spread over the runs")
        bench.add_argument("--clients", type=int, default=20)
        bench.add_argument("--seconds", type=float, default=300.0)
        bench.add_argument("--rate", type=float, default=60.0, help="spans per second per run")
        bench.add_argument("--pause", type=float, default=0.25, help="each API client's pause between requests (s)")
        bench.add_argument("--json", type=Path, default=None, help="write the report here too")
        print(json.dumps(report := run_bench(bench.parse_args()), indent=1))
        # (the statuses are counted by int code; the JSON's keys are their text)
        return 0 if report["viewers_complete"] == report["viewers"] and set(map(str, report["api_statuses"])) == {"200"} else 1
    return 0


def run_bench(args) -> dict:
    """The whole scenario on a fresh test database, a private Redis and daphne (tests/controller/faults.py)."""
    import tempfile

    from tests.harness.web_harness import bench_database

    with bench_database(), tempfile.TemporaryDirectory() as tmp:
        from django.contrib.auth import get_user_model
        from django.db import connection
        from django.utils import timezone

        from controller.config_merge import run_config
        from controller.models import Experiment, Run, Schedule
        from tests.controller.faults import ProductionWeb, RedisServer, production_password

        import yaml

        user = production_password(get_user_model().objects.create_user("bench"), "bench-password")
        config = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
        experiment = Experiment.objects.create(owner=user, name="load", config=config)
        schedule = Schedule.objects.create(owner=None, name="streaming", kind="streaming")
        runs = [Run.objects.create(experiment=experiment, schedule=schedule, steps=10, status=Run.Status.STARTING,
                                   heartbeat=timezone.now(), config=run_config(config, schedule.overrides(), 10, ""))
                for _ in range(args.runs)]
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            spared = cursor.fetchone()[0]
        redis = RedisServer(Path(tmp) / "redis").start()
        web = ProductionWeb(redis.url, Path(tmp) / "runs", Path(tmp) / "daphne.log")
        try:
            sessions = [web.login("bench", "bench-password") for _ in range(args.clients)]
            report = load(web, redis, connection.settings_dict["NAME"], spared, [r.pk for r in runs], sessions,
                          max(1, args.viewers // args.runs), args.seconds, args.rate, redis_at=args.seconds / 3,
                          pg_at=2 * args.seconds / 3, log_path=Path(tmp) / "worker.log", pause_s=args.pause)
            report["daphne_tracebacks"] = web.log_path.read_text().count("Traceback")
            report["run_errors"] = [r.error.splitlines()[0] for r in Run.objects.all() if r.error]
            report["worker_log_tail"] = (Path(tmp) / "worker.log").read_text()[-1500:]
            report["daphne_log_warnings"] = [line[:300] for line in web.log_path.read_text().splitlines()
                                             if "WARNING" in line or "ERROR" in line][:12]
        finally:
            web.stop()
            redis.stop()
        if args.json:
            args.json.write_text(json.dumps(report, indent=1) + "\n")
        return report


if __name__ == "__main__":
    sys.exit(main())
