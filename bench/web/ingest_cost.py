"""What the app spends ingesting a run's events: CPU seconds of ``RunIngestor`` (parse, validate,
write, publish) over the event stream of a real run, the array inserts of controller/ingest/bulk_writes.py
against Django's ``bulk_create`` (the path SQLite takes), alternating, on a fresh PostgreSQL
database and Redis index (the production shape's services).

The events come from one ``thundersync train --events`` run of the app-vs-CLI config
(bench/web/app_vs_cli.py: configs/bench.yaml, KL 0.04, tool scale 0.3, 16 prompts x 8, streaming),
``--steps`` steps. CPU seconds are the process's own (``time.process_time``), so the figure
depends little on what else the machine runs; PostgreSQL's own CPU is not in it.

    .venv/bin/python -m bench.web.ingest_cost [--steps 3] [--repeats 4] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import yaml

from bench.web.app_vs_cli import PYTHON, ROOT, bench_config, fresh_services
from bench.load_report import finish

ARMS = ("bulk_create", "array_insert")


def event_lines(steps: int, tmp: Path) -> list[str]:
    config = bench_config()
    config["train"]["steps"] = steps
    (tmp / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    subprocess.run([PYTHON, "-m", "learner.cli", "train", "--config", str(tmp / "config.yaml"), "--schedule",
                    "streaming", "--events", str(tmp / "events.jsonl"), "--quiet"], cwd=ROOT, check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=900)
    return (tmp / "events.jsonl").read_text().splitlines()


def ingest(lines: list[str], run_id: int) -> float:
    """CPU seconds to ingest ``lines`` as the supervisor does (a flush check every 50 lines)."""
    from controller.ingest.ingestion import RunIngestor

    ing = RunIngestor(run_id, flush_s=0.25, flush_spans=500)
    t0 = time.process_time()
    for i, line in enumerate(lines):
        ing.feed(line)
        if i % 50 == 0:
            ing.flush_if_due(drained=True)
    ing.flush()
    return time.process_time() - t0


def measure(steps: int, repeats: int, tmp: Path) -> dict:
    lines = event_lines(steps, tmp)
    with ExitStack() as stack:
        database, redis_url = stack.enter_context(fresh_services())
        os.environ.update({"DJANGO_SETTINGS_MODULE": "controller.settings.production", "DATABASE_URL": database,
                           "REDIS_URL": redis_url, "DJANGO_SECRET_KEY": secrets.token_hex(32), "DJANGO_HTTPS": "0",
                           "THUNDERSYNC_RUN_DIR": str(tmp / "runs")})
        subprocess.run([PYTHON, "manage.py", "migrate", "--noinput"], cwd=ROOT, check=True, capture_output=True)
        import django

        django.setup()
        from django.contrib.auth.models import User

        from controller.ingest import bulk_writes
        from controller.models import Experiment, Run, Schedule

        experiment = Experiment.objects.create(owner=User.objects.create(username="bench"), name="ingest", config={})
        schedule = Schedule.objects.create(name="ingest", kind="streaming")
        cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for _ in range(repeats):
            for arm in ARMS:
                run = Run.objects.create(experiment=experiment, schedule=schedule, steps=steps, config={})
                # bulk_create is the branch every other database takes
                bulk_writes.connection.vendor = "sqlite" if arm == "bulk_create" else "postgresql"
                try:
                    cpu[arm].append(ingest(lines, run.pk))
                finally:
                    bulk_writes.connection.vendor = "postgresql"
    kinds = {k: sum(1 for line in lines if line.startswith(f'{{"type":"{k}"')) for k in ("span", "trajectory", "metrics")}
    return {"lines": len(lines), "events": kinds, "cpu_s": cpu,
            "median_cpu_s_per_step": {arm: statistics.median(v) / steps for arm, v in cpu.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    out = {"load_start": os.getloadavg()[0], "steps": args.steps, "repeats": args.repeats}
    with tempfile.TemporaryDirectory() as tmp:
        out.update(measure(args.steps, args.repeats, Path(tmp)))
    per_step = out["median_cpu_s_per_step"]
    print(f"{out['lines']} event lines ({out['events']}) over {args.steps} steps")
    for arm in ARMS:
        print(f"{arm:13s} CPU s per step {per_step[arm]:.3f} (runs: {', '.join(f'{x:.3f}' for x in out['cpu_s'][arm])})")
    print(f"array_insert / bulk_create: {per_step['array_insert'] / per_step['bulk_create']:.2f}")
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
