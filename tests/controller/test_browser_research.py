"""The research workflow in a real browser against the real app: the seed swept over three values,
a two-schedule comparison drawn over three seeds and pooled per schedule with intervals, and the
runs list grouped by a config column whose six runs are overlaid in one colour each, the same
on every chart of the compare page."""

import re

import pytest
from tests.harness.web_harness import browser_page, live_url, log_in  # noqa: F401 (fixtures)

from controller.models import Comparison, Run, Schedule

from .test_browser_comparison import launch_comparison
from .test_browser_insight import store_workload

pytestmark = pytest.mark.browser


@pytest.fixture
def presets(db):
    return {kind: Schedule.objects.create(owner=None, name=kind, kind=kind) for kind in ("sync", "async", "streaming")}


def test_the_seed_is_swept_over_three_values(live_url, browser_page, alice, alice_experiment, presets):
    page, errors = browser_page
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/experiments/{alice_experiment.pk}/")
    for kind, preset in presets.items():
        page.locator(f"#comparison-form input[name=schedules][value='{preset.pk}']").set_checked(kind == "streaming")
    page.fill("#comparison-form input[name=steps]", "3")
    page.fill("#comparison-form [name=sweep_field]", "seed")
    page.fill("#comparison-form [name=sweep_values]", "1, 2, 3")
    page.click("#comparison-form button[type=submit]")
    page.wait_for_url(f"{live_url}/comparisons/*/")
    comparison = Comparison.objects.get(pk=int(page.url.rstrip("/").rsplit("/", 1)[1]))
    assert [r.config["seed"] for r in comparison.runs.order_by("id")] == [1, 2, 3]
    assert "Swept seed over 1, 2, 3" in page.inner_text("#comparison-head")
    assert errors == []


def test_two_schedules_over_three_seeds_pool_per_schedule_with_intervals(
        live_url, browser_page, alice, alice_experiment, presets):
    page, errors = browser_page
    log_in(page, live_url, "alice", "alice-password")
    comparison = launch_comparison(page, live_url, alice_experiment, ("sync", "streaming"), presets, steps=4, repeats=3)
    runs = list(comparison.runs.order_by("id"))
    assert sorted((r.schedule.kind, r.config["seed"]) for r in runs) == [
        ("streaming", 0), ("streaming", 1), ("streaming", 2), ("sync", 0), ("sync", 1), ("sync", 2)]
    assert "seeds 0, 1, 2, one per round" in page.inner_text("#comparison-head")
    for run in runs:
        store_workload(run, seed=run.config["seed"], boot_s=3.0)
        Run.objects.filter(pk=run.pk).update(status=Run.Status.SUCCEEDED)
    page.wait_for_selector("#compare-app[data-live='0']", timeout=60_000)
    page.wait_for_selector("#pooled-panel:not([hidden]) #compare-pooled tbody tr")
    rows = page.evaluate("""() => [...document.querySelectorAll('#compare-pooled tbody tr')].map((tr) => [
        tr.dataset.schedule, tr.querySelector('td[data-field=step_s]').textContent])""")
    assert sorted(kind for kind, _ in rows) == ["streaming", "sync"]  # the seeds pool into one row each
    for _, text in rows:
        assert re.fullmatch(r"[\d.]+ s \[[\d.]+, [\d.]+\]", text), text  # a median with its interval
    assert page.is_hidden("#compare-warnings")  # rounds' seeds are not "different seeds"
    assert errors == []


def test_runs_grouped_by_a_config_column_and_six_overlaid_in_stable_colours(
        live_url, browser_page, alice, alice_experiment, presets):
    page, errors = browser_page
    runs = []
    for k in range(3):
        for kind in ("sync", "streaming"):
            run = Run.objects.create(experiment=alice_experiment, schedule=presets[kind], name=f"{kind} {k}", steps=4,
                                     config={**alice_experiment.config, "seed": k,
                                             "train": {**alice_experiment.config.get("train", {}), "schedule": kind}},
                                     status=Run.Status.SUCCEEDED)
            store_workload(run, seed=k, boot_s=2.0)
            runs.append(run)
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/runs/?col=train.schedule+seed&group=col:train.schedule&sort=name")
    groups = page.evaluate("[...document.querySelectorAll('#runs-list tr.group-row')].map((tr) => tr.dataset.group)")
    assert groups == ["streaming", "sync"]
    assert page.locator("#runs-list th[data-column='col:seed']").count() == 1
    for run in runs:
        page.check(f"#runs-list tr[data-run-id='{run.pk}'] input[type=checkbox]")
    page.click("#compare-ticked")
    page.wait_for_url(re.compile(r"/compare/\?runs="))
    page.wait_for_function("document.getElementById('compare-app')?.dataset.ready === '1'", timeout=60_000)
    shown = page.evaluate("[...document.querySelectorAll('#compare-summary tbody tr')].map((tr) => +tr.dataset.runId)")
    assert sorted(shown) == sorted(r.pk for r in runs)
    colours = {}
    for chart in ("chart-step-time", "chart-idle"):
        page.locator(f"#{chart}").scroll_into_view_if_needed()
        page.wait_for_function(f"document.getElementById('{chart}').data?.length >= 6", timeout=30_000)
        traces = page.evaluate(f"""() => document.getElementById('{chart}').data.map(
            (t) => [t.name, (t.marker && t.marker.color) || (t.line && t.line.color)])""")
        colours[chart] = dict(traces)
    assert colours["chart-step-time"] == colours["chart-idle"]
    assert len(set(colours["chart-step-time"].values())) == 6  # one colour per run
    assert errors == []
