"""The run page while a real run starts, trains and ends: boot phases, step k/N with elapsed and
ETA, the learner's log arriving live, the finished state; and a page that stalls mid-run being
closed by the server (4408) and recovering every span. Debian's chromium, a daphne process, a real
Celery worker and learner (the stalled page: the real ingestor fed at a steady rate)."""

import json
import re
import threading
import time

import pytest
from django.utils import timezone
from tests.harness.web_harness import agent_run_events, browser_page, live_url, log_in  # noqa: F401 (fixtures)
from controller.ingest import ingestion
from controller.models import Run, Span
from controller.supervision.runlog import log_path

from .conftest import launch_from_page, make_run, wait_for_status

pytestmark = [pytest.mark.browser]

STATE = "window.__thundersync.state()"
RUN_TIMEOUT_S = 600

# Records every text the progress line and the log panel show, with the status at that moment.
RECORDER = """
window.__seen = [];
document.addEventListener("DOMContentLoaded", () => {
  if (!document.getElementById("run-app")) return;  // login and experiment pages
  const note = () => window.__seen.push({
    ms: Date.now(), status: document.getElementById("run-app").dataset.status,
    progress: document.getElementById("progress").textContent,
    log: document.getElementById("log-tail").textContent,
  });
  for (const id of ["progress", "log-tail", "status-badge"]) {
    new MutationObserver(note).observe(document.getElementById(id), {childList: true, characterData: true, subtree: true});
  }
});
"""


@pytest.fixture
def shared_run_dir(monkeypatch, tmp_path):
    """The daphne process reads run logs where the worker (conftest.celery_worker) writes them."""
    monkeypatch.setenv("THUNDERSYNC_RUN_DIR", str(tmp_path / "runs"))


@pytest.mark.slow
def test_progress_eta_live_log_and_the_finished_state(
    shared_run_dir, live_url, browser_page, celery_worker, alice, alice_experiment, streaming_preset
):
    page, errors = browser_page
    page.add_init_script(RECORDER)
    log_in(page, live_url, "alice", "alice-password")
    run_id = launch_from_page(page, live_url, alice_experiment, streaming_preset, steps=4)
    run = wait_for_status(run_id, Run.FINISHED, RUN_TIMEOUT_S)
    assert run.status == Run.Status.SUCCEEDED, run.error
    page.wait_for_function(f"{STATE}.status === 'succeeded' && {STATE}.stepsDone === 4", timeout=60_000)
    seen = page.evaluate("window.__seen")

    # while starting: the learner's boot phases; while running: step k / 4, elapsed and ETA
    starting = [s["progress"] for s in seen if s["status"] == "starting"]
    assert any(re.fullmatch(r"starting: (starting 1 rollout worker\(s\)|loading torch and the policy builtin:tiny)"
                            r"( · \d+:\d\d elapsed)?", p) for p in starting), starting
    running = [s["progress"] for s in seen if s["status"] == "running"]
    steps = {int(m.group(1)) for p in running
             if (m := re.fullmatch(r"(\d) / 4 steps done, training step \1 · \d+:\d\d elapsed · ETA \d+:\d\d", p))}
    assert steps and steps <= {1, 2, 3}, running

    # the learner's per-step lines reached the log panel while the run was still running
    live_log = [s["log"] for s in seen if s["status"] == "running"]
    assert any(re.search(r"^step +0 +reward", text, re.M) for text in live_log), live_log[-1:]
    file_lines = log_path(run_id).read_text().splitlines()
    # a run that uses no DeepSpeed: no DeepSpeed warning when its final policy is saved
    assert not any("Setting accelerator to CPU" in line for line in file_lines), file_lines[-5:]
    assert_readable_log(page.inner_text("#log-tail").splitlines(), file_lines[-200:])
    download = page.request.get(f"{live_url}/runs/{run_id}/log/")
    assert download.ok and download.text().splitlines() == file_lines

    # the finished state: no "live", no "so far", no ETA, no cancel button
    assert page.text_content("#status-badge") == "succeeded"
    assert page.inner_text("#conn") == "run succeeded" and page.get_attribute("#conn", "class") == "conn done"
    assert re.fullmatch(r"finished: 4 / 4 steps \(steps 0–3\) in \d+:\d\d", page.inner_text("#progress"))
    assert "so far" not in page.inner_text("#idle-live-hint")
    assert page.is_hidden("#cancel-form")

    # a page opened now gets the log's tail in its replay
    page.reload()
    page.wait_for_function(f"{STATE}.replayDone")
    assert_readable_log(page.inner_text("#log-tail").splitlines(), file_lines[-200:])
    assert errors == []


def assert_readable_log(shown: list[str], file_lines: list[str]) -> None:
    """The log panel shows the file's lines without tqdm's bar redraws (only the newest bar) and
    blank lines, each log record on its own line (static/js/logview.js)."""
    bar = re.compile(r"^\S[^|]*:\s+\d+%\|")
    assert all(line.strip() for line in shown)
    assert sum(bool(bar.match(line)) for line in shown) <= 1
    text = "\n".join(file_lines)
    assert all(line in text for line in shown)
    summaries = [line for line in file_lines if re.match(r"^step +\d+ +reward", line)]
    assert summaries and [line for line in shown if re.match(r"^step +\d+ +reward", line)] == summaries


def test_failed_and_cancelled_runs_render_as_such(live_url, browser_page, alice, alice_experiment, streaming_preset):
    page, errors = browser_page
    error = "RuntimeError: boom\nlast stderr lines:\nTraceback (most recent call last):\n  File \"x.py\", line 1"
    failed = make_run(alice_experiment, streaming_preset, status=Run.Status.FAILED, error=error)
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/runs/{failed.pk}/")
    page.wait_for_function(f"{STATE}.replayDone")
    assert page.inner_text("#error-box") == error  # once, with its newlines
    assert page.inner_text("#conn") == "run failed"
    assert page.inner_text("#progress") == "failed after 0 / 2 steps"

    # a running run is cancelled: "Cancelling ..." goes once the run says cancelled
    # supervised by a live worker on another host (docs/controller.md "No run without an owner")
    running = make_run(alice_experiment, streaming_preset, status=Run.Status.RUNNING,
                       supervisor="worker-elsewhere:1:1", heartbeat=timezone.now())
    page.goto(f"{live_url}/runs/{running.pk}/")
    page.wait_for_function(f"{STATE}.replayDone")
    page.once("dialog", lambda dialog: dialog.accept())  # "Cancel <run>? ..." (the cancel is confirmed)
    page.click("#cancel-button")
    page.wait_for_url(f"{live_url}/runs/{running.pk}/")
    page.wait_for_function(f"{STATE}.replayDone")
    assert "Cancelling" in page.inner_text(".messages")
    in_thread(ingestion.finish_run, running.pk, Run.Status.CANCELLED)  # what the supervisor does after SIGTERM
    page.wait_for_function(f"{STATE}.status === 'cancelled'", timeout=30_000)
    assert page.locator(".message.until-finished").count() == 0
    assert page.inner_text("#conn") == "run cancelled" and page.is_hidden("#cancel-form")
    assert errors == []


def in_thread(fn, *args) -> None:
    """Publishing uses async_to_sync, which cannot run on this thread (Playwright's loop is here)."""
    def call():
        try:
            fn(*args)
        finally:
            from django.db import connections

            connections.close_all()

    thread = threading.Thread(target=call)
    thread.start()
    thread.join(timeout=60)


@pytest.fixture
def small_backlog(monkeypatch):
    """The daphne process closes a socket over 64 KiB of unacknowledged frames."""
    monkeypatch.setenv("THUNDERSYNC_WS_BACKLOG_BYTES", str(64 * 1024))


def test_a_stalled_page_is_closed_and_recovers_every_span(
    small_backlog, live_url, browser_page, alice, alice_experiment, streaming_preset
):
    page, errors = browser_page
    run = make_run(alice_experiment, streaming_preset, status=Run.Status.RUNNING)
    spans, _ = agent_run_events(steps=4, groups=16, group_size=4, workers=2, slots=4)
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/runs/{run.pk}/")
    page.wait_for_function(f"{STATE}.replayDone && {STATE}.open")

    def feed():  # the ingestor as the supervisor drives it, ~1,000 spans a second
        ingestor = ingestion.RunIngestor(run.pk, flush_s=0.05, flush_spans=100)
        for i, event in enumerate(spans):
            ingestor.feed(json.dumps(event))
            ingestor.flush_if_due()
            if i % 10 == 9:
                time.sleep(0.01)
        ingestor.flush()

    # the page's thread is busy for 4 s (a long task, a frozen tab): it reads and acks nothing
    page.evaluate("setTimeout(() => { const end = Date.now() + 4000; while (Date.now() < end) {} }, 0)")
    in_thread(feed)
    db_seqs = list(Span.objects.filter(run=run).order_by("seq").values_list("seq", flat=True))
    assert len(db_seqs) == len(spans)
    page.wait_for_function(f"{STATE}.spansReceived === {len(spans)} && {STATE}.open", timeout=60_000)
    state = page.evaluate(STATE)
    # closed as too slow and resumed with ?after: the close frame says 4408; a page frozen for longer
    # than daphne's 1 s close handshake sees the connection dropped (1006) instead
    assert state["closeCodes"] and set(state["closeCodes"]) <= {4408, 1006} and state["connects"] >= 2
    assert state["duplicates"] == 0
    assert page.evaluate("window.__thundersync.seqs()") == db_seqs
    assert errors == []
