"""The demo as a new user meets it, in a real browser: each demo experiment's "Compare schedules"
with its defaults (the four schedules, 2 repeats: the form says 8 runs before launching) opens a
comparison page that loads whole, every run in the summary and every schedule pooled; time to
reward reads a figure, or says plainly that no run improved; a finished run's page shows the
schedule advisor's predictions for all four schedules, and a streaming run's drain decisions.

The runs' spans and metrics are stored as a recorded run's would be (no worker trains them here:
the comparison is launched through the real form, then its runs are given a finished workload)."""

import pytest
from tests.harness.web_harness import browser_page, live_url, log_in  # noqa: F401 (fixtures)

from controller.management.commands.demo import DEMOS, ensure_demos, ensure_presets
from controller.models import Comparison, Run, StepMetric

from .conftest import make_run
from .test_browser_insight import store_workload

pytestmark = pytest.mark.browser
STEPS = 3  # the compare form's least: a few stored steps keep the pages quick


def finish(run, seed: int, rewards: list[float]) -> None:
    store_workload(run, seed=seed, boot_s=5.0 + seed, steps=STEPS)
    for m in StepMetric.objects.filter(run=run):
        m.values["reward/mean"] = rewards[m.step]
        m.save()
    Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)


def test_each_demo_experiments_default_comparison_loads_with_every_pooled_row(live_url, browser_page, alice):
    page, errors = browser_page
    ensure_presets()
    experiments = ensure_demos(alice)
    log_in(page, live_url, "alice", "alice-password")
    # the demo's reward falls in one experiment (as the demo's did), rises in the other
    curves = {0: [0.5, 0.4, 0.3], 1: [0.1, 0.3, 0.5]}
    for i, experiment in enumerate(experiments):
        page.goto(f"{live_url}/experiments/{experiment.pk}/")
        assert page.inner_text(".page-head .sub").startswith(DEMOS[i][2])
        page.fill("#comparison-form input[name=steps]", str(STEPS))
        note = page.locator("#comparison-run-count")
        assert note.inner_text() == "launches 8 runs (4 schedules × 2 repeats)"
        page.click("#comparison-form button[type=submit]")  # the defaults: nothing else touched
        page.wait_for_url(f"{live_url}/comparisons/*/")
        comparison = Comparison.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))
        runs = list(comparison.runs.order_by("id"))
        assert len(runs) == 8 and sorted({r.schedule.kind for r in runs}) == ["async", "fully-async", "streaming", "sync"]
        for k, run in enumerate(runs):
            finish(run, seed=10 * i + k, rewards=curves[i])
        page.wait_for_selector("#compare-app[data-live='0']", timeout=60_000)  # the live poll saw them finish
        page.wait_for_function("document.querySelectorAll('#compare-pooled tbody tr').length === 4", timeout=30_000)
        assert page.locator(".error-box").count() == 0
        assert page.locator("#compare-summary tbody tr").count() == 8
        pooled = page.evaluate("[...document.querySelectorAll('#compare-pooled tbody tr')]"
                               ".map((r) => [r.dataset.schedule, r.dataset.runs.split(',').length])")
        assert sorted(pooled) == [["async", 2], ["fully-async", 2], ["streaming", 2], ["sync", 2]]
        assert page.is_visible("#pooled-panel")
        # the charts draw all 8 (the cap is 8); the summary's reference is sync
        assert page.locator("#timelines .gantt").count() == 8 and page.is_hidden("#chart-note")
        cells = page.eval_on_selector_all("#compare-summary td[data-field='time_to_reward_s']", "(tds) => tds.map((t) => t.textContent)")
        reward_note = page.inner_text("#reward-note") if page.is_visible("#reward-note") else ""
        if i == 0:  # nothing improved: said plainly, each cell "no rise", the curves drawn
            assert reward_note.startswith("Time to reward: no run improved: every run's smoothed reward stayed at or "
                                          "below its first step's")
            assert set(cells) == {"no rise"}
            assert page.evaluate("document.getElementById('chart-reward').data.length") == 16
        else:  # every run rose: one level, a figure for each
            assert all(c.endswith(")") and " s (step " in c for c in cells), cells
        for run in runs:  # out of the queue quota's count for the next experiment
            run.refresh_from_db()
            assert run.status == Run.Status.SUCCEEDED
    assert errors == []


def test_the_advisor_panel_predicts_all_four_schedules(live_url, browser_page, alice, alice_experiment, sync_preset,
                                                      streaming_preset):
    page, errors = browser_page
    sync = make_run(alice_experiment, sync_preset, steps=4, name="sync run")
    store_workload(sync, seed=7, boot_s=4.0, steps=4)
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/runs/{sync.pk}/")
    page.wait_for_selector("#advisor-panel[data-state='ready']", timeout=60_000)
    rows = page.evaluate("[...document.querySelectorAll('#advisor-table tbody tr')].map((r) => r.dataset.schedule)")
    assert rows == ["sync", "async", "fully-async", "streaming"]
    steps = page.eval_on_selector_all("#advisor-table td[data-field='step_s']", "(tds) => tds.map((t) => Number(t.dataset.value))")
    assert all(s > 0 for s in steps)
    sentence = page.inner_text("#advisor-sentence")
    assert sentence.split(":")[0] in ("rollout-bound", "balanced", "learner-bound") and "R/L" in sentence
    assert "(this run: measured" in page.inner_text("#advisor-table tr.own")
    assert page.inner_text("#advisor-error").startswith("The model on this run's own schedule (sync): simulated")
    assert "Where a sync step goes: rollout" in page.inner_text("#advisor-breakdown")
    assert page.is_hidden("#drain-panel")  # sync has no drain
    # a streaming run whose drain deferred a step: said, and why
    streaming = make_run(alice_experiment, streaming_preset, steps=3, name="streaming run")
    store_workload(streaming, seed=8, boot_s=2.0, steps=3)
    for m in StepMetric.objects.filter(run=streaming):
        m.values.update({"learner/early_row_share": 0.0 if m.step == 2 else 0.6, "learner/late_close_share": 1.0,
                         "learner/early_cost_ratio": 1.3, "learner/deferred_overrun": 2.0 if m.step == 2 else 0.0})
        m.save()
    page.goto(f"{live_url}/runs/{streaming.pk}/")
    page.wait_for_selector("#advisor-panel[data-state='ready']", timeout=60_000)
    assert page.is_visible("#drain-panel")
    note = page.inner_text("#drain-notes li[data-step='2']")
    assert note.startswith("learnt nothing early in step 2: every group closed in the last tenth of the rollout")
    assert note.endswith("open rows cost 1.3x a known row here")
    # an unfinished run: the panel says when it will advise
    running = make_run(alice_experiment, sync_preset, status=Run.Status.RUNNING, name="running run")
    page.goto(f"{live_url}/runs/{running.pk}/")
    page.wait_for_function("document.getElementById('advisor-sentence').textContent.includes('once it has finished')",
                           timeout=30_000)
    assert errors == []
