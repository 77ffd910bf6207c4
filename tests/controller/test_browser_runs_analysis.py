"""The runs list as an analysis table, in a real browser against the real app: metric columns from
the stored step metrics, a sort on every column, a bad sort or filter said (not ignored), ticked
rows compared, grouped by experiment, schedule or tag; a comparison's page links to its runs, follows their status, and is deleted with
its runs kept."""

import re

import pytest
from django.test import Client
from django.utils import timezone
from tests.harness.web_harness import browser_page, live_url, log_in, screenshot  # noqa: F401 (fixtures)

from controller.ingest import ingestion
from controller.models import Comparison, Experiment, Run, StepMetric
from controller.comparisons.run_table import COLUMNS

from .conftest import QUICKSTART, make_run
from .test_browser_rough_edges import in_thread

STEP_S = {"sync run": 2.0, "streaming slow": 1.6, "streaming fast": 1.0, "other experiment's": 0.5}


def store_steps(run, step_s: float, steps: int = 4, idle: float = 0.25, staleness: float = 0.5) -> None:
    t = 10.0
    for step in range(steps):
        StepMetric.objects.create(run=run, step=step, values={
            "timing_s/step": step_s + 0.01 * step, "step/t_start": t, "step/t_end": t + step_s,
            "reward/mean": 0.1 * step, "trainer/idle_ratio": idle, "staleness/mean": staleness})
        t += step_s


@pytest.fixture
def analysed(alice, alice_experiment, sync_preset, streaming_preset):
    """One comparison (a sync and two streaming runs, the slow one still training) and a faster
    streaming run of another experiment."""
    comparison = Comparison.objects.create(experiment=alice_experiment, steps=4, name="schedules")
    runs = {
        "sync run": make_run(alice_experiment, sync_preset, steps=4, name="sync run", comparison=comparison),
        "streaming slow": make_run(alice_experiment, streaming_preset, steps=4, name="streaming slow",
                                   comparison=comparison, status=Run.Status.RUNNING,
                                   supervisor="worker-elsewhere:1:1", heartbeat=timezone.now()),
        "streaming fast": make_run(alice_experiment, streaming_preset, steps=4, name="streaming fast",
                                   comparison=comparison),
    }
    other = Experiment.objects.create(owner=alice, name="other", config=QUICKSTART)
    runs["other experiment's"] = make_run(other, streaming_preset, steps=4, name="other experiment's")
    for name, run in runs.items():
        store_steps(run, STEP_S[name], idle=0.1 if "streaming" in name else 0.5)
    return comparison, runs


def column(page, field: str) -> list[str]:
    return page.evaluate("(f) => [...document.querySelectorAll(`#runs-list tbody td[data-field=${f}]`)]"
                         ".map((td) => td.textContent.trim())", field)


def names(page) -> list[str]:
    return page.evaluate("[...document.querySelectorAll('#runs-list tbody tr td:nth-child(2)')].map((td) => td.textContent)")


@pytest.mark.browser
def test_the_fastest_streaming_run_is_found_ticked_with_sync_and_compared(
        live_url, browser_page, alice, alice_experiment, analysed):
    page, errors = browser_page
    comparison, runs = analysed
    log_in(page, live_url, "alice", "alice-password")
    # a bad sort or filter is said, naming the parameter; the rest still applies
    response = page.goto(f"{live_url}/runs/?sort=fastest&status=nope")
    assert response.status == 400
    error = page.inner_text("#runs-error")
    assert "sort: no column “fastest”" in error and "status: no status “nope”" in error
    assert len(names(page)) == 4
    # grouped by experiment, fastest first inside each group
    page.goto(f"{live_url}/runs/?group=experiment&sort=step_s")
    assert page.evaluate("[...document.querySelectorAll('#runs-list tr.group-row')].map((tr) => tr.dataset.group)") == [
        "other", "quickstart"]
    said = page.evaluate("[...document.querySelectorAll('#runs-list tr.group-row')].map((tr) => tr.textContent)")
    assert said[0].startswith("experiment: other · 1 run · median step 0.515 s")
    assert "experiment: quickstart · 3 runs · median step 1.615 s [" in said[1]  # with its interval
    assert names(page) == ["other experiment's", "streaming fast", "streaming slow", "sync run"]

    # from the list alone: the experiment's runs, fastest median step first
    page.goto(f"{live_url}/runs/")
    page.select_option("#f-experiment", str(alice_experiment.pk))
    page.click("#runs-filter button[type=submit]")
    page.click("th[data-column=step_s] a")
    page.wait_for_url(re.compile(r"sort=step_s"))
    assert names(page) == ["streaming fast", "streaming slow", "sync run"]
    assert page.get_attribute("th[data-column=step_s]", "aria-sort") == "ascending"
    assert column(page, "speedup") == ["1.99×", "1.25×", "reference"]  # the sync run's median step over each one's
    assert column(page, "learner_idle") == ["10%", "10%", "50%"]
    page.click("th[data-column=step_s] a")  # again: the other way
    page.wait_for_url(re.compile(r"sort=-step_s"))
    assert names(page) == ["sync run", "streaming slow", "streaming fast"]

    # tick the fastest streaming run and the sync run: their comparison
    assert page.is_disabled("#compare-ticked")
    page.check(f"#runs-list tr[data-run-id='{runs['streaming fast'].pk}'] input[type=checkbox]")
    page.check(f"#runs-list tr[data-run-id='{runs['sync run'].pk}'] input[type=checkbox]")
    assert page.inner_text("#picker-note") == "2 runs selected"
    screenshot(page, "runs-analysis")
    page.click("#compare-ticked")
    page.wait_for_url(re.compile(r"/compare/\?runs="))
    page.wait_for_function("document.getElementById('compare-app')?.dataset.ready === '1'", timeout=60_000)
    shown = {int(i) for i in page.evaluate("[...document.querySelectorAll('#compare-summary tbody tr')].map((tr) => tr.dataset.runId)")}
    assert shown == {runs["streaming fast"].pk, runs["sync run"].pk}
    links = page.evaluate("[...document.querySelectorAll('#compare-run-links a')].map((a) => a.getAttribute('href'))")
    assert sorted(links) == sorted(f"/runs/{runs[n].pk}/" for n in ("streaming fast", "sync run"))

    # a saved comparison: its picker follows a run that finishes, and it is deleted, its runs kept
    page.goto(f"{live_url}/comparisons/{comparison.pk}/")
    slow = runs["streaming slow"].pk
    assert page.inner_text(f"[data-picker-status='{slow}']") == "running"
    page.wait_for_function("document.getElementById('compare-app')?.dataset.ready === '1'", timeout=60_000)
    in_thread(ingestion.finish_run, slow, Run.Status.SUCCEEDED)
    page.wait_for_function(f"document.querySelector(\"[data-picker-status='{slow}']\").textContent === 'succeeded'",
                           timeout=30_000)
    asked = []
    page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
    page.click("#comparison-delete-button")
    page.wait_for_url(f"{live_url}/experiments/{alice_experiment.pk}/")
    assert asked == ["Delete the comparison schedules? Its 3 runs stay, each on its own."]
    assert "Deleted the comparison schedules; its 3 runs kept." in page.inner_text(".messages")
    assert not Comparison.objects.filter(pk=comparison.pk).exists()
    assert Run.objects.filter(pk__in=[r.pk for r in runs.values()]).count() == 4
    assert errors == []


@pytest.mark.django_db
def test_every_column_sorts_both_ways_and_a_figureless_run_comes_last(alice, analysed, streaming_preset, alice_experiment):
    _, runs = analysed
    make_run(alice_experiment, streaming_preset, steps=4, name="no steps yet", status=Run.Status.QUEUED)
    client = Client()
    client.force_login(alice)
    for key in COLUMNS:
        for sort in (key, f"-{key}"):
            page = client.get("/runs/", {"sort": sort})
            assert page.status_code == 200, (sort, page.content[:300])
            assert len(page.context["runs"]) == 5
    listed = [str(r) for r in client.get("/runs/", {"sort": "-step_s"}).context["runs"]]
    assert listed == ["sync run", "streaming slow", "streaming fast", "other experiment's", "no steps yet"]
    listed = [str(r) for r in client.get("/runs/", {"sort": "step_s"}).context["runs"]]
    assert listed[-1] == "no steps yet"
    # bad filters: each named, the list still answered
    page = client.get("/runs/", {"experiment": "abc", "schedule": "warp"})
    assert page.status_code == 400
    assert page.context["errors"] == ["schedule: no schedule “warp” (one of sync, async, fully-async, streaming)",
                                      "experiment: no experiment #abc among yours"]
    assert len(page.context["runs"]) == 5
    page = client.get("/runs/", {"group": "colour"})
    assert page.status_code == 400 and page.context["errors"] == [
        "group: no grouping “colour” (one of experiment, schedule, tag, or col:<config field> such as "
        "col:train.schedule)"]
    Run.objects.filter(name="sync run").update(tags=",baseline,")
    listed = [(r.group, str(r)) for r in client.get("/runs/", {"group": "tag", "sort": "name"}).context["runs"]]
    assert listed[0] == ("(no tag)", "no steps yet") and listed[-1] == ("baseline", "sync run")
    # repeats: the speedup is over the median of the comparison's sync runs' median steps
    again = make_run(alice_experiment, runs["sync run"].schedule, steps=4, name="sync again",
                     comparison=runs["sync run"].comparison)
    store_steps(again, 3.0)
    figures = {str(r): r.figures for r in client.get("/runs/").context["runs"]}
    assert figures["streaming fast"]["speedup"] == pytest.approx((2.015 + 3.015) / 2 / 1.015)
    assert figures["other experiment's"]["speedup"] is None  # in no comparison
    # another user's comparison cannot be deleted
    bob = type(alice).objects.create_user("bob2", password="x")
    other = Client()
    other.force_login(bob)
    comparison = runs["sync run"].comparison
    assert other.post(f"/comparisons/{comparison.pk}/delete/").status_code == 404
    assert Comparison.objects.filter(pk=comparison.pk).exists()
