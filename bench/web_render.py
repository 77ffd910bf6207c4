"""Render time of a large run page: 10 steps x 256 trajectories (~30k spans) in the database,
loaded in headless chromium, timed from navigation start until the Gantt reports every span
drawn. Target: <= 1.5 s.

    .venv/bin/python bench/web_render.py [--repeats 3]

Needs PostgreSQL and Redis as for the tests (controller.settings.test) and /usr/bin/chromium.
"""

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.web_harness import agent_run_events, asgi_server, bench_database, bench_run, launch_chromium, log_in  # noqa: E402

TARGET_S = 1.5


def store_run(run, spans, metrics) -> None:
    from controller.ingestion import span_from_event
    from controller.models import Span, StepMetric

    Span.objects.bulk_create([span_from_event(run.pk, e) for e in spans], batch_size=5000)
    StepMetric.objects.bulk_create([StepMetric(run=run, step=m["step"], values=m["values"]) for m in metrics])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--groups", type=int, default=32, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    with bench_database():
        run = bench_run("succeeded")
        spans, metrics = agent_run_events(args.steps, args.groups, args.group_size, workers=4, slots=8)
        store_run(run, spans, metrics)
        n = len(spans)
        print(f"run {run.pk}: {args.steps} steps x {args.groups * args.group_size} trajectories, {n} spans stored")
        with asgi_server() as url, sync_playwright() as p:
            browser = launch_chromium(p)
            context = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = context.new_page()
            log_in(page, url, "bench", "bench-password")
            times = []
            for i in range(args.repeats + 1):  # the first load warms the server and the browser cache
                page.close()  # a fresh page per load, as a user opening the run
                page = context.new_page()
                page.goto(f"{url}/runs/{run.pk}/")
                page.wait_for_function(f"window.__thundersync && window.__thundersync.state().spansDrawn === {n}",
                                       timeout=120_000, polling=10)
                timing = page.evaluate("""() => {
                    const nav = performance.getEntriesByType('navigation')[0];
                    const frames = window.__thundersync.frames();
                    const drawn = Math.max(...frames.map(f => f.drawnMs)) - performance.timeOrigin;
                    const draws = window.__thundersync.draws();
                    const last = draws[draws.length - 1];
                    return {dcl: nav.domContentLoadedEventEnd, first_frame: frames[0].recvMs - performance.timeOrigin,
                            last_frame: frames[frames.length - 1].recvMs - performance.timeOrigin, drawn,
                            last_draw_ms: last.endMs - last.startMs, bars: window.__thundersync.state().barsDrawn};
                }""")
                label = "warm-up" if i == 0 else f"load {i}"
                print(f"{label}: drawn {timing['drawn'] / 1000:.3f} s (DOMContentLoaded {timing['dcl'] / 1000:.3f} s, "
                      f"first frame {timing['first_frame'] / 1000:.3f} s, last frame {timing['last_frame'] / 1000:.3f} s, "
                      f"final redraw {timing['last_draw_ms']:.0f} ms, {timing['bars']} bars)")
                if i:
                    times.append(timing["drawn"] / 1000)
            browser.close()
    median = statistics.median(times)
    print(f"render time, median of {len(times)}: {median:.3f} s (target <= {TARGET_S} s): "
          f"{'OK' if median <= TARGET_S else 'OVER TARGET'}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
