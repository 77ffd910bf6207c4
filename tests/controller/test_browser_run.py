"""The live run page and the compare page in a real browser against the real app.

Debian's chromium (Playwright), a daphne process serving controller.asgi on the test
database, a real Celery worker running a real tiny training run. Screenshots go to
artifacts/screenshots/.
"""

import statistics
from collections import Counter

import pytest
from tests.harness.web_harness import browser_page, live_url, log_in, screenshot  # noqa: F401 (fixtures)
from controller.supervision.launching import launch_run
from controller.models import Run, Span, StepMetric

from .conftest import launch_from_page, wait_for_status

pytestmark = [pytest.mark.browser, pytest.mark.slow]

STATE = "window.__thundersync.state()"
RUN_TIMEOUT_S = 600  # the tiny model is built on first use; CI machines are small


def plotted_bars(page) -> Counter:
    """Bars per span kind that the Gantt painted on its canvas in the last draw."""
    return Counter(page.evaluate("window.__thundersync.barsByKind()"))


def test_live_run_page_draws_every_span_once_across_reconnects(
    live_url, browser_page, celery_worker, alice, alice_experiment, streaming_preset, sync_preset
):
    page, errors = browser_page
    log_in(page, live_url, "alice", "alice-password")
    run_id = launch_from_page(page, live_url, alice_experiment, streaming_preset, steps=6)
    # A second, real run for the compare page; the solo worker runs it after the first.
    other = launch_run(alice_experiment, sync_preset, steps=2, name="sync baseline")

    # Bars appear while the run is still running.
    page.wait_for_function(f"{STATE}.spansDrawn > 0", timeout=RUN_TIMEOUT_S * 1000, polling=50)
    assert Run.objects.get(pk=run_id).status == Run.Status.RUNNING
    assert page.text_content("#status-badge") == "running"
    page.wait_for_function(f"{STATE}.spansDrawn >= 100 || {STATE}.status !== 'running'", timeout=RUN_TIMEOUT_S * 1000)
    screenshot(page, "run-live")

    # Drop the socket mid-run; the page resumes from its last seq.
    page.evaluate("window.__thundersync.reconnect()")
    run = wait_for_status(run_id, Run.FINISHED, RUN_TIMEOUT_S)
    assert run.status == Run.Status.SUCCEEDED, run.error
    db_seqs = list(Span.objects.filter(run_id=run_id).order_by("seq").values_list("seq", flat=True))
    page.wait_for_function(f"{STATE}.spansDrawn === {len(db_seqs)} && {STATE}.status === 'succeeded'",
                           timeout=60_000)
    state = page.evaluate(STATE)
    assert state["connects"] >= 2 and state["duplicates"] == 0
    assert page.evaluate("window.__thundersync.seqs()") == db_seqs
    assert page.inner_text("#spans-drawn") == f"spans drawn: {len(db_seqs)}"

    # Reconnect once more after the end: the replay after the last seq adds nothing.
    page.evaluate("window.__thundersync.reconnect()")
    page.wait_for_function(f"{STATE}.connects === {state['connects'] + 1} && {STATE}.replayDone", timeout=30_000)
    state = page.evaluate(STATE)
    assert state["duplicates"] == 0 and state["spansReceived"] == len(db_seqs)

    # With every step in the window each span is its own bar: the figure matches the DB kind by kind.
    page.select_option("#window-steps", "0")
    page.wait_for_function(f"{STATE}.barsDrawn === {len(db_seqs)}", timeout=30_000)
    db_kinds = Counter(Span.objects.filter(run_id=run_id).values_list("kind", flat=True))
    assert plotted_bars(page) == db_kinds
    optimizer_steps = Span.objects.filter(run_id=run_id, kind="learner.optimizer").values("step").distinct().count()
    assert optimizer_steps == 6
    assert page.evaluate("document.getElementById('gantt').layout.shapes.length") == optimizer_steps
    page.locator("#chart-idle").scroll_into_view_if_needed()  # charts draw on screen only
    page.wait_for_function("document.getElementById('chart-idle').dataset.empty === '0'")
    last = StepMetric.objects.get(run_id=run_id, step=5).values
    assert page.inner_text("#idle-last") == f"{100 * last['trainer/idle_ratio']:.1f}%"
    assert page.is_hidden("#cancel-form")
    screenshot(page, "run-finished")
    # Follow one trajectory of step 4: its spans, its backward and its group's close are listed.
    traj = Span.objects.filter(run_id=run_id, step=4, kind="learner.backward").order_by("seq").last().traj
    page.fill("#traj-search", str(traj))
    page.dispatch_event("#traj-search", "change")
    page.wait_for_function(f"document.getElementById('traj-detail').dataset.traj === '{traj}'")
    backward = page.locator("#traj-detail tr[data-kind='learner.backward']")
    assert backward.count() == 1 and backward.get_attribute("data-traj") == str(traj)
    screenshot(page, "run-trajectory")
    page.fill("#traj-search", "")
    page.dispatch_event("#traj-search", "change")
    # One step by trajectory: a row per trajectory the step trained, and one per trajectory of the
    # step it skipped (zero-variance groups: no backward), named so.
    page.select_option("#lane-mode", "traj")
    page.select_option("#traj-step", "4")
    trained = sorted(Span.objects.filter(run_id=run_id, step=4, kind="learner.backward").values_list("traj", flat=True))
    rolled = set(Span.objects.filter(run_id=run_id, step=4, kind="rollout.verify").values_list("traj", flat=True))
    page.wait_for_function("(n) => document.getElementById('gantt').layout.yaxis.categoryarray"
                           ".filter((l) => l.startsWith('traj') && !l.includes('·')).length === n", arg=len(trained),
                           timeout=30_000)
    skipped = page.evaluate("document.getElementById('gantt').layout.yaxis.categoryarray.filter((l) => l.endsWith('· skipped'))")
    assert skipped == [f"traj {t} · skipped" for t in sorted(rolled - set(trained))]
    screenshot(page, "run-by-trajectory")

    # Compare the two runs.
    assert wait_for_status(other.pk, Run.FINISHED, RUN_TIMEOUT_S).status == Run.Status.SUCCEEDED
    page.goto(f"{live_url}/compare/?runs={run_id},{other.pk}")
    page.wait_for_selector("#compare-app[data-ready='1']", timeout=60_000)
    assert page.locator("#timelines .gantt").count() == 2
    assert "train.schedule" in page.inner_text("#config-diff")
    # The summary: the sync run is the reference; its median step time is the stored metrics'.
    sync_row = page.locator(f"#compare-summary tr[data-run-id='{other.pk}']")
    assert "(reference)" in sync_row.inner_text()
    median = statistics.median(m.values["timing_s/step"] for m in StepMetric.objects.filter(run=other))
    assert float(sync_row.locator("td[data-field='step_s']").get_attribute("data-value")) == pytest.approx(median)
    for chart in ("chart-step-time", "chart-idle", "chart-reward", "chart-staleness"):
        assert page.get_attribute(f"#{chart}", "data-empty") == "0", chart
    screenshot(page, "compare")
    assert errors == []
