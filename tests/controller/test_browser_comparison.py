"""One action compares schedules: from an experiment page, the config launched under the ticked
schedules (same steps, same seed, 2 repeats in alternating rounds by default) as one comparison,
whose compare page opens at once, follows the runs live until they finish and pools each
schedule's repeats with intervals; in a real browser against the real app."""

import statistics

import pytest
from tests.harness.web_harness import browser_page, live_url, log_in, screenshot  # noqa: F401 (fixtures)

from controller.models import Comparison, Run, Schedule, Span, StepMetric

from .conftest import wait_for_status
from .test_browser_insight import store_workload

pytestmark = pytest.mark.browser
RUN_TIMEOUT_S = 600


@pytest.fixture
def presets(db):
    return {kind: Schedule.objects.create(owner=None, name=kind, kind=kind) for kind in ("sync", "async", "streaming")}


def launch_comparison(page, live_url, experiment, kinds, presets, steps: int, repeats: int | None = None) -> Comparison:
    page.goto(f"{live_url}/experiments/{experiment.pk}/")
    for kind, preset in presets.items():
        box = page.locator(f"#comparison-form input[name=schedules][value='{preset.pk}']")
        box.set_checked(kind in kinds)
    page.fill("#comparison-form input[name=steps]", str(steps))
    if repeats is not None:
        page.fill("#comparison-form input[name=repeats]", str(repeats))
    page.click("#comparison-form button[type=submit]")
    page.wait_for_url(f"{live_url}/comparisons/*/")
    return Comparison.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))


def test_a_comparison_launches_repeats_in_alternating_rounds_and_pools_them_with_intervals(
        live_url, browser_page, alice, alice_experiment, presets):
    page, errors = browser_page
    log_in(page, live_url, "alice", "alice-password")
    comparison = launch_comparison(page, live_url, alice_experiment, ("sync", "streaming"), presets, steps=4)
    runs = list(comparison.runs.order_by("id"))
    # the default 2 repeats, in alternating rounds (A B, B A): the queue's order, started one at a time
    assert comparison.repeats == 2
    assert [r.schedule.kind for r in runs] == ["sync", "streaming", "streaming", "sync"]
    assert all(r.status == Run.Status.QUEUED for r in runs) and str(runs[2]).endswith("· round 2")
    assert {r.steps for r in runs} == {4} and [r.config["seed"] for r in runs] == [0, 0, 1, 1]  # a seed per round
    page.wait_for_selector("#compare-app[data-ready='1']", timeout=60_000)
    assert page.inner_text("h1") == str(comparison)
    assert "2 runs per schedule, in alternating rounds, one run at a time" in page.inner_text("#comparison-head")
    assert page.get_attribute("#compare-app", "data-live") == "1" and "live:" in page.inner_text("#live-note")

    # the runs train (stored here as a worker's ingestor would); the page picks them up by itself
    for seed, run in enumerate(runs):
        store_workload(run, seed=seed, boot_s=5.0)
        Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    page.wait_for_selector("#compare-app[data-live='0']", timeout=30_000)
    page.wait_for_function("document.querySelectorAll('#compare-summary td[data-field=speedup_vs_sync]').length === 4")
    assert page.inner_text("#live-note") == ""
    assert page.is_hidden("#compare-warnings")  # repeats of one comparison are not "two runs share a schedule"

    # pooled: one row per schedule over both its runs' steps, the median and the ratio with their intervals
    page.wait_for_selector("#pooled-panel:not([hidden]) #compare-pooled tbody tr")
    steps = {kind: sorted(m.values["timing_s/step"] for r in runs if r.schedule.kind == kind
                          for m in StepMetric.objects.filter(run=r)) for kind in ("sync", "streaming")}
    cells = page.evaluate("""() => Object.fromEntries([...document.querySelectorAll('#compare-pooled tbody tr')].map(
        (tr) => [tr.dataset.schedule, Object.fromEntries([...tr.querySelectorAll('td[data-field]')].map(
            (td) => [td.dataset.field, {text: td.textContent, value: td.dataset.value, spansOne: td.dataset.spansOne}]))]))""")
    api = page.request.get(f"{live_url}/api/comparisons/{comparison.pk}/").json()["summary"]["pooled"]
    for group in api:
        kind, shown = group["schedule"], cells[group["schedule"]]
        assert group["steps"] == len(steps[kind]) == 8 and shown["steps"]["text"] == "8"
        assert float(shown["step_s"]["value"]) == pytest.approx(statistics.median(steps[kind]))
        lo, hi = group["step_ci90"]
        assert min(steps[kind]) <= lo <= group["step_s"] <= hi <= max(steps[kind])
        assert shown["step_s"]["text"] == f"{group['step_s']:.3f} s [{lo:.3f}, {hi:.3f}]"
        s_lo, s_hi = group["speedup_ci90"]
        flagged = s_lo <= 1 <= s_hi
        assert group["speedup_spans_one"] is flagged and shown["speedup_vs_sync"]["spansOne"] == ("1" if flagged else "0")
        assert shown["speedup_vs_sync"]["text"] == f"{'≈ ' if flagged else ''}{group['speedup_vs_sync']:.2f}× [{s_lo:.2f}, {s_hi:.2f}]"
        # the equal-work step and the share of sync's slowest decile trained, as the API has them
        assert group["step_equal_work_s"] > 0 and shown["step_equal_work_s"]["text"] == f"{group['step_equal_work_s']:.3f} s"
        assert 0 <= group["slowest_decile_share"] <= 1
        assert shown["slowest_decile_share"]["text"] == f"{100 * group['slowest_decile_share']:.0f}%"
    page.locator("#pooled-panel").scroll_into_view_if_needed()
    screenshot(page, "comparison-pooled")
    # sync against itself: its ratio's interval always admits 1, and says so
    assert cells["sync"]["speedup_vs_sync"]["spansOne"] == "1" and cells["sync"]["speedup_vs_sync"]["text"].startswith("≈ 1.00×")
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
    comparison = launch_comparison(page, live_url, alice_experiment, ("sync", "async", "streaming"), presets, steps=3,
                                   repeats=1)
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
