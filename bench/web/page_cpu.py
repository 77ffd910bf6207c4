"""Where a run page's CPU goes, load-independent: chromium's CPU seconds (its whole process tree)
and the page's own main-thread time (CDP Performance metrics: script, layout, style) to open the
page of a run at launch and follow it live to its end, then to open the same run's page once it
has finished (the websocket replay of every span and metric), with the Plotly.react/newPlot calls
the page made and the bytes it received (HTTP bodies, websocket frames).

The app is bench/web/viewer_overhead.py's: the production shape (PostgreSQL, Redis, a Celery worker
with its warm runner, daphne), configs/bench.yaml with 8 prompts and 8 steps, streaming; the
browser Debian's chromium with tests/harness/web_harness.py's flags, a fresh context per visit
(no caches, as the viewer bench). CPU seconds count work, not wall time, so they hold on a loaded
machine too; ``--profile`` adds a V8 sampling profile's top functions per phase.

    .venv/bin/python -m bench.web.page_cpu [--visits 2] [--steps 8] [--profile] [--json FILE]

Each live visit also reports how far the Gantt was behind the tiles (``lag``: the step gap, span
frames received but not yet drawn, and their age in seconds, p50/p95/max over 100 ms samples, and
the share of samples with the "catching up" marker shown).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

from bench.web.app_vs_cli import production_app
from bench.load_report import finish
from tests.harness.web_harness import DEBUG_FLAG
from bench.web.viewer_overhead import PAGE_TIMEOUT_MS, SCHEDULE, cpu_seconds, small_config, wait_run

# Counts the page's plotly draws: window.Plotly is wrapped as plotly.min.js assigns it.
COUNT_DRAWS = """
window.__plotlyCalls = {react: 0, newPlot: 0, extendTraces: 0, relayout: 0};
(() => {
  let real;
  Object.defineProperty(window, "Plotly", { configurable: true, get: () => real, set: (p) => {
    for (const name of Object.keys(window.__plotlyCalls)) {
      const fn = p[name];
      if (typeof fn === "function") p[name] = function (...args) { window.__plotlyCalls[name]++; return fn.apply(this, args); };
    }
    real = p;
  }});
})();
"""
# How far the Gantt is behind the tiles, sampled on the page every 100 ms while a run is live:
# the step the progress tile says is training minus the Gantt's newest drawn step (#run-app's
# data-last-step), and the span frames received but not yet in a Gantt redraw (count, and the
# age of the oldest: the debug hook's frame log). Only the existing debug hooks are read, so the
# same sampler measures an older page too.
LAG_SAMPLER = """
window.__lag = [];
document.addEventListener("DOMContentLoaded", () => {
  const root = document.getElementById("run-app");
  if (!root) return;
  setInterval(() => {
    const hook = window.__thundersync;
    if (!hook || !hook.state().replayDone || ["succeeded", "failed", "cancelled"].includes(root.dataset.status)) return;
    const text = document.getElementById("progress").textContent;
    const m = /(\\d+) \\/ \\d+ steps/.exec(text) || /all (\\d+) steps done/.exec(text);
    const now = performance.timeOrigin + performance.now();
    const waiting = hook.frames().filter((f) => f.drawnMs === null);
    const marker = document.getElementById("gantt-behind");
    window.__lag.push({
      gap: m && root.dataset.lastStep ? Number(m[1]) - Number(root.dataset.lastStep) : null,
      frames: waiting.length, seconds: waiting.length ? (now - Math.min(...waiting.map((f) => f.recvMs))) / 1000 : 0,
      marker: Boolean(marker && !marker.hidden),
    });
  }, 100);
});
"""


def lag_summary(samples: list[dict]) -> dict:
    """Max and p95 of the step gap, frames behind and seconds behind over the live samples."""
    def stats(values):
        if not values:
            return None
        values = sorted(values)
        return {"p50": values[len(values) // 2], "p95": values[min(len(values) - 1, int(0.95 * len(values)))],
                "max": values[-1]}
    gaps = [s["gap"] for s in samples if s["gap"] is not None]
    return {"samples": len(samples), "step_gap": stats(gaps),
            "frames_behind": stats([s["frames"] for s in samples]),
            "seconds_behind": stats([round(s["seconds"], 2) for s in samples]),
            "marker_shown": round(sum(s["marker"] for s in samples) / max(1, len(samples)), 2)}


MAIN_THREAD = ("TaskDuration", "ScriptDuration", "LayoutDuration", "RecalcStyleDuration")


class Visit:
    """One page in a fresh context, with CDP's Performance domain (and the profiler) on."""

    def __init__(self, browser, app, profile: bool, trace: str | None = None):
        self.browser, self.trace = browser, trace
        self.context = browser.new_context(viewport={"width": 1400, "height": 1000})
        self.context.add_cookies([{"name": "sessionid", "value": app.http.cookies["sessionid"], "url": app.base}])
        self.page = self.context.new_page()
        self.page.add_init_script(COUNT_DRAWS)
        self.page.add_init_script(DEBUG_FLAG)  # the frame log the lag sampler reads
        self.page.add_init_script(LAG_SAMPLER)
        if trace:
            browser.start_tracing(page=self.page, path=trace, categories=[
                "devtools.timeline", "toplevel", "v8", "blink", "cc", "gpu", "disabled-by-default-devtools.timeline"])
        self.errors: list[str] = []
        self.page.on("pageerror", lambda err: self.errors.append(str(err)))
        self.bytes = Counter()
        self.page.on("response", self._response)
        self.page.on("websocket", lambda ws: ws.on("framereceived", lambda f: self.bytes.update(
            {"websocket": len(f if isinstance(f, (bytes, str)) else str(f))})))
        self.cdp = self.context.new_cdp_session(self.page)
        self.cdp.send("Performance.enable")
        self.profile = profile
        self.base = self._metrics()
        self.cpu0 = cpu_seconds("chromium")
        if profile:
            self.cdp.send("Profiler.enable")
            self.cdp.send("Profiler.setSamplingInterval", {"interval": 500})
            self.cdp.send("Profiler.start")

    def _response(self, response):
        try:
            self.bytes.update({response.url.rsplit("/", 2)[-2] if response.url.endswith("/") else
                               response.url.rsplit("/", 1)[-1].split("?")[0]: len(response.body())})
        except Exception:  # a redirect or an aborted body has none
            pass

    def _metrics(self) -> dict:
        return {m["name"]: m["value"] for m in self.cdp.send("Performance.getMetrics")["metrics"]}

    def phase(self) -> dict:
        """CPU and main-thread seconds since the last phase, the plotly calls so far, top functions."""
        now, cpu = self._metrics(), cpu_seconds("chromium")
        out = {"chromium_cpu_s": round(cpu - self.cpu0, 2),
               **{k: round(now.get(k, 0) - self.base.get(k, 0), 2) for k in MAIN_THREAD},
               "plotly_calls": self.page.evaluate("({...window.__plotlyCalls})"),
               "bytes": dict(self.bytes)}
        self.base, self.cpu0 = now, cpu
        if self.profile:
            out["top"] = top_functions(self.cdp.send("Profiler.stop")["profile"])
            self.cdp.send("Profiler.start")
        return out

    def close(self):
        if self.trace:
            self.browser.stop_tracing()
        self.context.close()


def top_functions(profile: dict, n: int = 15) -> list[str]:
    """Self time per function (ms), largest first, from a CDP sampling profile."""
    nodes = {node["id"]: node for node in profile["nodes"]}
    self_us = Counter()
    for sample, delta in zip(profile["samples"], profile["timeDeltas"]):
        frame = nodes[sample]["callFrame"]
        name = f"{frame['functionName'] or '(anon)'} {frame['url'].rsplit('/', 1)[-1]}:{frame['lineNumber']}"
        self_us[name] += delta
    busy = sum(us for name, us in self_us.items() if not name.startswith("(idle)"))
    return [f"{busy / 1000:.0f} ms busy"] + [f"{us / 1000:.0f} ms {name}" for name, us in self_us.most_common(n)]


def visit_live(browser, app, schedule: int, profile: bool, trace=None) -> dict:
    """Launch a run with its page open: opening (until plotly drew the Gantt) and live (to the end)."""
    run = app.call("POST", "/api/runs/", experiment=app.experiment, schedule=schedule)
    visit = Visit(browser, app, profile, trace)
    try:
        visit.page.goto(f"{app.base}/runs/{run['id']}/", timeout=PAGE_TIMEOUT_MS)
        visit.page.wait_for_function("window.Plotly && document.querySelector('#gantt .main-svg')", timeout=PAGE_TIMEOUT_MS)
        opening = visit.phase()
        wait_run(app, run["id"])
        visit.page.wait_for_function("Number(document.getElementById('gantt').dataset.drawnSpans || 0) > 0",
                                     timeout=PAGE_TIMEOUT_MS)
        visit.page.wait_for_timeout(1500)  # the last throttled redraws after the run's end
        live = visit.phase()
        live["lag"] = lag_summary(visit.page.evaluate("window.__lag"))
        if visit.errors:
            raise SystemExit(f"run page errors: {visit.errors[:3]}")
        return {"run": run["id"], "opening": opening, "live": live}
    finally:
        visit.close()


def visit_finished(browser, app, run_id: int, profile: bool, trace=None) -> dict:
    """Open a finished run's page: until the Gantt drew its spans and the charts drew, + 1.5 s."""
    visit = Visit(browser, app, profile, trace)
    try:
        visit.page.goto(f"{app.base}/runs/{run_id}/", timeout=PAGE_TIMEOUT_MS)
        visit.page.wait_for_function("Number(document.getElementById('gantt').dataset.drawnSpans || 0) > 0"
                                     " && document.querySelector('#chart-reward .main-svg')", timeout=PAGE_TIMEOUT_MS)
        visit.page.wait_for_timeout(1500)
        out = visit.phase()
        if visit.errors:
            raise SystemExit(f"run page errors: {visit.errors[:3]}")
        return out
    finally:
        visit.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--visits", type=int, default=2)
    parser.add_argument("--profile", action="store_true", help="V8 sampling profile's top functions per phase")
    parser.add_argument("--trace", help="write chromium traces (one per visit) under this folder")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--steps", type=int, default=8, help="train.steps of the live runs")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out = {"config": f"configs/bench.yaml + tool_latency.scale 0.3, prompts_per_step 8, steps {args.steps}; streaming; "
                     "production shape", "cpus": os.cpu_count(), "load_start": os.getloadavg()[0],
           "live": [], "finished": []}
    from playwright.sync_api import sync_playwright

    from tests.harness.web_harness import CHROMIUM, CHROMIUM_ARGS

    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        app = production_app(stack, Path(tmp))
        config = small_config()
        config["train"]["steps"] = args.steps
        app.experiment = app.call("POST", "/api/experiments/", name="page cpu", config=config)["id"]
        schedule = app.call("POST", "/api/schedules/", name=f"page-cpu {SCHEDULE}", kind=SCHEDULE)["id"]
        playwright = stack.enter_context(sync_playwright())
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        stack.callback(browser.close)
        last = None
        for n in range(args.visits):
            row = visit_live(browser, app, schedule, args.profile,
                             args.trace and f"{args.trace}/live-{n + 1}.json")
            out["live"].append(row)
            last = row["run"]
            print(f"live {n + 1}: opening {row['opening']}\n        live {row['live']}", flush=True)
        for n in range(args.visits):
            row = visit_finished(browser, app, last, args.profile,
                                 args.trace and f"{args.trace}/finished-{n + 1}.json")
            out["finished"].append(row)
            print(f"finished {n + 1}: {row}", flush=True)
    for key, rows in (("opening", [r["opening"] for r in out["live"]]), ("live", [r["live"] for r in out["live"]]),
                      ("finished", out["finished"])):
        out[f"{key}_chromium_cpu_s"] = statistics.median(r["chromium_cpu_s"] for r in rows)
        print(f"{key:8s} chromium {out[f'{key}_chromium_cpu_s']:.2f} CPU s (median of {len(rows)})")
    return finish(out, args.json)


if __name__ == "__main__":
    sys.exit(main())
