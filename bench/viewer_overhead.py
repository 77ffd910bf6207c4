"""Does a viewer slow a run? Step medians of one small run with a run page open in a headless
chromium vs none, side by side: the same config launched through the app, the two arms
alternating (ABBA: none, viewer, then viewer, none) over ``--rounds``.

The app is the production shape of bench/app_vs_cli.py (a fresh PostgreSQL database, an empty
Redis index, a Celery worker process with its warm runner, daphne; all stopped and dropped on
exit). The viewer is Debian's chromium (tests/harness/web_harness.py's flags) logged in with the
API client's session, on ``/runs/<id>/`` from before the run starts until it ends: the websocket
replay, live spans, the Gantt's redraws and the charts, as a researcher keeps it open. Its page
must have drawn spans (``#spans-drawn``) or the run does not count.

A run's figure is its median ``timing_s/step`` over steps 1.. (step 0 is a warm-up); an arm's is
the median of its runs; ratio = viewer / none. Config: configs/bench.yaml with train.steps 8,
train.prompts_per_step 8, task.tool_latency.scale 0.3.

    .venv/bin/python -m bench.viewer_overhead [--rounds 3] [--json FILE]
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

import yaml
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from bench.app_vs_cli import RUN_TIMEOUT_S, production_app, step_median
from bench.load_report import finish

ROOT = Path(__file__).resolve().parents[1]
ARMS = ("none", "viewer")
SCHEDULE = "streaming"
PAGE_TIMEOUT_MS = 60_000


def small_config() -> dict:
    config = yaml.safe_load((ROOT / "configs" / "bench.yaml").read_text())
    config["task"]["tool_latency"]["scale"] = 0.3
    config["train"].update(prompts_per_step=8, steps=8)
    return config


@contextmanager
def chromium():
    """One headless chromium for every viewer run (closed on every exit path)."""
    from playwright.sync_api import sync_playwright

    from tests.harness.web_harness import launch_chromium

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        try:
            yield browser
        finally:
            browser.close()


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


def one_run(app, schedule_id: int, browser=None) -> tuple[list[float], int | None]:
    """Launch a run (with a page open on it when ``browser``) and wait for it: (its step times,
    the spans the page drew, None without a viewer)."""
    run = app.call("POST", "/api/runs/", experiment=app.experiment, schedule=schedule_id)
    drawn = None
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
            page.wait_for_selector("#gantt", timeout=PAGE_TIMEOUT_MS)
        wait_run(app, run["id"])
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
    return [m["values"]["timing_s/step"] for m in metrics], drawn


def measure(rounds: int, tmp: Path) -> dict:
    out: dict = {"step_medians_s": {arm: [] for arm in ARMS}, "loads": {arm: [] for arm in ARMS}, "spans_drawn": []}
    with ExitStack() as stack:
        app = production_app(stack, tmp)
        app.experiment = app.call("POST", "/api/experiments/", name="viewer overhead", config=small_config())["id"]
        schedule = app.call("POST", "/api/schedules/", name=f"viewer-overhead {SCHEDULE}", kind=SCHEDULE)["id"]
        browser = stack.enter_context(chromium())
        one_run(app, schedule)  # untimed: model cache, warm runner ready
        for n in range(rounds):
            for arm in (ARMS if n % 2 == 0 else ARMS[::-1]):
                steps, drawn = one_run(app, schedule, browser if arm == "viewer" else None)
                load = os.getloadavg()[0]
                out["step_medians_s"][arm].append(step_median(steps))
                out["loads"][arm].append(load)
                if drawn is not None:
                    out["spans_drawn"].append(drawn)
                print(f"round {n + 1} {arm:6s} step median {out['step_medians_s'][arm][-1]:.3f} s over "
                      f"{len(steps) - 1} steps (load {load:.1f}{f', {drawn} spans drawn' if drawn else ''})", flush=True)
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
    medians = {arm: statistics.median(out["step_medians_s"][arm]) for arm in ARMS}
    out["ratio_viewer_over_none"] = medians["viewer"] / medians["none"]
    # the run-to-run spread of the arm without a viewer: a ratio inside it is noise
    none = out["step_medians_s"]["none"]
    out["none_spread"] = (max(none) - min(none)) / medians["none"] if len(none) > 1 else None
    spread = "n/a" if out["none_spread"] is None else f"{100 * out['none_spread']:.0f}%"
    print(f"step median: viewer {medians['viewer']:.3f} s / none {medians['none']:.3f} s = "
          f"{out['ratio_viewer_over_none']:.3f} (runs without a viewer spread {spread})")
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
