"""Span-to-browser latency at a sustained span rate (default 2,000 spans/s).

Spans go through the real path: JSONL lines into controller.ingest.ingestion.RunIngestor (as the
supervisor feeds them), bulk insert into PostgreSQL, frames through the Redis channel layer,
the websocket consumer in a separate daphne process, and a headless chromium run page that
stamps each frame when its handler runs. Latency of a span = page receive time - the
moment its line was fed to the ingestor, both epoch clocks of this machine (Python
time.time(), browser performance.timeOrigin + performance.now()). Also reported: latency
until the Gantt redraw that contains the span finished. Target: receive p95 <= 250 ms.

    .venv/bin/python -m bench.web.web_latency [--rate 2000] [--seconds 10]
"""

import argparse
import os
import json
import statistics
import sys
import threading
import time

from tests.harness.web_harness import (
    DEBUG_FLAG, agent_run_events, asgi_server, bench_database, bench_run, launch_chromium, log_in,
)

TARGET_P95_MS = 250.0


def record_publish_times(published: dict[int, float]) -> None:
    """Wrap the ingestor's publish so each span's hand-off to the channel layer is timed too."""
    from controller.ingest import ingestion

    publish = ingestion.live.publish

    def timed(run_id, frame):
        publish(run_id, frame)
        if frame["type"] == "spans":
            now = time.time() * 1000.0
            for span in frame["spans"]:
                published[span["seq"]] = now

    ingestion.live = type("TimedLive", (), {"publish": staticmethod(timed)})


def feed_at_rate(run_id: int, events: list[dict], rate: float, flush_s: float, flush_spans: int) -> dict[int, float]:
    """Feed span lines to a RunIngestor at ``rate`` per second; returns seq -> feed time (epoch ms)."""
    from django.db import connections

    from controller.ingest import ingestion

    ingestor = ingestion.RunIngestor(run_id, flush_s, flush_spans)
    sent: dict[int, float] = {}
    start = time.monotonic()
    for i, event in enumerate(events):
        due = start + i / rate
        while (ahead := due - time.monotonic()) > 0:
            time.sleep(min(ahead, 0.002))
        ingestor.flush_if_due()
        sent[event["seq"]] = time.time() * 1000.0
        ingestor.feed(json.dumps(event))
        ingestor.flush_if_due()
    ingestor.flush()
    connections.close_all()
    return sent


def percentiles(values: list[float]) -> str:
    q = statistics.quantiles(values, n=100, method="inclusive")
    return f"p50 {q[49]:.0f} ms, p95 {q[94]:.0f} ms, p99 {q[98]:.0f} ms, max {max(values):.0f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=2000.0, help="spans per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--flush-s", type=float, default=None, help="ingestor flush period (default: settings)")
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    with bench_database():
        from django.conf import settings

        flush_s = settings.THUNDERSYNC_INGEST_FLUSH_S if args.flush_s is None else args.flush_s
        run = bench_run("running")
        total = int(args.rate * args.seconds)
        spans, _ = agent_run_events(steps=20, groups=32, group_size=8, workers=4, slots=8)
        if len(spans) < total:
            raise SystemExit(f"--rate x --seconds asks for {total} spans; the workload has {len(spans)}")
        events = spans[:total]
        with asgi_server() as url, sync_playwright() as p:
            browser = launch_chromium(p)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.add_init_script(DEBUG_FLAG)  # frame and draw timings (docs/pages.md, "Debug flag")
            log_in(page, url, "bench", "bench-password")
            page.goto(f"{url}/runs/{run.pk}/")
            page.wait_for_function("window.__thundersync.state().replayDone && window.__thundersync.state().open")
            result: dict = {}
            published: dict[int, float] = {}
            record_publish_times(published)
            # Its own thread: Playwright's sync API keeps an asyncio loop on this one, and the
            # ingestor publishes through async_to_sync.
            feeder = threading.Thread(target=lambda: result.update(sent=feed_at_rate(
                run.pk, events, args.rate, flush_s, settings.THUNDERSYNC_INGEST_FLUSH_SPANS)))
            t0 = time.monotonic()
            feeder.start()
            feeder.join()
            fed_s = time.monotonic() - t0
            page.wait_for_function(f"window.__thundersync.state().spansDrawn === {total}", timeout=120_000)
            frames = page.evaluate("window.__thundersync.frames()")
            draws = page.evaluate("window.__thundersync.draws()")
            browser.close()
    sent = result["sent"]
    received, drawn, to_layer, from_layer = [], [], [], []
    for f in frames:
        for seq in range(f["firstSeq"], f["lastSeq"] + 1):
            received.append(f["recvMs"] - sent[seq])
            drawn.append(f["drawnMs"] - sent[seq])
            to_layer.append(published[seq] - sent[seq])
            from_layer.append(f["recvMs"] - published[seq])
    assert len(received) == total, (len(received), total)
    p95 = statistics.quantiles(received, n=100, method="inclusive")[94]
    print(f"{total} spans fed in {fed_s:.2f} s ({total / fed_s:.0f} spans/s), ingestor flush every {flush_s} s "
          f"or {settings.THUNDERSYNC_INGEST_FLUSH_SPANS} spans; {len(frames)} frames")
    took = [d["endMs"] - d["startMs"] for d in draws]
    print(f"Gantt redraws: {len(draws)}, median {statistics.median(took):.0f} ms, max {max(took):.0f} ms, "
          f"busy {sum(took) / (fed_s * 1000):.0%} of the feeding time")
    print(f"fed -> published (ingestor buffer, DB insert): {percentiles(to_layer)}")
    print(f"published -> received (Redis, daphne, page):   {percentiles(from_layer)}")
    print(f"fed -> received by the page: {percentiles(received)}")
    print(f"fed -> drawn in the Gantt:   {percentiles(drawn)}")
    print(f"receive p95 {p95:.0f} ms (target <= {TARGET_P95_MS:.0f} ms): {'OK' if p95 <= TARGET_P95_MS else 'OVER TARGET'}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
