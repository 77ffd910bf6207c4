"""One action compares schedules: from an experiment page, the config launched under the ticked
schedules (same steps, same seed) as one comparison, whose compare page opens at once and
follows the runs live until they finish; in a real browser against the real app."""

import pytest
from tests.harness.web_harness import browser_page, live_url, log_in, screenshot  # noqa: F401 (fixtures)

from controller.models import Comparison, Run, Schedule, Span

from .conftest import wait_for_status
from .test_browser_insight import store_workload

pytestmark = pytest.mark.browser
RUN_TIMEOUT_S = 600


@pytest.fixture
def presets(db):
    return {kind: Schedule.objects.create(owner=None, name=kind, kind=kind) for kind in ("sync", "async", "streaming")}


def launch_comparison(page, live_url, experiment, kinds, presets, steps: int) -> Comparison:
    page.goto(f"{live_url}/experiments/{experiment.pk}/")
    for kind, preset in presets.items():
        box = page.locator(f"#comparison-form input[name=schedules][value='{preset.pk}']")
        box.set_checked(kind in kinds)
    page.fill("#comparison-form input[name=steps]", str(steps))
    page.click("#comparison-form button[type=submit]")
    page.wait_for_url(f"{live_url}/comparisons/*/")
    return Comparison.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))


def test_a_comparison_launches_one_run_per_schedule_and_its_page_follows_them(
        live_url, browser_page, alice, alice_experiment, presets):
    page, errors = browser_page
    log_in(page, live_url, "alice", "alice-password")
    comparison = launch_comparison(page, live_url, alice_experiment, ("sync", "streaming"), presets, steps=4)
    runs = list(comparison.runs.order_by("id"))
    assert [r.schedule.kind for r in runs] == ["sync", "streaming"] and all(r.status == Run.Status.QUEUED for r in runs)
    assert {r.steps for r in runs} == {4} and len({r.config["seed"] for r in runs}) == 1
    page.wait_for_selector("#compare-app[data-ready='1']", timeout=60_000)
    assert page.inner_text("h1") == str(comparison)
    assert page.get_attribute("#compare-app", "data-live") == "1" and "live:" in page.inner_text("#live-note")

    # the runs train (stored here as a worker's ingestor would); the page picks them up by itself
    for seed, run in enumerate(runs):
        store_workload(run, seed=seed, boot_s=5.0)
        Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    page.wait_for_selector("#compare-app[data-live='0']", timeout=30_000)
    page.wait_for_function("document.querySelectorAll('#compare-summary td[data-field=speedup_vs_sync]').length === 2")
    assert page.is_hidden("#compare-warnings")
    assert page.inner_text("#live-note") == ""
    assert errors == []


def test_a_comparison_needs_two_schedules_and_enough_steps(live_url, browser_page, alice, alice_experiment, presets):
    page, errors = browser_page
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/experiments/{alice_experiment.pk}/")
    for preset in presets.values():
        page.locator(f"#comparison-form input[name=schedules][value='{preset.pk}']").set_checked(preset.kind == "sync")
    page.fill("#comparison-form input[name=steps]", "2")
    page.evaluate("document.getElementById('comparison-form').noValidate = true")  # the server's answer, not the browser's
    page.click("#comparison-form button[type=submit]")
    page.wait_for_load_state()
    text = page.inner_text("#comparison-form")
    assert "pick at least two schedules" in text and "greater than or equal to 3" in text
    assert Comparison.objects.count() == 0 and Run.objects.count() == 0
    assert errors == []


@pytest.fixture
def shared_run_dir(monkeypatch, tmp_path):
    """The daphne process reads run logs where the worker (conftest.celery_worker) writes them."""
    monkeypatch.setenv("THUNDERSYNC_RUN_DIR", str(tmp_path / "runs"))


@pytest.mark.slow
def test_a_one_click_comparison_of_three_schedules_finishes_fair(
        shared_run_dir, live_url, browser_page, celery_worker, alice, alice_experiment, presets):
    """sync, async and streaming of configs/quickstart.yaml, 3 steps each, trained for real: the
    compare page shows ratios with their spread and no warning."""
    page, errors = browser_page
    log_in(page, live_url, "alice", "alice-password")
    comparison = launch_comparison(page, live_url, alice_experiment, ("sync", "async", "streaming"), presets, steps=3)
    for run in comparison.runs.all():
        finished = wait_for_status(run.pk, Run.FINISHED, RUN_TIMEOUT_S)
        assert finished.status == Run.Status.SUCCEEDED, finished.error
    page.wait_for_selector("#compare-app[data-live='0']", timeout=60_000)
    page.wait_for_function("document.querySelectorAll('#compare-summary tbody tr').length === 3")
    assert page.is_hidden("#compare-warnings")
    cells = page.evaluate("[...document.querySelectorAll('#compare-summary td[data-field=speedup_vs_sync]')].map((td) => td.textContent)")
    assert len(cells) == 3 and all("×" in c and "–" in c for c in cells), cells  # a ratio and its p10-p90
    screenshot(page, "comparison")
    show_the_streaming_run(page, live_url, comparison)
    Run.objects.filter(comparison=comparison, schedule__kind="sync").update(tags=",baseline,", note="the 1.00x reference")
    page.goto(f"{live_url}/runs/?experiment={alice_experiment.pk}")
    assert len(page.locator("#runs-list tbody tr").all()) == 3
    screenshot(page, "runs-list")
    assert errors == []


def show_the_streaming_run(page, live_url, comparison) -> None:
    """The streaming run's page with all steps, one trajectory followed, then by trajectory (the
    pictures in docs/screenshots)."""
    run = comparison.runs.get(schedule__kind="streaming")
    page.goto(f"{live_url}/runs/{run.pk}/")
    page.select_option("#window-steps", "0")
    total = Span.objects.filter(run=run).count()
    page.wait_for_function(f"document.getElementById('gantt').dataset.drawnSpans === '{total}'", timeout=60_000)
    last = Span.objects.filter(run=run).order_by("-step").first().step
    target = max(Span.objects.filter(run=run, step=last, kind="rollout.generate"), key=lambda s: s.t1 - s.t0)
    page.fill("#traj-search", str(target.traj))
    page.dispatch_event("#traj-search", "change")
    page.wait_for_function(f"document.getElementById('traj-detail').dataset.traj === '{target.traj}'")
    screenshot(page, "run-followed")
    page.select_option("#lane-mode", "traj")
    page.wait_for_selector("#traj-table tbody tr")
    screenshot(page, "run-by-trajectory-table")
