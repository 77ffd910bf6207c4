"""Answer latency while PostgreSQL flaps: down ``--down`` s, up ``--up`` s, ``--cycles`` times.

The production shape on one machine: daphne on ``controller.settings.production`` (pooled
PostgreSQL with production's 5 s pool wait, Redis as cache, broker and channel layer) on a
fresh test database, reached through a TCP relay that the probe shuts for the down phases as a
stopped server looks to its clients (connects refused, every connection cut; tests/controller/
faults.py ``TcpGate``), so the shared PostgreSQL server is never stopped. ``--clients`` logged-in
API clients GET ``/api/runs/<id>/`` and ``/api/runs/`` back to back the whole time. Reported per
phase (down, up): the answers, their statuses, and their latency (p50, p95, max); overall, the
answers in the window and whether any was a 500.

    .venv/bin/python -m bench.web.db_outage [--down 30] [--up 45] [--cycles 2] [--clients 2] [--root PATH] [--json F]

``--root``: the source tree daphne runs (default this one), to measure another commit's code.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def summary(answers: list[dict]) -> dict:
    latencies = [a["s"] for a in answers]
    statuses: dict[str, int] = {}
    for a in answers:
        statuses[str(a["status"])] = statuses.get(str(a["status"]), 0) + 1
    return {"answers": len(answers), "statuses": statuses,
            "p50_s": round(statistics.median(latencies), 3) if latencies else None,
            "p95_s": percentile(latencies, 0.95), "max_s": round(max(latencies), 3) if latencies else None}


def client_loop(session, url: str, paths: list[str], phase: list[str], stop: threading.Event, out: list) -> None:
    i = 0
    while not stop.is_set():
        path, i = paths[i % len(paths)], i + 1
        start, when = time.monotonic(), phase[0]
        try:
            status = session.get(url + path, timeout=120, allow_redirects=False).status_code
        except Exception as err:  # no answer at all counts too
            status = type(err).__name__
        out.append({"phase": when, "status": status, "s": time.monotonic() - start, "t": start})


def run_probe(args) -> dict:
    from tests.harness.web_harness import bench_database

    with bench_database(), tempfile.TemporaryDirectory() as tmp:
        from django.contrib.auth import get_user_model
        from django.db import connection

        from controller.models import Experiment, Run, Schedule
        from tests.controller.faults import ProductionWeb, RedisServer, TcpGate, production_password

        user = production_password(get_user_model().objects.create_user("probe"), "probe-password")
        experiment = Experiment.objects.create(owner=user, name="probe", config={})
        schedule = Schedule.objects.create(owner=None, name="sync", kind="sync")
        run = Run.objects.create(experiment=experiment, schedule=schedule, steps=3, config={})
        db = connection.settings_dict
        gate = TcpGate(int(db["PORT"])).open()
        redis = RedisServer(Path(tmp) / "redis").start()
        web = ProductionWeb(redis.url, Path(tmp) / "runs", Path(tmp) / "daphne.log", root=args.root, env={
            "DATABASE_URL": f"postgres://{db['USER']}@127.0.0.1:{gate.port}/{db['NAME']}",
            "THUNDERSYNC_DB_POOL_TIMEOUT_S": "5"})
        answers: list[dict] = []
        phases: list[dict] = []
        try:
            sessions = [web.login("probe", "probe-password") for _ in range(args.clients)]
            phase, stop = ["up"], threading.Event()
            threads = [threading.Thread(target=client_loop, daemon=True, args=(
                s, web.url, [f"/api/runs/{run.pk}/", "/api/runs/"], phase, stop, answers)) for s in sessions]
            start = time.monotonic()
            for t in threads:
                t.start()
            for _ in range(args.cycles):
                for name, seconds, act in (("down", args.down, gate.shut), ("up", args.up, gate.open)):
                    act()
                    phase[0] = name
                    phases.append({"phase": name, "at_s": round(time.monotonic() - start, 1)})
                    time.sleep(seconds)
            window = time.monotonic() - start
            stop.set()
            for t in threads:
                t.join(timeout=150)
            log = web.log_path.read_text()
        finally:
            web.stop()
            redis.stop()
            gate.shut()
        counted = [a for a in answers if a["t"] - start < window]  # answers to requests sent in the window
        # each up phase after a down one: seconds from the server's return to the first 200 answer
        recovery = []
        for p in phases[1::2]:
            at = start + p["at_s"]
            done = [a["t"] + a["s"] - at for a in counted if a["status"] == 200 and a["t"] + a["s"] >= at]
            recovery.append(round(min(done), 2) if done else None)
        return {
            "root": str(args.root), "down_s": args.down, "up_s": args.up, "cycles": args.cycles,
            "clients": args.clients, "window_s": round(window, 1),
            "all": summary(counted), "down": summary([a for a in counted if a["phase"] == "down"]),
            "up": summary([a for a in counted if a["phase"] == "up"]),
            "recovery_s": recovery, "statuses_500": sum(1 for a in counted if a["status"] == 500),
            "daphne_tracebacks": log.count("Traceback"), "phases": phases,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--down", type=float, default=30.0)
    parser.add_argument("--up", type=float, default=45.0)
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--root", type=Path, default=ROOT)
    parser.add_argument("--json", type=Path, default=None, help="write the report here too")
    args = parser.parse_args()
    report = run_probe(args)
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if report["statuses_500"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
