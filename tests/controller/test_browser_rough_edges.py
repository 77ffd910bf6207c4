"""What a new user hit on the pages, each in its scenario, in a real browser against the real app:
template text shown at the end of the run page, unstyled 404s, a progress line and idle tile
that said something untrue (a step N that does not exist, "first generate" after a reload, a
cancelled run's idle "so far"), and a trace range of -3 accepted without a word."""

import re
import threading
from datetime import timedelta

import pytest
from django.utils import timezone
from tests.harness.web_harness import browser_page, live_url, log_in  # noqa: F401 (fixtures)

from controller.ingest import ingestion
from controller.models import Run, Span, StepMetric

from .conftest import make_run
from .test_browser_insight import store_workload

pytestmark = pytest.mark.browser
STATE = "window.__thundersync.state()"

# Every text the progress line shows, from the first the page's script writes (observing the
# whole document: the line exists before DOMContentLoaded, and the script writes it at once).
PROGRESS_RECORDER = """
window.__progress = [];
new MutationObserver(() => {
  const text = document.getElementById("progress")?.textContent;
  if (text !== undefined && text !== window.__progress[window.__progress.length - 1]) window.__progress.push(text);
}).observe(document, {childList: true, subtree: true, characterData: true});
"""


def in_thread(fn, *args) -> None:
    """The publisher uses async_to_sync, which cannot run on Playwright's thread."""
    def call():
        try:
            fn(*args)
        finally:
            from django.db import connections

            connections.close_all()

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(timeout=60)


def running_run(experiment, schedule, steps: int, done: int, name: str) -> Run:
    """A run supervised elsewhere (a live heartbeat), ``steps`` long, ``done`` steps with metrics and
    spans, step ``done`` under way (its spans, no metrics yet)."""
    run = make_run(experiment, schedule, steps=steps, status=Run.Status.RUNNING, name=name,
                   supervisor="worker-elsewhere:1:1", heartbeat=timezone.now(),
                   started=timezone.now() - timedelta(seconds=30))
    store_workload(run, seed=3, boot_s=2.0, steps=min(steps, done + 1))
    StepMetric.objects.filter(run=run, step__gte=done).delete()
    return run


def test_the_run_page_says_only_what_is_true(live_url, browser_page, alice, alice_experiment, streaming_preset):
    page, errors = browser_page
    page.add_init_script(PROGRESS_RECORDER)
    mid = running_run(alice_experiment, streaming_preset, steps=8, done=4, name="mid run")
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/runs/{mid.pk}/")
    page.wait_for_function(f"{STATE}.replayDone && {STATE}.stepsDone === 4")
    # no template comment at the page's end
    assert "live.js first" not in page.content() and "{#" not in page.inner_text("body")
    # a reloaded page of a run at step 4: its step count from the first text on, never "first generate"
    seen = [text for text in page.evaluate("window.__progress") if text != "running"]  # "running": the HTML's
    assert seen and all(re.fullmatch(r"4 / 8 steps done, training step 4 · \d+:\d\d elapsed( · ETA \d+:\d\d)?", text)
                        for text in seen), seen
    assert re.fullmatch(r"4 / 8 steps done, training step 4 · \d+:\d\d elapsed · ETA \d+:\d\d", page.inner_text("#progress"))
    assert "so far" in page.inner_text("#idle-live-hint")

    # the trace range: a step below 0 or not whole is said, as the API's 400 would
    page.fill("#trace-from", "-3")
    assert page.inner_text("#trace-error") == "first step -3: steps are numbered 0, 1, 2, …"
    assert page.get_attribute("#trace-link", "aria-disabled") == "true"
    page.fill("#trace-from", "1")
    page.fill("#trace-to", "2.5")
    assert page.inner_text("#trace-error") == "last step 2.5: steps are numbered 0, 1, 2, …"
    page.fill("#trace-to", "2")
    assert page.is_hidden("#trace-error") and page.get_attribute("#trace-link", "aria-disabled") == "false"
    assert page.request.get(f"{live_url}/api/runs/{mid.pk}/trace.json?step_from=-3").status == 400

    # cancelled inside step 4: the idle tile no longer reads as live
    in_thread(ingestion.finish_run, mid.pk, Run.Status.CANCELLED)
    page.wait_for_function(f"{STATE}.status === 'cancelled'", timeout=30_000)
    assert page.inner_text("#idle-live") == "—"
    assert page.inner_text("#idle-live-hint") == "step 4 did not finish: run cancelled"
    assert re.fullmatch(r"cancelled after 4 / 8 steps \(steps 0–3\) in \d+:\d\d", page.inner_text("#progress"))

    # every step trained, the run not ended yet: no step 4 of 4 "training"
    ending = running_run(alice_experiment, streaming_preset, steps=4, done=4, name="ending run")
    assert Span.objects.filter(run=ending).exists()
    page.goto(f"{live_url}/runs/{ending.pk}/")
    page.wait_for_function(f"{STATE}.replayDone && {STATE}.stepsDone === 4")
    progress = page.inner_text("#progress")
    assert re.fullmatch(r"all 4 steps done \(steps 0–3\), finishing: saving the final policy · \d+:\d\d elapsed",
                        progress), progress
    assert not any("training step 4" in text for text in page.evaluate("window.__progress"))
    assert errors == []


NOT_FOUND = {
    "/runs/999999/": "no run #999999 among yours",
    "/experiments/999999/": "no experiment #999999 among yours",
    "/comparisons/999999/": "no comparison #999999 among yours",
    "/runs/abc/": "“abc” is not a run id (a number)",
    "/schedules/999/edit/": "no schedule preset #999 among yours",
}


def test_a_missing_page_is_the_apps_own_page_saying_what_is_missing(live_url, browser_page, alice):
    page, errors = browser_page
    log_in(page, live_url, "alice", "alice-password")
    for path, reason in NOT_FOUND.items():
        response = page.goto(f"{live_url}{path}")
        assert response.status == 404, path
        assert reason in page.inner_text("#not-found"), path
        # styled: the app's top bar and stylesheet, not Django's bare "Not Found"
        assert page.is_visible("header.topbar nav a[href='/runs/']")
        assert page.evaluate("getComputedStyle(document.getElementById('not-found')).borderLeftWidth") == "4px"
    assert errors == []
