"""Launch to first span: how long a user waits between "Launch" and the first bar on the page.

The production path minus the browser: ``launch_run`` (as the form and the API call it) enqueues
the run on the Redis broker, a real Celery worker (solo pool, as the embedded default's worker
thread) claims it and its supervisor starts ``thundersync train``; the bench watches the
database and the learner's log for each phase. The built-in model is cached by a first run
that is not timed. Reported per repeat and as medians:

    enqueue -> claimed -> "boot: starting ..." (interpreter up) -> "boot: loading torch ..."
    (workers spawned, config checked) -> run started (models loaded, fleet up) -> first span stored

    .venv/bin/python bench/first_span.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness.web_harness import bench_database  # noqa: E402

PHASES = ("claimed", "interpreter up", "loading torch", "run started", "first span")


def log_line_time(path: Path, prefix: str, seen: dict, name: str) -> None:
    if name not in seen and path.exists() and any(line.startswith(prefix) for line in path.read_text().splitlines()):
        seen[name] = time.monotonic()


def one_launch(experiment, schedule, timeout: float = 600.0) -> dict[str, float]:
    from controller.launching import launch_run
    from controller.models import Run, Span
    from controller.runlog import log_path

    t0 = time.monotonic()
    run = launch_run(experiment, schedule, steps=1, name="first span")
    seen: dict[str, float] = {}
    log = log_path(run.pk)
    while "first span" not in seen:
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"no span after {timeout:.0f}s: {Run.objects.get(pk=run.pk).error}")
        status = Run.objects.filter(pk=run.pk).values_list("status", flat=True).get()
        if status != Run.Status.QUEUED:
            seen.setdefault("claimed", time.monotonic())
        if status == Run.Status.FAILED:
            raise SystemExit(Run.objects.get(pk=run.pk).error)
        log_line_time(log, "boot: starting", seen, "interpreter up")
        log_line_time(log, "boot: loading torch", seen, "loading torch")
        if status in (Run.Status.RUNNING, Run.Status.SUCCEEDED):
            seen.setdefault("run started", time.monotonic())
        if Span.objects.filter(run_id=run.pk).exists():
            seen["first span"] = time.monotonic()
        time.sleep(0.02)
    while Run.objects.filter(pk=run.pk).exclude(status__in=Run.FINISHED).exists():  # the worker is free again
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"run {run.pk} did not finish within {timeout:.0f}s")
        time.sleep(0.1)
    return {name: seen.get(name, seen["first span"]) - t0 for name in PHASES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with bench_database(), tempfile.TemporaryDirectory() as run_dir:
        import yaml
        from django.conf import settings
        from django.contrib.auth import get_user_model

        from controller.celery import app
        from controller.embedded_worker import EmbeddedWorker
        from controller.models import Experiment, Schedule

        settings.THUNDERSYNC_RUN_DIR = Path(run_dir)
        root = Path(__file__).resolve().parents[1]
        user = get_user_model().objects.create_user("first-span", password="x")
        config = yaml.safe_load((root / "configs" / "quickstart.yaml").read_text())
        experiment = Experiment.objects.create(owner=user, name="first span", config=config)
        schedule = Schedule.objects.create(owner=None, name="streaming", kind="streaming")
        with app.connection_for_write() as conn:
            conn.default_channel.queue_purge("runs")
        worker = EmbeddedWorker(app, queues=["runs"]).start()
        try:
            results = [one_launch(experiment, schedule) for _ in range(args.repeats + 1)][1:]  # 1st: model cache
        finally:
            worker.stop(timeout=120)
    print(f"launch -> first span, {args.repeats} repeats after one untimed (model cache); "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for name in PHASES:
        values = [r[name] for r in results]
        print(f"  {name:16s} median {statistics.median(values):5.2f} s   ({', '.join(f'{v:.2f}' for v in values)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
