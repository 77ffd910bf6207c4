"""A small sweep from the experiment page, in a real browser against the real app: one field over
two values under two schedules launches four runs as one comparison (same steps and seed), whose
compare page names the sweep, lists the field among the config differences and, once the runs
have trained, shows each run's efficiency at most 100%; a bad override is the form's error."""

import pytest
from tests.harness.web_harness import SCREENSHOTS, browser_page, live_url, log_in  # noqa: F401 (fixtures)

from controller.models import Comparison, Run, Schedule

from .test_browser_insight import api, store_workload

pytestmark = pytest.mark.browser


@pytest.fixture
def presets(db):
    return {kind: Schedule.objects.create(owner=None, name=kind, kind=kind) for kind in ("sync", "async", "streaming")}


def test_a_sweep_launches_from_the_experiment_page_as_one_comparison(live_url, browser_page, alice, alice_experiment,
                                                                     presets):
    page, errors = browser_page
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/experiments/{alice_experiment.pk}/")
    for kind, preset in presets.items():
        page.locator(f"#comparison-form input[name=schedules][value='{preset.pk}']").set_checked(kind != "async")
    page.fill("#comparison-form input[name=steps]", "3")
    page.fill("#comparison-form [name=overrides]", "algorithm.kl_coef=0.04")
    page.fill("#comparison-form [name=sweep_field]", "train.lr")
    page.fill("#comparison-form [name=sweep_values]", "1e-4, 3e-4")
    page.click("#comparison-form button[type=submit]")
    page.wait_for_url(f"{live_url}/comparisons/*/")
    comparison = Comparison.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))
    runs = list(comparison.runs.order_by("id"))
    assert [(r.schedule.kind, r.config["train"]["lr"]) for r in runs] == [
        ("sync", 1e-4), ("streaming", 1e-4), ("sync", 3e-4), ("streaming", 3e-4)]
    assert {r.steps for r in runs} == {3} and len({r.config["seed"] for r in runs}) == 1
    assert all(r.config["algorithm"]["kl_coef"] == 0.04 for r in runs)
    assert "Swept train.lr over 0.0001, 0.0003" in page.inner_text("#comparison-head")
    assert "train.lr" in page.inner_text("#config-diff")

    for seed, run in enumerate(runs):  # the runs train (stored as a worker's ingestor would)
        store_workload(run, seed=seed, boot_s=5.0, steps=3)
        Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    page.wait_for_selector("#compare-app[data-live='0']", timeout=60_000)
    page.wait_for_function("document.querySelectorAll('#compare-summary td[data-field=efficiency]').length === 4")
    efficiency = page.evaluate("[...document.querySelectorAll('#compare-summary td[data-field=efficiency]')]"
                               ".map((td) => Number(td.dataset.value))")
    assert all(0 < e <= 1 for e in efficiency), efficiency

    # the sweep's plot: a summary figure against train.lr, one line per schedule; a single run's
    # bar is its step time's p10-p90
    summary = {f["id"]: f for f in api(alice, f"/api/compare/?runs={','.join(str(r.pk) for r in runs)}")["runs"]}
    plotted = "document.getElementById('chart-sweep')"
    traces_js = f"{plotted}.data.map((t) => ({{name: t.name, x: t.x, y: t.y, plus: t.error_y.array, minus: t.error_y.arrayminus}}))"
    page.wait_for_function(f"{plotted}?.data?.length === 2")
    assert page.evaluate(f"{plotted}.layout.xaxis.title.text") == "train.lr"
    for trace in page.evaluate(traces_js):
        mine = [r for r in runs if r.schedule.kind == trace["name"]]
        assert trace["x"] == [1e-4, 3e-4] and len(mine) == 2
        assert trace["y"] == pytest.approx([summary[r.pk]["step_s"] for r in mine])
        assert trace["plus"] == pytest.approx([summary[r.pk]["step_p90_s"] - summary[r.pk]["step_s"] for r in mine])
        assert trace["minus"] == pytest.approx([summary[r.pk]["step_s"] - summary[r.pk]["step_p10_s"] for r in mine])
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#sweep-panel").screenshot(path=str(SCREENSHOTS / "sweep-plot.png"))
    page.select_option("#sweep-metric", "final_reward")
    page.wait_for_function(f"{plotted}.dataset.metric === 'final_reward'")
    for trace in page.evaluate(traces_js):
        mine = [r for r in runs if r.schedule.kind == trace["name"]]
        assert trace["y"] == pytest.approx([summary[r.pk]["final_reward"] for r in mine])

    # the run page shows what the launch set beyond the experiment's config
    page.goto(f"{live_url}/runs/{runs[3].pk}/")
    diff = page.inner_text("#launch-diff")
    assert "train.lr" in diff and "0.0003" in diff and "algorithm.kl_coef" in diff and "launch override" in diff

    # a bad override: the launch form says which field and why, and nothing is stored
    page.goto(f"{live_url}/experiments/{alice_experiment.pk}/")
    page.fill("#launch-form [name=overrides]", "train.lr=-1")
    page.click("#launch-form button[type=submit]")
    page.wait_for_load_state()
    assert "train.lr: Input should be greater than 0" in page.inner_text("#launch-form")
    assert Run.objects.count() == 4
    assert errors == []
