"""The run page under load: with the Gantt's redraws slowed artificially (each Plotly.react of the
Gantt made to burn 1.5 s of the page's thread, as a loaded 2-core machine does), the tiles and the
Gantt's newest drawn step never differ by more than one step, and a "catching up" marker shows
while the Gantt is behind. Debian's chromium, a daphne process, spans and metrics fed live through
the real ingestor (PostgreSQL, Redis)."""

import json
import re
import threading
import time

import pytest
from tests.harness.web_harness import agent_run_events, browser_page, live_url, log_in  # noqa: F401 (fixtures)

from controller.ingest import ingestion
from controller.models import Run

from .conftest import make_run

pytestmark = pytest.mark.browser
STATE = "window.__thundersync.state()"
STEPS = 10

# Wraps Plotly.react as plotly.min.js assigns it: a draw of the Gantt first busy-waits SLOW_MS.
SLOW_GANTT = """
(() => {
  let real;
  Object.defineProperty(window, "Plotly", { configurable: true, get: () => real, set: (p) => {
    const react = p.react;
    p.react = function (div, ...args) {
      if (div && div.id === "gantt" && window.__slowGanttMs) { const end = performance.now() + window.__slowGanttMs; while (performance.now() < end) {} }
      return react.call(this, div, ...args);
    };
    real = p;
  }});
})();
"""

# What the tiles and the Gantt say, at every change of either and every 50 ms.
RECORDER = """
window.__seen = [];
document.addEventListener("DOMContentLoaded", () => {
  const root = document.getElementById("run-app");
  if (!root) return;
  const note = () => window.__seen.push({
    ms: Date.now(), progress: document.getElementById("progress").textContent,
    drawn: root.dataset.lastStep ?? "", marker: !document.getElementById("gantt-behind").hidden,
    received: window.__thundersync ? Math.max(-1, ...window.__thundersync.spanSteps()) : -1,
  });
  new MutationObserver(note).observe(document.getElementById("progress"), {childList: true, characterData: true, subtree: true});
  new MutationObserver(note).observe(root, {attributes: true, attributeFilter: ["data-last-step"]});
  setInterval(note, 50);
});
"""


def tile_step(progress: str) -> int | None:
    """The step the progress tile says is training (= steps done), or None before the first."""
    if m := re.search(r"(\d+) / \d+ steps", progress):
        return int(m.group(1))
    if m := re.search(r"all (\d+) steps done", progress):
        return int(m.group(1))
    return None


def feed_live(run_pk: int, spans: list[dict], metrics: list[dict], step_s: float) -> None:
    """Each step's spans then its metrics through the real ingestor, one step every ``step_s``."""
    def feed():
        try:
            ingestor = ingestion.RunIngestor(run_pk, flush_s=0.05, flush_spans=200)
            for m in metrics:
                started = time.monotonic()
                for event in (e for e in spans if e["step"] == m["step"]):
                    ingestor.feed(json.dumps(event))
                    ingestor.flush_if_due()
                ingestor.feed(json.dumps(m))
                ingestor.flush()
                time.sleep(max(0.0, step_s - (time.monotonic() - started)))  # the learner's pace, not work
        finally:
            from django.db import connections
            connections.close_all()

    thread = threading.Thread(target=feed)
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "the feed did not finish in 120 s"


def test_tiles_stay_within_one_step_of_a_slow_gantt_and_the_marker_shows(
    live_url, browser_page, alice, alice_experiment, streaming_preset
):
    page, errors = browser_page
    page.add_init_script(SLOW_GANTT)
    page.add_init_script(RECORDER)
    run = make_run(alice_experiment, streaming_preset, status=Run.Status.RUNNING, steps=STEPS)
    spans, metrics = agent_run_events(steps=STEPS, groups=2, group_size=4, workers=1, slots=4, max_turns=3)
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/runs/{run.pk}/")
    page.wait_for_function(f"{STATE}.replayDone && {STATE}.open", timeout=30_000)
    page.evaluate("window.__slowGanttMs = 1500")  # slower than a step arrives (0.4 s) on any machine
    feed_live(run.pk, spans, metrics, step_s=0.4)
    # the page catches up: every step drawn, the tile at "all 10 steps done", the marker gone
    page.wait_for_function(
        f"{STATE}.stepsDone === {STEPS} && document.getElementById('run-app').dataset.lastStep === '{STEPS - 1}'"
        " && /all 10 steps done/.test(document.getElementById('progress').textContent)"
        " && document.getElementById('gantt-behind').hidden", timeout=60_000)
    seen = page.evaluate("window.__seen")
    pairs = [(tile_step(s["progress"]), int(s["drawn"])) for s in seen if s["drawn"] != ""]
    pairs = [(tile, drawn) for tile, drawn in pairs if tile is not None]
    assert len(pairs) > 20, seen[-5:]
    worst = max(pairs, key=lambda p: abs(p[0] - p[1]))
    assert abs(worst[0] - worst[1]) <= 1, f"tile at step {worst[0]} beside a Gantt drawn to step {worst[1]}"
    # the slowed Gantt fell behind (frames waiting over 1 s, or spans two steps past the drawn
    # ones) and said so; two steps behind never went without the marker
    assert any(s["marker"] for s in seen), "no 'catching up' marker: the slowed Gantt never fell behind"
    two_behind = [s for s in seen if s["drawn"] != "" and s["received"] - int(s["drawn"]) >= 2]
    assert all(s["marker"] for s in two_behind), [s for s in two_behind if not s["marker"]][:3]
    # the tiles moved on while the Gantt was slowed (they were not frozen until the end)
    assert len({tile for tile, _ in pairs}) >= 3, sorted({tile for tile, _ in pairs})
    assert errors == []

