"""Launch to first span on the embedded default, with and without the warm runner, side by side.

The embedded default as ``./run demo`` runs it: SQLite (a temporary file), the in-memory channel
layer, Celery's in-memory broker and its worker thread in this process (``EmbeddedWorker``), which
starts the warm runner (controller/supervision/warm.py). ``launch_run`` (as the form and the API call it)
enqueues each run; the bench watches the database and the learner's log for each phase. Repeats
alternate cold (``THUNDERSYNC_WARM_RUNNER`` off for that launch: ``thundersync`` started as a new
process) and warm (forked by the runner), after one untimed run that builds the model cache and
once the runner is ready. Phases, each from the launch:

    claimed -> interpreter up ("boot: starting" cold, "boot: forked" warm) -> "boot: loading"
    (workers started, config checked; torch is imported from here on cold, already warm) -> run started (models loaded, fleet up) -> first span stored

    .venv/bin/python -m bench.web.first_span [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PHASES = ("claimed", "interpreter up", "loading torch", "run started", "first span")


def log_line_time(path: Path, prefixes: tuple[str, ...], seen: dict, name: str) -> None:
    if name not in seen and path.exists() and any(line.startswith(prefixes) for line in path.read_text().splitlines()):
        seen[name] = time.monotonic()


def one_launch(experiment, schedule, warm: bool, timeout: float = 600.0) -> dict[str, float]:
    from django.conf import settings

    from controller.supervision.launching import launch_run
    from controller.models import Run, Span
    from controller.supervision.runlog import log_path

    settings.THUNDERSYNC_WARM_RUNNER = warm
    t0 = time.monotonic()
    run = launch_run(experiment, schedule, steps=1, name=f"first span ({'warm' if warm else 'cold'})")
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
        log_line_time(log, ("boot: starting", "boot: forked"), seen, "interpreter up")
        log_line_time(log, ("boot: loading ",), seen, "loading torch")
        if status in (Run.Status.RUNNING, Run.Status.SUCCEEDED):
            seen.setdefault("run started", time.monotonic())
        if Span.objects.filter(run_id=run.pk).exists():
            seen["first span"] = time.monotonic()
        time.sleep(0.02)
    while Run.objects.filter(pk=run.pk).exclude(status__in=Run.FINISHED).exists():  # the worker is free again
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"run {run.pk} did not finish within {timeout:.0f}s")
        time.sleep(0.1)
    forked = "boot: forked from the warm runner" in log.read_text()
    if forked != warm:
        raise SystemExit(f"run {run.pk}: expected a {'warm' if warm else 'cold'} start, the log says otherwise")
    return {name: seen.get(name, seen["first span"]) - t0 for name in PHASES}


def wait_for_runner(timeout: float = 300.0) -> float:
    from controller.supervision import warm

    t0 = time.monotonic()
    while not warm.socket_path(os.getpid()).exists():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"the warm runner was not ready within {timeout:.0f}s")
        time.sleep(0.05)
    return time.monotonic() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="launches per arm")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DJANGO_SETTINGS_MODULE"] = "controller.settings.embedded"
        os.environ["THUNDERSYNC_SQLITE"] = str(Path(tmp) / "bench.sqlite3")
        import django

        django.setup()
        import yaml
        from django.conf import settings
        from django.contrib.auth import get_user_model
        from django.core.management import call_command

        from controller.celery import app
        from controller.supervision.embedded_worker import EmbeddedWorker
        from controller.models import Experiment, Schedule

        call_command("migrate", interactive=False, verbosity=0)
        settings.THUNDERSYNC_RUN_DIR = Path(tmp) / "runs"
        settings.THUNDERSYNC_WARM_RUNNER = True
        user = get_user_model().objects.create_user("first-span", password="x")
        config = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
        experiment = Experiment.objects.create(owner=user, name="first span", config=config)
        schedule = Schedule.objects.create(owner=None, name="streaming", kind="streaming")
        worker = EmbeddedWorker(app, queues=["runs"]).start()  # starts the warm runner
        try:
            one_launch(experiment, schedule, warm=False)  # untimed: builds the model cache
            ready_s = wait_for_runner()
            results: dict[bool, list[dict]] = {False: [], True: []}
            for _ in range(args.repeats):
                for warm in (False, True):
                    results[warm].append(one_launch(experiment, schedule, warm))
        finally:
            settings.THUNDERSYNC_WARM_RUNNER = True
            worker.stop(timeout=120)
    print(f"launch -> first span on the embedded default, {args.repeats} launches per arm, alternating; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; the warm runner was ready "
          f"{ready_s:.1f}s after the first run")
    for name in PHASES:
        cells = []
        for warm in (False, True):
            values = [r[name] for r in results[warm]]
            cells.append(f"{'warm' if warm else 'cold'} {statistics.median(values):5.2f} s "
                         f"({', '.join(f'{v:.2f}' for v in values)})")
        print(f"  {name:16s} " + "   ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
