"""Does a viewer slow a run? Step medians of one small run with a run page open in a headless
chromium vs none, side by side: the same config launched through the app, the two arms
alternating (ABBA: none, viewer, then viewer, none) over ``--rounds``.

The app is the production shape of bench/web/app_vs_cli.py (a fresh PostgreSQL database, an empty
Redis index, a Celery worker process with its warm runner, daphne; all stopped and dropped on
exit). The viewer is Debian's chromium (tests/harness/web_harness.py's flags) logged in with the
API client's session, on ``/runs/<id>/`` from before the run starts until it ends: the websocket
replay, live spans, the Gantt's redraws and the charts, as a researcher keeps it open. Its page
must have drawn spans (``#spans-drawn``) or the run does not count.

Arms: ``none``; ``viewer``; ``viewer_nice``, the same chromium at nice 19, so that where the run
shares its cores with the browser (here: 2 cores), the browser's own rendering yields to the
learner, as it would on the researcher's own machine. Per run the CPU seconds of chromium (its
whole process tree; of which opening the page: loading plotly and the first draw) and of daphne
are recorded beside the step median, to say where a slowdown comes from: the browser's work or
the app's serving of it.

A run's figure is its median ``timing_s/step`` over steps 1.. (step 0 is a warm-up); an arm's is
the median of its runs; ratio = arm / none. Config: configs/bench.yaml with train.steps 8,
train.prompts_per_step 8, task.tool_latency.scale 0.3.

    .venv/bin/python -m bench.web.viewer_overhead [--rounds 3] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psutil
import yaml
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from bench.web.app_vs_cli import RUN_TIMEOUT_S, production_app, step_median
from bench.load_report import finish

ROOT = Path(__file__).resolve().parents[2]
ARMS = ("none", "viewer", "viewer_nice")
SCHEDULE = "streaming"
PAGE_TIMEOUT_MS = 60_000


def small_config() -> dict:
    config = yaml.safe_load((ROOT / "configs" / "bench.yaml").read_text())
    config["task"]["tool_latency"]["scale"] = 0.3
    config["train"].update(prompts_per_step=8, steps=8)
    return config


@contextmanager
def chromiums(tmp: Path, nices: dict[str, int]):
    """{arm: a headless chromium at that niceness} for every viewer run of the arm (all closed on
    every exit path); a niced one starts through a wrapper, so its renderers, forked from it,
    inherit the niceness."""
    from playwright.sync_api import sync_playwright

    from tests.harness.web_harness import CHROMIUM, CHROMIUM_ARGS

    with sync_playwright() as playwright, ExitStack() as stack:
        browsers = {}
        for arm, nice in nices.items():
            executable = Path(CHROMIUM)
            if nice:
                executable = tmp / f"chromium-nice-{nice}"
                executable.write_text(f'#!/bin/sh\nexec nice -n {nice} {CHROMIUM} "$@"\n')
                executable.chmod(0o755)
            browsers[arm] = playwright.chromium.launch(executable_path=str(executable), args=CHROMIUM_ARGS)
            stack.callback(browsers[arm].close)
        yield browsers


def cpu_seconds(match: str) -> float:
    """User + system CPU seconds of this process's descendants whose command line has ``match``
    (their children that exited and were reaped counted in too)."""
    total = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            if match in " ".join(proc.cmdline()):
                t = proc.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


def wait_run(app, run_id: int) -> dict:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    run = app.call("GET", f"/api/runs/{run_id}/")
    while run["status"] not in ("succeeded", "failed", "cancelled"):
        if time.monotonic() > deadline:
            app.call("POST", f"/api/runs/{run_id}/cancel/")
            raise SystemExit(f"run {run_id} did not finish within {RUN_TIMEOUT_S:.0f}s")
        time.sleep(0.5)
        run = app.call("GET", f"/api/runs/{run_id}/")
    if run["status"] != "succeeded":
        raise SystemExit(f"run {run_id} {run['status']}: {run['error'][:1000]}")
    return run


def one_run(app, schedule_id: int, browser=None) -> dict:
    """Launch a run (with a page open on it when ``browser``) and wait for it: its step median,
    the spans the page drew (None without a viewer) and the CPU seconds chromium and daphne used."""
    run = app.call("POST", "/api/runs/", experiment=app.experiment, schedule=schedule_id)
    drawn, cpu0 = None, {name: cpu_seconds(name) for name in ("chromium", "daphne")}
    with ExitStack() as stack:
        if browser is not None:
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            stack.callback(context.close)
            context.add_cookies([{"name": "sessionid", "value": app.http.cookies["sessionid"], "url": app.base}])
            page = context.new_page()
            problems: list[str] = []
            page.on("pageerror", lambda err: problems.append(str(err)))
            page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
            page.goto(f"{app.base}/runs/{run['id']}/", timeout=PAGE_TIMEOUT_MS)
            page.wait_for_function("window.Plotly && document.querySelector('#gantt .main-svg')", timeout=PAGE_TIMEOUT_MS)
        loaded = cpu_seconds("chromium") - cpu0["chromium"]  # opening the page: plotly parsed, first draw
        wait_run(app, run["id"])
        cpu = {f"{name}_cpu_s": cpu_seconds(name) - cpu0[name] for name in cpu0}  # the run's own, not the tail
        cpu["chromium_page_load_cpu_s"] = loaded
        if browser is not None:
            try:  # the last frames and the throttled redraw land after the run ends
                page.wait_for_function("Number(document.getElementById('gantt').dataset.drawnSpans || 0) > 0",
                                       timeout=PAGE_TIMEOUT_MS)
            except PlaywrightTimeout:
                raise SystemExit(f"run {run['id']}: the viewer drew no spans ({problems[-3:]})") from None
            drawn = int(re.sub(r"\D", "", page.inner_text("#spans-drawn")) or 0)
    metrics = app.call("GET", f"/api/runs/{run['id']}/metrics/")["metrics"]
    if len(metrics) < 3:
        raise SystemExit(f"run {run['id']}: {len(metrics)} steps stored")
    steps = [m["values"]["timing_s/step"] for m in metrics]
    return {"step_median_s": step_median(steps), "steps": len(steps), "spans_drawn": drawn, **cpu}


def measure(rounds: int, tmp: Path) -> dict:
    """Every arm once per round, the order rotating each round (none first, then last, ...)."""
    out: dict = {"runs": {arm: [] for arm in ARMS}}
    with ExitStack() as stack:
        app = production_app(stack, tmp)
        app.experiment = app.call("POST", "/api/experiments/", name="viewer overhead", config=small_config())["id"]
        schedule = app.call("POST", "/api/schedules/", name=f"viewer-overhead {SCHEDULE}", kind=SCHEDULE)["id"]
        browsers = {"none": None, **stack.enter_context(chromiums(tmp, {"viewer": 0, "viewer_nice": 19}))}
        one_run(app, schedule)  # untimed: model cache, warm runner ready
        for n in range(rounds):
            shift = n % len(ARMS)
            for arm in ARMS[shift:] + ARMS[:shift]:
                row = {**one_run(app, schedule, browsers[arm]), "load": os.getloadavg()[0]}
                out["runs"][arm].append(row)
                drawn = f"; {row['spans_drawn']} spans drawn" if row["spans_drawn"] else ""
                print(f"round {n + 1} {arm:11s} step median {row['step_median_s']:.3f} s (load {row['load']:.1f}; "
                      f"cpu s chromium {row['chromium_cpu_s']:.1f} ({row['chromium_page_load_cpu_s']:.1f} opening the "
                      f"page), daphne {row['daphne_cpu_s']:.1f}{drawn})", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers and chromium on kill too
    out = {"config": "configs/bench.yaml + tool_latency.scale 0.3, prompts_per_step 8, steps 8; streaming; "
                     "production shape (PostgreSQL, Redis, Celery worker, daphne)",
           "rounds": args.rounds, "cpus": os.cpu_count(), "load_start": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp:
        out.update(measure(args.rounds, Path(tmp)))
    medians = {arm: statistics.median(r["step_median_s"] for r in out["runs"][arm]) for arm in ARMS}
    out["step_median_s"] = medians
    out["ratio_over_none"] = {arm: medians[arm] / medians["none"] for arm in ARMS[1:]}
    # the run-to-run spread of the arm without a viewer: a ratio inside it is noise
    none = [r["step_median_s"] for r in out["runs"]["none"]]
    out["none_spread"] = (max(none) - min(none)) / medians["none"] if len(none) > 1 else None
    for arm in ARMS[1:]:
        cpu = statistics.median(r["chromium_cpu_s"] for r in out["runs"][arm])
        print(f"{arm:11s} {medians[arm]:.3f} s / none {medians['none']:.3f} s = {out['ratio_over_none'][arm]:.3f} "
              f"(chromium {cpu:.1f} cpu s a run)")
    if out["none_spread"] is not None:
        print(f"runs without a viewer spread {100 * out['none_spread']:.0f}% around their median")
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
