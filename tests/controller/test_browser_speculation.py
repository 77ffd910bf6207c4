"""Speculation on the pages (docs/speculation.md), in a real browser against the real app: the
span kinds rollout.draft and rollout.draft_verify get their own colours and legend entries on
the run and compare pages, a followed drafted trajectory says it was drafted, and the
speculation/* step metrics show in the metric panel and the compare summary."""

import pytest
from tests.harness.web_harness import browser_page, live_url, pick_metrics  # noqa: F401 (fixtures)

from controller.models import Span, StepMetric

from .conftest import make_run
from .test_browser_insight import click_span, open_run_page, store_workload

pytestmark = pytest.mark.browser
COLOURS = {"rollout.draft": "#a0cbe8", "rollout.draft_verify": "#7b4fa0"}


@pytest.fixture
def drafted(alice_experiment, streaming_preset, sync_preset):
    """A streaming run whose step-1+ trajectories began with a draft turn and its verify."""
    run = make_run(alice_experiment, streaming_preset, steps=4, name="drafts")
    store_workload(run, seed=9, boot_s=2.0)
    firsts = Span.objects.filter(run=run, kind="rollout.generate", turn=0, step__gte=1)
    next_seq = Span.objects.filter(run=run).order_by("-seq").first().seq + 1
    verifies = []
    for i, span in enumerate(firsts):
        span.kind = "rollout.draft"
        span.save()
        verifies.append(Span(run=run, seq=next_seq + i, step=span.step, kind="rollout.draft_verify", t0=span.t1,
                             t1=span.t1 + 0.002, lane=span.lane, traj=span.traj, group=span.group, turn=0))
    Span.objects.bulk_create(verifies)
    for m in StepMetric.objects.filter(run=run, step__gte=1):
        m.values.update({"speculation/kept_token_share": 0.75, "speculation/whole_draft_share": 0.5,
                         "speculation/drafted_tokens": 100.0})
        m.save()
    sync = make_run(alice_experiment, sync_preset, steps=4, name="no drafts")
    store_workload(sync, seed=10, boot_s=2.0)
    return run, sync


def legend(page, chart_id: str) -> dict:
    return page.evaluate(f"Object.fromEntries(document.getElementById('{chart_id}').data"
                         ".filter((t) => t.showlegend !== false && t.name).map((t) => [t.name, t.line.color]))")


def test_drafts_are_drawn_named_and_measured(live_url, browser_page, alice, drafted):
    page, errors = browser_page
    run, sync = drafted
    open_run_page(page, live_url, run)
    shown = legend(page, "gantt")
    assert {k: shown[k] for k in COLOURS} == COLOURS
    bars = page.evaluate("window.__thundersync.barsByKind()")
    assert bars["rollout.draft"] == Span.objects.filter(run=run, kind="rollout.draft").count()
    assert bars["rollout.draft_verify"] == Span.objects.filter(run=run, kind="rollout.draft_verify").count()

    draft = max(Span.objects.filter(run=run, kind="rollout.draft", step=3), key=lambda s: s.t1 - s.t0)
    click_span(page, draft)
    page.wait_for_function(f"document.getElementById('traj-detail').dataset.traj === '{draft.traj}'")
    assert page.get_attribute("#traj-note", "data-drafted") == "1" and "drafted: 1 draft turn" in page.inner_text("#traj-note")

    pick_metrics(page, ["speculation/kept_token_share"])
    chart = "#metric-charts [data-metric='speculation/kept_token_share']"
    page.wait_for_function(f"document.querySelector(\"{chart}\")?.data?.[0]?.y?.length === 3")
    assert page.evaluate(f"document.querySelector(\"{chart}\").data[0].y") == [75.0, 75.0, 75.0]  # a share, in %

    page.goto(f"{live_url}/compare/?runs={sync.pk},{run.pk}")
    page.wait_for_selector("#compare-app[data-ready='1']", timeout=60_000)
    cell = f"#compare-summary tr[data-run-id='{run.pk}'] td[data-field='kept_token_share']"
    assert page.get_attribute(cell, "data-value") == "0.75" and page.inner_text(cell) == "75.0%"
    assert page.get_attribute(f"#compare-summary tr[data-run-id='{run.pk}'] td[data-field='drafted_tokens']", "data-value") == "300"
    assert page.inner_text(f"#compare-summary tr[data-run-id='{sync.pk}'] td[data-field='kept_token_share']") == "—"
    timeline = legend(page, f"timeline-{run.pk}")
    assert {k: timeline[k] for k in COLOURS} == COLOURS
    assert errors == []
