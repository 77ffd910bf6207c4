"""256 rollout lanes unfolded, in a real browser against the real app: every lane keeps a row of at
least 12 px (docs/pages-run.md, "Lanes at scale") and learner/0's row is the first under the plot's
top, with no blank band above it, in the slot view and by trajectory."""

import pytest
from tests.harness.web_harness import agent_run_events, browser_page, live_url  # noqa: F401 (fixtures)

from controller.models import Span, StepMetric

from .conftest import make_run
from .test_browser_insight import open_run_page

pytestmark = pytest.mark.browser
WORKERS, SLOTS = 16, 16


@pytest.fixture
def run_256(alice_experiment, streaming_preset):
    found = make_run(alice_experiment, streaming_preset, steps=2, name="256 rollout lanes")
    spans, metrics = agent_run_events(2, groups=64, group_size=4, workers=WORKERS, slots=SLOTS, max_turns=1, seed=7)
    keys = ("seq", "step", "kind", "lane", "traj", "group", "turn", "policy_version", "tokens", "t0", "t1")
    Span.objects.bulk_create([Span(run=found, **{k: e[k] for k in keys}) for e in spans])
    StepMetric.objects.bulk_create([StepMetric(run=found, step=m["step"], values=m["values"]) for m in metrics])
    return found


def rows(page) -> dict:
    """Rows of the lane axis: their count, px per row, and how far the first row's band starts below
    the plot area's top (0: no blank above it)."""
    return page.evaluate("""(() => { const g = document.getElementById('gantt'), ya = g._fullLayout.yaxis;
        const lanes = ya.categoryarray, px = ya._length / Math.abs(ya.range[0] - ya.range[1]);
        return {n: lanes.length, first: lanes[0], px, blank: ya.l2p(ya.d2l(lanes[0])) - px / 2,
                height: g.clientHeight, plot: ya._length, range: ya.range, top: ya._offset}; })()""")


def test_unfolded_256_lanes_are_legible_rows_with_learner_0_at_the_top(live_url, browser_page, alice, run_256):
    page, errors = browser_page
    open_run_page(page, live_url, run_256)
    page.uncheck("#fold-lanes")
    page.wait_for_function("document.getElementById('gantt').layout.yaxis.categoryarray.length === 257")
    unfolded = rows(page)
    assert unfolded["first"] == "learner/0"
    assert unfolded["px"] >= 12, unfolded
    assert abs(unfolded["blank"]) < 1, str(unfolded)

    page.select_option("#lane-mode", "traj")
    page.select_option("#traj-step", "1")
    page.wait_for_function("document.getElementById('gantt').layout.yaxis.categoryarray.length > 200")
    by_traj = rows(page)
    assert by_traj["first"] == "learner/0"
    assert by_traj["px"] >= 12, by_traj
    assert abs(by_traj["blank"]) < 1, by_traj
    assert errors == []
