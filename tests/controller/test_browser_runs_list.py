"""Runs you can organise, in a real browser against the real app: one runs list across
experiments (search, filters, sort, pages), tags and a note per run and per comparison, and a
run deleted by its owner only, after a confirmation, with its files."""

import pytest
from tests.harness.web_harness import browser_page, live_url, log_in  # noqa: F401 (fixtures)
from django.test import Client

from controller.models import Comparison, Experiment, Run, Span

from .conftest import QUICKSTART, make_run, store_spans

pytestmark = pytest.mark.browser


@pytest.fixture
def many_runs(alice, alice_experiment, sync_preset, streaming_preset):
    other = Experiment.objects.create(owner=alice, name="other experiment", config=QUICKSTART)
    runs = []
    for i in range(30):
        experiment = other if i % 3 == 0 else alice_experiment
        runs.append(make_run(experiment, sync_preset if i % 2 else streaming_preset, name=f"run {i:02d}",
                             status=Run.Status.FAILED if i == 7 else Run.Status.SUCCEEDED))
    return runs, other


def listed(page) -> list[str]:
    return page.evaluate("[...document.querySelectorAll('#runs-list tbody tr td:nth-child(2)')].map((td) => td.textContent)")


def test_the_runs_list_searches_filters_sorts_and_pages(live_url, browser_page, alice, many_runs):
    page, errors = browser_page
    runs, other = many_runs
    log_in(page, live_url, "alice", "alice-password")
    page.click("nav a[href='/runs/']")
    assert "30 runs · page 1 of 2" in page.inner_text("#runs-count")
    assert listed(page)[:2] == ["run 29", "run 28"] and len(listed(page)) == 25
    page.click("#page-next")
    assert listed(page) == [f"run {i:02d}" for i in range(4, -1, -1)]

    page.goto(f"{live_url}/runs/")
    page.fill("#f-q", "run 1")
    page.select_option("#f-schedule", "sync")
    page.select_option("#f-sort", "name")
    page.click("#runs-filter button[type=submit]")
    assert listed(page) == [f"run {i}" for i in (11, 13, 15, 17, 19)]
    page.goto(f"{live_url}/runs/?status=failed")
    assert listed(page) == ["run 07"]
    page.select_option("#f-status", "")
    page.select_option("#f-experiment", str(other.pk))
    page.click("#runs-filter button[type=submit]")
    assert len(listed(page)) == 10 and all(int(n.split()[1]) % 3 == 0 for n in listed(page))
    assert errors == []


def save_notes(page, tags: str, note: str) -> None:
    page.click("#notes summary")
    page.fill("#notes-tags", tags)
    page.fill("#notes-note", note)
    page.click("#notes-form button[type=submit]")
    page.wait_for_selector(".messages")


def test_tags_and_notes_of_a_run_and_a_comparison(live_url, browser_page, alice, many_runs, alice_experiment):
    page, errors = browser_page
    runs, _ = many_runs
    run = runs[5]
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/runs/{run.pk}/")
    save_notes(page, "Baseline, lr-sweep, baseline", "the reference for the lr sweep")
    run.refresh_from_db()
    assert run.tag_list() == ["baseline", "lr-sweep"] and run.note == "the reference for the lr sweep"
    page.fill("#notes-tags", "not a tag!")
    page.fill("#notes-note", "a longer note typed before the error")
    page.click("#notes-form button[type=submit]")
    assert "a tag is 1-40 letters" in page.inner_text(".messages")
    # the refused values stay in the form, with the reason beside them; nothing stored changed
    assert page.is_visible("#notes-error") and "a tag is 1-40 letters" in page.inner_text("#notes-error")
    assert page.input_value("#notes-tags") == "not a tag!"
    assert page.input_value("#notes-note") == "a longer note typed before the error"
    run.refresh_from_db()
    assert run.note == "the reference for the lr sweep"
    page.reload()  # taken once: the stored values again
    page.click("#notes summary")
    assert page.input_value("#notes-tags") == "baseline, lr-sweep" and page.locator("#notes-error").count() == 0
    page.goto(f"{live_url}/runs/?tag=lr-sweep")
    assert listed(page) == ["run 05"] and "the reference for the lr sweep" in page.inner_text("#runs-list")
    page.goto(f"{live_url}/runs/?q=reference")
    assert listed(page) == ["run 05"]

    comparison = Comparison.objects.create(experiment=alice_experiment, steps=2, name="schedules")
    Run.objects.filter(pk__in=[runs[1].pk, runs[2].pk]).update(comparison=comparison)
    page.goto(f"{live_url}/comparisons/{comparison.pk}/")
    save_notes(page, "weekly", "streaming wins")
    comparison.refresh_from_db()
    assert comparison.tag_list() == ["weekly"] and comparison.note == "streaming wins"
    assert errors == []


@pytest.fixture
def run_dir(monkeypatch, tmp_path):
    """Where the daphne process (started after this fixture) keeps run directories."""
    monkeypatch.setenv("THUNDERSYNC_RUN_DIR", str(tmp_path / "runs"))
    return tmp_path / "runs"


def test_a_run_is_deleted_by_its_owner_after_a_confirmation_with_its_files(
        run_dir, live_url, browser_page, alice, bob, alice_experiment, streaming_preset):
    page, errors = browser_page
    run = make_run(alice_experiment, streaming_preset, name="to delete")
    store_spans(run, 10)
    files = run_dir / f"run-{run.pk}"
    (files / "output").mkdir(parents=True)
    (files / "learner.stderr.log").write_text("step 0\n")
    running = make_run(alice_experiment, streaming_preset, name="still running", status=Run.Status.RUNNING)
    bob_client = Client()
    bob_client.force_login(bob)
    assert bob_client.post(f"/runs/{run.pk}/delete/").status_code == 404  # not his
    log_in(page, live_url, "alice", "alice-password")
    page.goto(f"{live_url}/runs/{running.pk}/delete/")
    assert "cancel it first" in page.inner_text("#delete-refused") and page.is_disabled("#confirm-delete")

    page.goto(f"{live_url}/runs/{run.pk}/")
    page.wait_for_function("window.__thundersync.state().replayDone")
    page.click("#delete-link")
    assert page.inner_text("#delete-spans") == "10"
    page.click("#confirm-delete")
    page.wait_for_url(f"{live_url}/experiments/{alice_experiment.pk}/")
    assert "Deleted to delete and its files" in page.inner_text(".messages")
    assert not Run.objects.filter(pk=run.pk).exists() and not Span.objects.filter(run_id=run.pk).exists()
    assert not files.exists()
    assert Run.objects.filter(pk=running.pk).exists()
    assert errors == []
