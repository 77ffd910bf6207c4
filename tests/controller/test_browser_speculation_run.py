"""A run launched from the app with speculation on (docs/speculation.md) shows its drafts and
their verification on the run page's Gantt, in a real browser against the real app: an
experiment created from the form with `rollout.speculation.enabled: true`, launched from its
page, trained by a real Celery worker and learner; the page draws `rollout.draft` and
`rollout.draft_verify` bars with their legend entries, and a followed drafted trajectory says
it was drafted. Screenshot: artifacts/screenshots/run-speculation.png."""

import copy
from collections import Counter

import pytest
import yaml
from tests.harness.web_harness import browser_page, live_url, log_in, screenshot  # noqa: F401 (fixtures)

from controller.models import Experiment, Run, Span

from .conftest import QUICKSTART, launch_from_page, wait_for_status
from .test_browser_insight import click_span
from .test_browser_speculation import COLOURS, legend

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RUN_TIMEOUT_S = 600  # the tiny model is built on first use; CI machines are small
STEPS = 3


def speculation_config() -> str:
    config = copy.deepcopy(QUICKSTART)
    config["name"] = "quickstart speculation"
    config["rollout"]["speculation"] = {"enabled": True}
    config["train"]["steps"] = STEPS
    return yaml.safe_dump(config)


def test_a_launched_speculative_run_draws_drafts_and_verification(
    live_url, browser_page, celery_worker, alice, sync_preset
):
    page, errors = browser_page
    log_in(page, live_url, "alice", "alice-password")
    page.fill("#id_name", "speculation")
    page.fill("#id_config", speculation_config())
    page.click("#new-experiment button[type=submit]")
    experiment = Experiment.objects.get(owner=alice, name="speculation")
    page.wait_for_url(f"{live_url}/experiments/{experiment.pk}/")
    run_id = launch_from_page(page, live_url, experiment, sync_preset, steps=STEPS)

    run = wait_for_status(run_id, Run.FINISHED, RUN_TIMEOUT_S)
    assert run.status == Run.Status.SUCCEEDED, run.error
    assert run.config["rollout"]["speculation"]["enabled"] is True
    db_kinds = Counter(Span.objects.filter(run_id=run_id).values_list("kind", flat=True))
    assert db_kinds["rollout.draft"] > 0 and db_kinds["rollout.draft_verify"] > 0, db_kinds

    # every step in the window: one bar per span, so the page's own counts equal the database's
    page.select_option("#window-steps", "0")
    total = sum(db_kinds.values())
    page.wait_for_function(f"document.getElementById('gantt').dataset.drawnSpans === '{total}'",
                           timeout=60_000)
    bars = page.evaluate("window.__thundersync.barsByKind()")
    assert bars["rollout.draft"] == db_kinds["rollout.draft"] and bars["rollout.draft_verify"] == db_kinds["rollout.draft_verify"]
    shown = legend(page, "gantt")
    assert {k: shown.get(k) for k in COLOURS} == COLOURS

    # follow a drafted trajectory (one that was trained, when there is one): its longest draft
    # turn, clicked on the chart
    drafts = Span.objects.filter(run_id=run_id, kind="rollout.draft")
    trained = set(Span.objects.filter(run_id=run_id, kind="learner.backward").values_list("traj", flat=True))
    draft = max(drafts, key=lambda s: (s.traj in trained, s.t1 - s.t0))
    click_span(page, draft)
    page.wait_for_function(f"document.getElementById('traj-detail').dataset.traj === '{draft.traj}'")
    assert page.get_attribute("#traj-note", "data-drafted") == "1"
    assert "drafted:" in page.inner_text("#traj-note")
    detail_kinds = page.evaluate("[...document.querySelectorAll('#traj-detail tbody tr')].map((tr) => tr.dataset.kind)")
    assert "rollout.draft" in detail_kinds
    screenshot(page, "run-speculation")
    assert errors == []
