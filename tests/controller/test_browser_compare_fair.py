"""Comparisons that can be trusted, in a real browser against the real app: "Compare latest"
picks comparable finished runs (or says why not), the compare page warns on what makes a
ratio unfair, shows the step spread, reads time to reward on smoothed reward at a visible
level, draws staleness over every step, and answers unknown run ids with a styled error."""

import pytest
from tests.harness.web_harness import browser_page, live_url, log_in  # noqa: F401 (fixtures)

from controller.comparisons.compare import smoothed
from controller.models import Run, StepMetric

from .conftest import make_run
from .test_browser_insight import store_workload

pytestmark = pytest.mark.browser


@pytest.fixture
def runs(alice_experiment, sync_preset, streaming_preset):
    """Two comparable finished runs (6 steps each), then, newer, what a blind pick would take: a
    1-step run and a cancelled 200-step sync run with 5 steps done."""
    sync = make_run(alice_experiment, sync_preset, steps=6, name="sync 6")
    streaming = make_run(alice_experiment, streaming_preset, steps=6, name="streaming 6")
    store_workload(sync, seed=1, boot_s=20.0, steps=6)
    store_workload(streaming, seed=2, boot_s=7.0, steps=6)
    one_step = make_run(alice_experiment, streaming_preset, steps=1, name="one step")
    store_workload(one_step, seed=3, boot_s=5.0, steps=1)
    cancelled = make_run(alice_experiment, sync_preset, steps=200, name="cancelled sync",
                         status=Run.Status.CANCELLED)
    store_workload(cancelled, seed=4, boot_s=5.0, steps=5)
    return {"sync": sync, "streaming": streaming, "one_step": one_step, "cancelled": cancelled}


def open_compare(page, live_url, *runs) -> None:
    page.goto(f"{live_url}/compare/?runs={','.join(str(r.pk) for r in runs)}")
    page.wait_for_selector("#compare-app[data-ready='1']", timeout=60_000)


def warnings(page) -> list[str]:
    return page.evaluate("[...document.querySelectorAll('#compare-warnings li')].map((li) => li.textContent)")


def test_compare_latest_picks_comparable_finished_runs_and_a_blind_pick_is_warned(live_url, browser_page, alice, runs):
    """Before the fix: the four newest runs were taken blindly (a 1-step run, a cancelled reference)."""
    page, errors = browser_page
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/experiments/{runs['sync'].experiment_id}/")
    assert page.get_attribute("#compare-link", "href") == f"/compare/?runs={runs['sync'].pk},{runs['streaming'].pk}"
    page.click("#compare-link")
    page.wait_for_selector("#compare-app[data-ready='1']", timeout=60_000)
    assert warnings(page) == [] and page.is_hidden("#compare-warnings")
    # the median step with its p10-p90 spread, as the API computes it
    cell = page.locator(f"#compare-summary tr[data-run-id='{runs['streaming'].pk}'] td[data-field='step_s']")
    assert "–" in cell.inner_text() and "(" in cell.inner_text()
    summary = page.request.get(f"{live_url}/api/compare/?runs={runs['sync'].pk},{runs['streaming'].pk}").json()
    streaming = summary["runs"][1]
    assert streaming["step_p10_s"] <= streaming["step_s"] <= streaming["step_p90_s"]
    assert f"{streaming['step_p10_s']:.3f} s–{streaming['step_p90_s']:.3f} s" in cell.inner_text()

    # what the old link took: every reason it is unfair is said
    open_compare(page, live_url, runs["cancelled"], runs["one_step"], runs["streaming"])
    said = " ".join(warnings(page))
    assert "cancelled sync is cancelled: its figures cover 5 of 200 steps" in said
    assert "Different step counts" in said and "one step 1" in said
    assert "Too few steps to measure (one step 1 steps" in said
    assert errors == []


def test_compare_latest_explains_why_nothing_is_comparable(live_url, browser_page, alice, runs):
    page, errors = browser_page
    Run.objects.filter(pk__in=[runs["sync"].pk, runs["streaming"].pk]).update(status=Run.Status.FAILED)
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/experiments/{runs['sync'].experiment_id}/")
    assert page.locator("#compare-link").count() == 0
    assert "fewer than 3 steps" in page.inner_text("#compare-latest-note")
    assert errors == []


def test_mismatched_seeds_and_configs_are_warned(live_url, browser_page, alice, runs):
    page, errors = browser_page
    streaming = runs["streaming"]
    streaming.config = {**streaming.config, "seed": 7, "train": {**streaming.config["train"], "lr": 0.01}}
    streaming.save()
    log_in(page, live_url, "alice", "alice-password")
    open_compare(page, live_url, runs["sync"], streaming)
    said = " ".join(warnings(page))
    assert "Different seeds (sync 6 0, streaming 6 7)" in said
    assert "The configs differ beyond the schedule: train.lr." in said
    assert errors == []


def test_time_to_reward_reads_smoothed_reward_at_a_visible_level(live_url, browser_page, alice, runs):
    """Before the fix: the level was the raw reward's, invisible, and the chart had no smoothing."""
    page, errors = browser_page
    sync, streaming = runs["sync"], runs["streaming"]
    for r, base in ((sync, 0.2), (streaming, 0.25)):  # rising: a level every run crosses after its first step
        for m in StepMetric.objects.filter(run=r):
            m.values["reward/mean"] = base + 0.1 * m.step
            m.save()
    log_in(page, live_url, "alice", "alice-password")
    open_compare(page, live_url, sync, streaming)
    rewards = {r.pk: [m.values["reward/mean"] for m in StepMetric.objects.filter(run=r).order_by("step")]
               for r in (sync, streaming)}
    level = min(max(smoothed(v, 0.8)[1:]) for v in rewards.values())
    assert level > max(v[0] for v in rewards.values())
    assert page.input_value("#reward-smoothing") == "0.8"
    assert float(page.input_value("#reward-level")) == pytest.approx(level, abs=1e-4)  # the level in use, shown
    traces = page.evaluate("document.getElementById('chart-reward').data.map((t) => ({name: t.name, y: t.y}))")
    assert [t["y"] for t in traces[1::2]] == [pytest.approx(smoothed(rewards[r.pk], 0.8)) for r in (sync, streaming)]
    assert all("EMA 0.8" in t["name"] for t in traces[1::2]) and all("raw" in t["name"] for t in traces[::2])
    first = {r.pk: StepMetric.objects.get(run=r, step=0).values["step/t_start"] for r in (sync, streaming)}
    for r in (sync, streaming):
        crossing = next(i for i, v in enumerate(smoothed(rewards[r.pk], 0.8)) if v >= level)
        assert crossing >= 1
        end = StepMetric.objects.get(run=r, step=crossing).values["step/t_end"]
        cell = page.get_attribute(f"#compare-summary tr[data-run-id='{r.pk}'] td[data-field='time_to_reward_s']",
                                  "data-value")
        assert float(cell) == pytest.approx(end - first[r.pk])
    # raw reward instead: the level and the lines follow
    page.select_option("#reward-smoothing", "0")
    raw_level = min(max(v[1:]) for v in rewards.values())
    page.wait_for_function("(level) => Math.abs(Number(document.getElementById('reward-level').value) - level) < 1e-4",
                           arg=raw_level)
    assert errors == []


def test_the_staleness_histogram_counts_every_step(live_url, browser_page, alice, runs):
    """Before the fix: only the last 5 steps were counted, while the summary's mean counts them all."""
    page, errors = browser_page
    sync, streaming = runs["sync"], runs["streaming"]
    for m in StepMetric.objects.filter(run=streaming):  # step 0's turns trained one version late
        m.values.update({"staleness/turns_1": 4.0} if m.step == 0 else {"staleness/turns_0": 3.0})
        m.save()
    log_in(page, live_url, "alice", "alice-password")
    open_compare(page, live_url, sync, streaming)
    bars = page.evaluate("document.getElementById('chart-staleness').data.map((t) => [t.x, t.y])")
    assert bars[1] == [[0, 1], [15.0, 4.0]]  # 5 later steps x 3 turns at 0, step 0's 4 turns at 1
    assert "over all steps" in page.inner_text("#chart-staleness + .sub")
    assert errors == []


def test_unknown_run_ids_get_a_styled_error_that_keeps_the_ticks(live_url, browser_page, alice, runs):
    """Before the fix: a bare "Not Found" naming no id; one run's error unticked it."""
    page, errors = browser_page
    sync, streaming = runs["sync"], runs["streaming"]
    log_in(page, live_url, "alice", "alice-password")
    response = page.goto(f"{live_url}/compare/?runs={sync.pk},{streaming.pk},999999")
    assert response.status == 404
    assert "#999999" in page.inner_text("#compare-error")
    checked = page.evaluate("[...document.querySelectorAll('#compare-picker input:checked')].map((i) => Number(i.value))")
    assert sorted(checked) == sorted([sync.pk, streaming.pk])
    response = page.goto(f"{live_url}/compare/?runs={sync.pk}")
    assert response.status == 400 and "pick between 2 and 12" in page.inner_text("#compare-error")
    assert page.evaluate("[...document.querySelectorAll('#compare-picker input:checked')].map((i) => Number(i.value))") == [sync.pk]
    assert errors == []
